"""Own links: plans made for faster copies, at the points of one fixed ladder of k below k (2 ** (j / 8),
down to k / 2), run at the real copy times, where the copy lane leaves something the policy wanted off
the device and the worst rank is above the plan for nearly instant copies. Each rank keeps the lowest
peak among those that never stall. docs/offload.md, step 7.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import pipeoffload.passes.offload as offload_pass
from pipeoffload.costs import CostModel
from pipeoffload.passes.lower import lower, lower_with_report
from pipeoffload.schedules import generate
from pipeoffload.simulator import simulate


def _without_faster_plans(patch: pytest.MonkeyPatch) -> None:
    """The pass as it is, but with no ladder points (no plans for faster copies)."""
    patch.setattr(offload_pass, "_ladder_factors", lambda costs: [])


def _without_step_13(patch: pytest.MonkeyPatch) -> None:
    """The pass without the plans of other targets (step 13)."""
    patch.setattr(offload_pass, "_lower_targets", lambda plan, costs, states, peaks, step: (states, peaks))


FAMILIES = [("1f1b", 1, {}), ("interleaved-1f1b", 2, {}), ("group-interleaved", 2, {"group_size": 2}),
            ("zb-h1", 1, {}), ("zb-v", 2, {}), ("v-min", 2, {})]


@pytest.mark.parametrize("name,v,k,peak", [
    ("1f1b", 1, 1.0, 4),  # 6 with the plan for the real copy times alone
    ("1f1b", 1, 0.8, 4),  # 5
    ("interleaved-1f1b", 2, 1.0, 10),  # 11
    ("interleaved-1f1b", 2, 0.8, 6),  # 7
])
def test_a_plan_for_faster_copies_lowers_the_peak_with_the_step_unchanged(name: str, v: int, k: float,
                                                                          peak: float) -> None:
    schedule = generate(name, 8, 32, v)
    costs = CostModel().with_offload_ratio(k)
    t = simulate(lower(schedule, costs, offload="all"), costs)
    assert t.peak_activation_units == peak
    assert t.stall == 0 and t.makespan == simulate(schedule, costs).makespan


def test_without_the_faster_plans_the_same_cases_hold_more(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the plans for faster copies buy: 1F1B d = 8, m = 32, k = 1 holds 6 units without them."""
    _without_faster_plans(monkeypatch)
    schedule = generate("1f1b", 8, 32)
    costs = CostModel().with_offload_ratio(1.0)
    assert simulate(lower(schedule, costs, offload="all"), costs).peak_activation_units == 6


def test_a_shared_host_link_does_not_make_plans_for_faster_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pair's search (steps 8-12) has its own candidates; faster-copy plans are an own-link step."""
    def refuse(*_: object) -> None:
        raise AssertionError("best_with_faster_copies ran on a shared host link")

    monkeypatch.setattr(offload_pass._Planning, "best_with_faster_copies", refuse)
    schedule = generate("1f1b", 4, 8)
    costs = CostModel(shared_host_link=True).with_offload_ratio(1.0)
    lower(schedule, costs, offload="all")


def test_each_rank_keeps_its_lowest_peak_where_the_worst_rank_does_not_move(monkeypatch: pytest.MonkeyPatch) -> None:
    """ZB-H2, d = 8, m = 16, W twice as long, offload auto, k = 0.8: the worst rank stays at 12 units, but
    five other ranks hold less with plans for faster copies (the planner counts each rank's weights
    too, so a rank below the activation peak can still set a plan's memory). Step 7 alone: step 13's
    plans of other targets bring the worst rank to 11 (test_offload_lowest_s14)."""
    _without_step_13(monkeypatch)
    schedule = generate("zb-h2", 8, 16)
    costs = CostModel(time_w=2.0).with_offload_ratio(0.8)

    def peaks() -> list[float]:
        t = simulate(lower(schedule, costs, offload="auto"), costs)
        assert t.stall == 0 and t.makespan == simulate(schedule, costs).makespan
        return [r.peak_activation_units for r in t.per_rank]

    now = peaks()
    _without_faster_plans(monkeypatch)
    without = peaks()
    assert max(now) == max(without) == 12
    assert all(a <= b for a, b in zip(now, without)) and sum(a < b for a, b in zip(now, without)) >= 3


