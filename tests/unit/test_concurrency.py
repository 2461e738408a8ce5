"""The measured slowdown of ranks computing at once (more ranks than cores, shared caches) in the cost
model (not in cost files), and applied to a schedule's simulation (``contended_costs``)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from pipeoffload.costs import CostModel, cost_model_from_dict, cost_model_to_dict
from pipeoffload.errors import ConfigError
from pipeoffload.passes.lower import lower
from pipeoffload.schedules import generate
from pipeoffload.simulator import simulate

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from pipeoffload.profiling import contended_costs, measure_concurrency, measure_p2p_time  # noqa: E402


def _makespan(schedule, costs: CostModel) -> float:  # type: ignore[no-untyped-def]
    return simulate(lower(schedule, costs), costs).makespan


def test_slowdown_is_read_per_rank_count_and_stretched_past_the_measured_ones():
    costs = CostModel(concurrency_slowdown=(1.0, 1.25))
    assert [costs.concurrency(n) for n in (1, 2, 3, 4)] == [1.0, 1.25, 1.25 * 3 / 2, 2.5]
    assert CostModel().concurrency(4) == 1.0  # none measured: a machine per rank


def test_slowdown_stays_out_of_cost_files_and_is_checked():
    # simulate does not apply it, so a cost file (what `simulate --costs` reads) must not carry it
    costs = CostModel(time_f=(1.0, 2.0), concurrency_slowdown=(1.0, 1.5, 2.25))
    assert "concurrency_slowdown" not in cost_model_to_dict(costs)
    assert cost_model_from_dict(cost_model_to_dict(costs)) == replace(costs, concurrency_slowdown=None)
    with pytest.raises(ConfigError, match="concurrency_slowdown is not applied by simulate"):
        cost_model_from_dict({"time_f": 1.0, "concurrency_slowdown": [1.0, 1.5]})
    for bad in ((), (1.0, 0.0), (1.0, -2.0)):
        with pytest.raises(ConfigError, match="concurrency_slowdown"):
            CostModel(concurrency_slowdown=bad)


def test_no_slowdown_leaves_the_costs_alone():
    costs = CostModel.uniform(1.0, 1.0, 1.0, p2p=0.01)
    assert contended_costs(generate("1f1b", 4, 8, 1), costs) is costs
    flat = CostModel.uniform(1.0, 1.0, 1.0, p2p=0.01, concurrency_slowdown=(1.0, 1.0))
    schedule = generate("1f1b", 2, 8, 1)
    assert _makespan(schedule, contended_costs(schedule, flat)) == pytest.approx(_makespan(schedule, costs))


def test_two_ranks_that_overlap_only_in_the_steady_state_are_stretched_less_than_the_factor():
    schedule = generate("1f1b", 2, 8, 1)
    base = CostModel.uniform(1.0, 1.0, 1.0, p2p=0.01)
    alone = _makespan(schedule, base)
    stretched = _makespan(schedule, contended_costs(schedule, CostModel.uniform(
        1.0, 1.0, 1.0, p2p=0.01, concurrency_slowdown=(1.0, 2.0))))
    # warm-up and cool-down run one rank at a time at full speed: between no slowdown and all of it
    assert alone * 1.3 < stretched < alone * 2.0


@pytest.mark.parametrize("family, v", [("1f1b", 1), ("interleaved-1f1b", 2), ("zb-v", 2)])
def test_four_ranks_on_two_cores_take_at_least_their_work_over_two_cores(family, v):
    schedule = generate(family, 4, 8, v)
    base = CostModel.uniform(1.0, 1.0, 1.0, p2p=0.01)
    work = 8 * schedule.num_stages * 3.0  # F, I and W of every stage and microbatch: 1 each
    two_cores = contended_costs(schedule, CostModel.uniform(1.0, 1.0, 1.0, p2p=0.01,
                                                            concurrency_slowdown=(1.0, 1.0, 1.5, 2.0)))
    predicted = _makespan(schedule, two_cores)
    assert predicted >= work / 2 * 0.99  # time-sharing: no faster than two cores can do the work
    assert predicted > _makespan(schedule, base) * 1.3  # the simulator alone gives each rank a core
    assert predicted < _makespan(schedule, base) * 2.0  # ranks in a bubble free their core


def _square(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((out - target) ** 2).mean()


def test_measure_concurrency_gives_one_factor_per_rank_count_from_one():
    torch.manual_seed(0)
    stages = [nn.Linear(32, 32), nn.Linear(32, 32)]
    slowdown = measure_concurrency(stages, torch.randn(8, 32), loss_fn=_square, target=torch.randn(8, 32),
                                   ranks=2, repeats=3, warmup=1, rounds=1)
    assert len(slowdown) == 2 and slowdown[0] == 1.0 and slowdown[1] > 0
    with pytest.raises(ConfigError, match="ranks"):
        measure_concurrency(stages, torch.randn(8, 32), loss_fn=_square, target=torch.randn(8, 32), ranks=0)


def test_p2p_time_is_measured_with_the_other_ranks_busy_and_stops_them():
    one_way = measure_p2p_time(4096, ranks=3, seconds=0.3)  # rank 2 computes meanwhile
    assert 0 < one_way < 5.0
    with pytest.raises(ConfigError, match="ranks"):
        measure_p2p_time(4096, ranks=1)
