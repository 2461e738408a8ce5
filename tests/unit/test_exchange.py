"""Megatron's blocking batched exchanges (planner/exchange.py) against the eager simulator."""
import pytest

from pipeoffload.costs import CostModel
from pipeoffload.ir import ActionKind
from pipeoffload.planner.exchange import lockstep_makespan, megatron_steps
from pipeoffload.schedules import generate
from pipeoffload.simulator import simulate


@pytest.mark.parametrize("family, d, m, v", [("1f1b", 4, 12, 1), ("interleaved-1f1b", 4, 12, 2),
                                             ("interleaved-1f1b", 3, 9, 3)])
def test_without_transfer_time_the_lockstep_equals_the_eager_simulation(family: str, d: int, m: int, v: int) -> None:
    """Megatron's warm-up depth leaves exactly the slack its delayed sends need: with free transfers and
    equal stages both timings agree (so any difference below comes from the transfers)."""
    schedule = generate(family, d, m, v)
    costs = CostModel(time_f=1.0, time_b=2.0)
    makespan, busy = lockstep_makespan(schedule, costs, interleaved=v > 1)
    timeline = simulate(schedule, costs)
    assert makespan == pytest.approx(timeline.makespan)
    assert busy == pytest.approx(tuple(r.busy for r in timeline.per_rank))


def test_blocking_exchanges_expose_transfers_the_eager_timing_hides() -> None:
    schedule = generate("interleaved-1f1b", 4, 12, 2)
    costs = CostModel(time_f=1.0, time_b=2.0, p2p_time=0.05)
    eager = simulate(schedule, costs).makespan
    blocking, _ = lockstep_makespan(schedule, costs, interleaved=True)
    # every steady step waits for its exchange: at least one transfer per step on the busiest rank
    assert blocking > eager + 0.05 * 12
    assert blocking < eager + 2 * 0.05 * 2 * 12 * 2 + 1e-9


def test_interleaved_steady_steps_pair_a_forward_with_a_backward() -> None:
    row = generate("interleaved-1f1b", 4, 8, 2).actions[3]
    steps = megatron_steps(row, interleaved=True)
    kinds = ["".join(a.kind.value for a in step) for step in steps]
    assert kinds[0] == "F" and "FB" in kinds and kinds[-1] == "B"
    assert sum(len(s) for s in steps) == len(row)
    assert all(len(s) == 1 for s in megatron_steps(row, interleaved=False))
    assert {a.kind for a in row} == {ActionKind.F, ActionKind.B}
