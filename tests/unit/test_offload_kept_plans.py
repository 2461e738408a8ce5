"""The offload pass keeps each group plan in the search's memo (own links) and works out a plan's memory
curve only when it is read; both leave every plan and report as they were (issue #19's headline)."""
from __future__ import annotations

import numpy as np
import pytest

import pipeoffload.passes.offload as offload_pass
import pipeoffload.passes.offload_plan as offload_plan
from pipeoffload._perf import Memo
from pipeoffload.costs import CostModel
from pipeoffload.passes.copy_plan import Placed, rank_timelines
from pipeoffload.passes.offload_plan import RankState
from pipeoffload.schedules import generate
from pipeoffload.simulator import simulate

CASES = [  # (family, d, m, v, k, policies planned one after another with one memo)
    ("1f1b", 8, 32, 1, 1.0, ["auto", "all", "budget:3"]),
    ("interleaved-1f1b", 8, 32, 2, 1.0, ["auto", "budget:8"]),
    ("zb-v", 4, 16, 2, 1.5, ["auto", "budget:2"]),
    ("group-interleaved", 4, 16, 2, 0.7, ["auto", "all"]),
]


def _inputs(timelines: list, costs: CostModel, policy: object, candidates: dict, budget: object,
            relaxed: bool) -> tuple:
    """What decides a group plan (``plan_group``'s inputs, by value)."""
    return (tuple(tl.rank for tl in timelines), costs, getattr(policy, "kind", policy), budget, relaxed,
            tuple((r, tuple((x.ident, x.f_end, x.deadline, x.d2h, x.h2d, x.size) for x in xs))
                  for r, xs in sorted(candidates.items())))


@pytest.mark.parametrize("name,d,m,v,k,policies", CASES)
def test_a_group_is_planned_once_for_equal_inputs(monkeypatch: pytest.MonkeyPatch, name: str, d: int, m: int,
                                                  v: int, k: float, policies: list[str]) -> None:
    """Plans of one schedule for several policies, with the plans for faster copies and step 13's plans
    of other targets, ask for the same group plan again (the floor check after a lower plan, a budget's
    plan as step 13's target): each is made once."""
    made: list[tuple] = []
    plan_group = offload_pass.plan_group

    def recording(timelines: list, costs: CostModel, policy: object, candidates: dict, budget: object,
                  relaxed: bool) -> object:
        made.append(_inputs(timelines, costs, policy, candidates, budget, relaxed))
        return plan_group(timelines, costs, policy, candidates, budget, relaxed)

    monkeypatch.setattr(offload_pass, "plan_group", recording)
    schedule = generate(name, d, m, v)
    costs = CostModel().with_offload_ratio(k)
    memo = Memo()
    for policy in policies:
        offload_pass.plan_offload(schedule, costs, policy, memo=memo)
    assert made and len(made) == len(set(made))


def _planned(schedule: object, costs: CostModel, policy: str) -> tuple:
    lowered, report = offload_pass.plan_offload(schedule, costs, policy)  # type: ignore[arg-type]
    return lowered.actions, report, simulate(lowered, costs).per_rank


@pytest.mark.parametrize("name,d,m,v,k,policies", CASES)
def test_kept_group_plans_change_no_plan(monkeypatch: pytest.MonkeyPatch, name: str, d: int, m: int, v: int,
                                         k: float, policies: list[str]) -> None:
    """The same lowered schedules, reports (memory curves included) and simulations with the group plans
    kept as without."""
    schedule = generate(name, d, m, v)
    costs = CostModel().with_offload_ratio(k)
    kept = [_planned(schedule, costs, policy) for policy in policies]
    monkeypatch.setattr(offload_pass._Planning, "_keeps_plans", lambda self, costs: False)
    assert kept == [_planned(schedule, costs, policy) for policy in policies]


def _state() -> tuple[RankState, list[Placed]]:
    """Rank 0's state of 1F1B, d = 4, m = 8, and placements of its activations over their whole windows,
    with sizes that make no partial sum exact (thirds) next to whole ones."""
    schedule = generate("1f1b", 4, 8)
    costs = CostModel().with_offload_ratio(0.5)
    tl = rank_timelines(schedule, simulate(schedule, costs), costs)[0]
    placed = []
    for n, x in enumerate(tl.activations.values()):
        lo, hi = tl.off_range(x.f_end + x.d2h, x.deadline - x.h2d)
        x.size = 1.0 if n % 2 else 1.0 / 3.0
        placed.append(Placed(x, x.f_end, x.deadline - x.h2d, lo, hi))
    return RankState(tl), placed


def test_the_curve_is_worked_out_when_read() -> None:
    state, placed = _state()
    state.add(placed[0])
    state.add_all(placed[1:])
    assert state._memory is None  # nothing copied or subtracted yet
    assert len(state.placed) == len(placed)
    assert not np.array_equal(state.memory, state.timeline.memory)
    assert state.memory is state._memory


@pytest.mark.parametrize("whole,every", [(False, 4), (True, 4), (False, 0), (True, 0)])
def test_the_curve_read_is_the_one_eager_subtraction_gives(whole: bool, every: int) -> None:
    """Placements added one by one and in batches, read in between (``every``; 0: only at the end, one
    batch of all): bitwise the curve of subtracting each in turn as it was added."""
    state, placed = _state()
    assert len(placed) >= offload_plan._BATCH
    if whole:
        for p in placed:
            p.activation.size = 1.0
    eager = state.timeline.memory.copy()
    for n, p in enumerate(placed):
        eager[p.lo:p.hi] -= p.activation.size
        if n % 3 == 0:
            state.add(p)
        else:
            state.add_all([p])
        if every and n % every == 0:
            assert state.peak() == float(eager.max())
    assert state.memory.tobytes() == eager.tobytes()


@pytest.mark.parametrize("policy", ["all", "auto", "budget:3"])
def test_the_first_windows_are_placed_by_value_once_per_group_plan(monkeypatch: pytest.MonkeyPatch,
                                                                   policy: str) -> None:
    """Group-interleaved's second windows are worth nothing (W follows its I at once), so placing them
    first and then the first windows by value is the plan of the first windows by value that an
    overloaded lane or a budget already made: no group plan places the same picks on an empty plan twice."""
    seen: list[list[tuple]] = []
    greedy, plan_group = offload_plan._Plan.greedy, offload_pass.plan_group

    def recording(self: offload_plan._Plan, picks: list, budget: float | None) -> list:
        if not any(s.placed for s in self.states.values()):
            seen[-1].append((tuple((r, x.ident, x.d2h) for r, x in picks), budget))
        return greedy(self, picks, budget)

    def group(*args: object) -> object:
        seen.append([])
        return plan_group(*args)

    monkeypatch.setattr(offload_plan._Plan, "greedy", recording)
    monkeypatch.setattr(offload_pass, "plan_group", group)
    schedule = generate("group-interleaved", 8, 32, 2, group_size=4)
    offload_pass.plan_offload(schedule, CostModel().with_offload_ratio(1.0), policy)
    assert any(seen) and all(len(calls) == len(set(calls)) for calls in seen)
