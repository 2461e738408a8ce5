"""Stage costs and the extrapolating simulation the planner relies on."""
import itertools

import pytest

from pipeoffload.costs import CostModel
from pipeoffload.planner.evaluate import ScheduleChoice, simulate_choice, time_lower_bound
from pipeoffload.planner.hardware import hardware_preset
from pipeoffload.planner.presets import model_preset
from pipeoffload.planner.stagecosts import Layout, layer_costs, partition, stage_costs


def _costs(stages: int, last: float, p2p: float) -> CostModel:
    """Uniform stages except a heavier last one (the output head), with a P2P latency."""
    def per(x: float) -> tuple[float, ...]:
        return tuple([x] * (stages - 1) + [x * last])
    return CostModel(time_f=per(1.0), time_i=per(1.1), time_w=per(0.9), p2p_time=p2p,
                     activation=per(1.0))


GRID = [(fam, d, m, v, p2p, last)
        for fam, d, m, v, p2p, last in itertools.product(
            ["1f1b", "interleaved-1f1b"], [2, 3, 4, 8], [24, 40, 64], [1, 2, 3], [0.0, 0.3], [1.0, 1.7])
        if (fam == "1f1b") == (v == 1) and not (fam == "interleaved-1f1b" and m % d)]
GRID += [("1f1b", 16, 80, 1, 0.2, 1.5), ("interleaved-1f1b", 16, 64, 2, 0.2, 1.5)]


@pytest.mark.parametrize("fam, d, m, v, p2p, last", GRID)
def test_extrapolated_simulation_equals_full_simulation(fam: str, d: int, m: int, v: int, p2p: float,
                                                        last: float) -> None:
    costs = _costs(d * v, last, p2p)
    choice = ScheduleChoice(fam, v)
    fast = simulate_choice(choice, d, m, costs)
    full = simulate_choice(choice, d, m, costs, extrapolate=False)
    assert fast.makespan == pytest.approx(full.makespan, rel=1e-9)
    assert fast.peak_units == pytest.approx(full.peak_units)
    assert fast.busy == pytest.approx(full.busy)
    assert fast.bubble_ratio == pytest.approx(full.bubble_ratio, abs=1e-9)
    assert time_lower_bound(choice, d, m, costs) <= full.makespan + 1e-9


def test_extrapolation_is_used_for_long_pipelines() -> None:
    assert simulate_choice(ScheduleChoice("1f1b"), 4, 64, _costs(4, 1.0, 0.1)).extrapolated
    assert not simulate_choice(ScheduleChoice("1f1b"), 4, 10, _costs(4, 1.0, 0.1)).extrapolated


def test_partition_puts_the_remainder_first() -> None:
    assert partition(10, 4) == (3, 3, 2, 2)
    assert partition(8, 8) == (1,) * 8
    with pytest.raises(Exception, match="every stage needs a layer"):
        partition(3, 4)


def test_stage_costs_place_embedding_and_head_and_scale_with_layers() -> None:
    model, hw = model_preset("gpt3-1.3b"), hardware_preset("a100")
    lc = layer_costs(model, hw, tp=2)
    sc = stage_costs(lc, hw, Layout(pp=4, tp=2, dp=1), 2, model.layers)  # 8 stages of 3 layers
    c = sc.costs
    assert c.f(0) == pytest.approx(3 * lc.time_f)
    assert c.f(7) == pytest.approx(3 * lc.time_f + lc.head_time[0])
    assert c.act(0) == 1.0 and c.act(7) == pytest.approx(1 + lc.head_activation_bytes / (3 * lc.activation_bytes))
    assert sc.unit_bytes == 3 * lc.activation_bytes
    # rank 0 holds stages 0 and 4 (+ embedding); rank 3 holds stages 3 and 7 (+ head)
    assert sc.params_per_rank[0] == pytest.approx(6 * lc.params + lc.embedding_params)
    assert sc.params_per_rank[3] == pytest.approx(6 * lc.params + lc.head_params)
    total = sum(sc.params_per_rank) * 2  # tp = 2
    tied_copy = model.vocab * model.hidden  # the last stage keeps its own copy of a tied head
    assert total == pytest.approx(model.total_params() + tied_copy)
    # with TP on a shared PCIe switch, the TP peer copies at the same time: half the bandwidth each
    assert c.d2h_time == pytest.approx(2 * sc.unit_bytes / hw.d2h_bandwidth) and not c.shared_host_link
    one = stage_costs(layer_costs(model, hw), hw, Layout(4, 1, 2), 1, model.layers).costs
    assert one.shared_host_link and one.d2h_time == pytest.approx(6 * lc.activation_bytes * 2 / hw.d2h_bandwidth)


def test_tensor_parallel_adds_collective_time_to_f_and_i_only() -> None:
    model, hw = model_preset("gpt3-6.7b"), hardware_preset("h100")
    one, four = layer_costs(model, hw, 1), layer_costs(model, hw, 4)
    comm = 4 * 3 / 4 * model.boundary_bytes() / hw.nvlink_bandwidth
    assert four.time_f == pytest.approx(one.time_f / 4 + comm)
    assert four.time_i == pytest.approx(one.time_i / 4 + comm)
    assert four.time_w == pytest.approx(one.time_w / 4)