def test_recompute_auto_chooses_from_the_plan_for_the_real_copy_times() -> None:
    """``recompute auto`` reads what to recompute from the first offload plan's unhidden list and memory
    curve; a plan for faster copies counts both at its own times and made it recompute too little
    (1F1B, d = 6, m = 18, budget 2, k = 0.9: 4 units and the budget missed, where 2 meet it)."""
    schedule = generate("1f1b", 6, 18)
    costs = CostModel().with_offload_ratio(0.9)
    lowered, report = lower_with_report(schedule, costs, offload="budget:2", recompute="auto")
    t = simulate(lowered, costs)
    assert t.peak_activation_units == 2 and report.budget_met and t.stall == 0


def test_at_the_floor_no_plan_for_faster_copies_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """Interleaved 1F1B, d = 8, m = 32, k = 0.5: the worst ranks hold 3 units, as the plan for nearly instant
    copies does, so the search is not run (it would only cost time: the public path's d = 64 case)."""
    factors: list[float] = []
    states = offload_pass._Planning.states

    def recording(self: offload_pass._Planning, costs: CostModel, slower: float = 1.0) -> tuple:
        factors.append(slower)
        return states(self, costs, slower)

    monkeypatch.setattr(offload_pass._Planning, "states", recording)
    schedule = generate("interleaved-1f1b", 8, 32, 2)
    costs = CostModel().with_offload_ratio(0.5)
    assert simulate(lower(schedule, costs, offload="all"), costs).peak_activation_units == 3
    assert not [f for f in factors if offload_pass._FLOOR_FACTOR < f < 1]


@pytest.mark.parametrize("name,d,m,v,policy,ks", [
    # 6 units at k = 1.45, 1.7, 1.75 against 5 between, with plans for 0.95-0.5x of k (a probe's case)
    ("1f1b", 6, 24, 1, "auto", [round(0.5 + 0.05 * i, 2) for i in range(31)]),
])
def test_the_peak_is_monotone_in_k_on_a_fine_grid(name: str, d: int, m: int, v: int, policy: str,
                                                   ks: list[float]) -> None:
    schedule = generate(name, d, m, v)
    peaks = []
    for k in ks:
        costs = CostModel().with_offload_ratio(k)
        peaks.append(simulate(lower(schedule, costs, offload=policy), costs).peak_activation_units)
    assert all(a <= b for a, b in zip(peaks, peaks[1:])), list(zip(ks, peaks))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(family=st.sampled_from(FAMILIES), ranks=st.sampled_from([4, 6]), per_rank=st.sampled_from([2, 4]),
       k=st.floats(0.3, 2.0), policy=st.sampled_from(["all", "auto", "budget:2"]),
       recompute=st.sampled_from(["none", "auto"]), w_fraction=st.sampled_from([1.0, 0.5]))
def test_plans_for_faster_copies_never_stall_nor_raise_a_rank_s_peak(
        family: tuple, ranks: int, per_rank: int, k: float, policy: str, recompute: str, w_fraction: float) -> None:
    name, v, options = family
    schedule = generate(name, ranks, per_rank * ranks, v, **options)
    costs = CostModel(w_fraction=w_fraction).with_offload_ratio(k)
    with pytest.MonkeyPatch.context() as patch:
        # step 7 alone: step 13 keeps its plans only where the worst rank drops, so the two passes could
        # keep another rank's lower plan in one and not the other (interleaved 1F1B, d = 4, m = 8, k = 2,
        # auto + recompute auto: rank 3 at 4 units with the faster plans, 3 without)
        _without_step_13(patch)
        lowered, report = lower_with_report(schedule, costs, offload=policy, recompute=recompute)
        t = simulate(lowered, costs)
        assert report.copy_time_factor == 1.0 and not [n for n in report.notes if "stall" in n]  # no stall budget
        _without_faster_plans(patch)
        lowered_without, report_without = lower_with_report(schedule, costs, offload=policy, recompute=recompute)
        without = simulate(lowered_without, costs)
    # ``recompute auto`` recomputes only where that lowers the final plan's peak, so the two passes can
    # recompute differently; the property is about the offload plans of one compute schedule
    assume(report.recomputed == report_without.recomputed)
    assert t.stall == without.stall == 0 and t.makespan == pytest.approx(without.makespan, abs=1e-9)
    for now, then in zip(t.per_rank, without.per_rank):
        assert now.peak_activation_units <= then.peak_activation_units + 1e-9
