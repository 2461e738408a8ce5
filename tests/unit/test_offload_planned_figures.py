"""The offload pass simulates each planned schedule once per search (``offload.planned_figures``): the
plans it weighs (for slower and faster copies, step 13's targets, ``recompute auto``'s comparisons)
emit the same lists again, and a search's memo answers the repeats with the same figures."""
from __future__ import annotations

import pytest

import pipeoffload.simulator as simulator
from pipeoffload._perf import Memo
from pipeoffload.costs import CostModel
from pipeoffload.passes.lower import lower_with_report
from pipeoffload.passes.offload import planned_figures
from pipeoffload.schedules import generate
from pipeoffload.simulator import figures_of, simulate

CASES = [  # (family, d, m, v, k, (offload, recompute) lowered one after another with one memo)
    ("1f1b", 8, 32, 1, 1.0, [("budget:3", "auto"), ("auto", "none")]),  # 12 repeats before
    ("zb-h1", 4, 16, 1, 1.2, [("auto", "none"), ("auto", "auto")]),  # 30 repeats before
    ("zb-v", 4, 16, 2, 1.5, [("budget:3", "auto"), ("auto", "none")]),  # 24 repeats before
]


def _lowered(name: str, d: int, m: int, v: int, k: float, policies: list[tuple[str, str]], memo: Memo | None
             ) -> list[tuple]:
    schedule = generate(name, d, m, v)
    costs = CostModel().with_offload_ratio(k)
    out = []
    for offload, recompute in policies:
        lowered, report = lower_with_report(schedule, costs, offload=offload, recompute=recompute, check=False,
                                            comms=False, log_warnings=False,
                                            memo=memo if memo is not None else Memo())
        out.append((lowered, report, report.per_rank))
    return out


@pytest.mark.parametrize("name,d,m,v,k,policies", CASES)
def test_each_planned_schedule_is_simulated_once(monkeypatch: pytest.MonkeyPatch, name: str, d: int, m: int,
                                                 v: int, k: float, policies: list[tuple[str, str]]) -> None:
    simulated: list[tuple] = []
    run = simulator._Simulation.run

    def recording(self: simulator._Simulation) -> None:
        simulated.append((self.schedule, self.costs))
        run(self)

    monkeypatch.setattr(simulator._Simulation, "run", recording)
    _lowered(name, d, m, v, k, policies, Memo())
    assert simulated and len(simulated) == len(set(simulated))


@pytest.mark.parametrize("name,d,m,v,k,policies", CASES)
def test_one_memo_lowers_as_fresh_calls_do(name: str, d: int, m: int, v: int, k: float,
                                           policies: list[tuple[str, str]]) -> None:
    assert _lowered(name, d, m, v, k, policies, Memo()) == _lowered(name, d, m, v, k, policies, None)


def test_planned_figures_are_the_simulations() -> None:
    """Computed, read back from its own memo, or read from a timeline the memo keeps: the figures of
    ``simulate`` every time."""
    schedule = generate("zb-v", 4, 16, 2)
    costs = CostModel().with_offload_ratio(1.5)
    lowered = lower_with_report(schedule, costs, offload="auto", check=False, comms=False)[0]
    memo = Memo()
    for s in (lowered, lowered, schedule):
        assert planned_figures(s, costs, memo) == figures_of(simulate(s, costs))
    memo(simulate, schedule, costs)
    assert planned_figures(schedule, costs, memo) == figures_of(simulate(schedule, costs))
    assert planned_figures(lowered, costs) == figures_of(simulate(lowered, costs))
