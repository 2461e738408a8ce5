"""A stall budget (``OffloadPolicy.max_stall``, ``simulate --max-stall``): the offload pass may keep a plan
made for faster copies than the real ones when, run at the real ones, it lowers the peak and lengthens
the step by at most the budget (percent of the step without copies). docs/offload.md, "A stall budget".
"""
from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeoffload.costs import CostModel
from pipeoffload.passes.lower import lower, lower_with_report
from pipeoffload.policies import OffloadPolicy
from pipeoffload.schedules import generate
from pipeoffload.simulator import simulate

ZBV_COSTS = CostModel.uniform(0.5, 0.5, 0.5)  # one rank's unit times over its two stages (simulate's defaults)
FAMILIES = [("1f1b", 1, {}), ("interleaved-1f1b", 2, {}), ("group-interleaved", 2, {"group_size": 2}),
            ("zb-h1", 1, {}), ("zb-v", 2, {}), ("v-min", 2, {})]


def _zbv(k: float, max_stall: float) -> tuple:
    schedule = generate("zb-v", 8, 32, 2)
    costs = ZBV_COSTS.with_offload_ratio(k)
    lowered, report = lower_with_report(schedule, costs, offload=OffloadPolicy("all", max_stall=max_stall))
    return lowered, report, simulate(lowered, costs), simulate(schedule, costs).makespan


def test_zb_v_past_its_cliff_keeps_three_units_for_under_one_percent() -> None:
    """ZB-V d = 8, m = 32, offload all: the plan that never stalls holds 3 activation units up to k = 0.66
    and 12 from k = 0.68 (60 activations the lane can no longer hide in time). With a 2 % budget the plan
    made for copies 0.95x as long is kept at 0.68: 3 units for a step 0.96 % longer."""
    _, strict_report, strict, step = _zbv(0.68, 0.0)
    assert strict.peak_activation_units == 12 and strict.stall == 0 and strict.makespan == step
    assert strict_report.copy_time_factor == 1.0 and not strict_report.notes

    lowered, report, stalled, _ = _zbv(0.68, 2.0)
    assert stalled.peak_activation_units == 3
    assert step < stalled.makespan <= step * 1.02 and stalled.stall > 0
    assert report.copy_time_factor == 0.95 and "0.96 % longer" in report.notes[0]
    assert "kept on the device: 1 that the copy lane could not hide at the planned copy times (0.95x)" in report.summary()
    assert report.peak_after == 3
    # it is the plan the pass makes for the faster copies, run at the real ones
    made = lower(generate("zb-v", 8, 32, 2), ZBV_COSTS.with_offload_ratio(0.68 * 0.95), offload="all")
    assert simulate(made, ZBV_COSTS.with_offload_ratio(0.68)).as_dict() == stalled.as_dict()


def test_a_budget_too_small_for_any_lower_peak_keeps_the_plan_that_never_stalls() -> None:
    """At k = 0.7 the same 3 units cost 2.41 %: a 2 % budget buys nothing, and the plan is the strict one."""
    lowered, report, t, step = _zbv(0.7, 2.0)
    strict, _, _, _ = _zbv(0.7, 0.0)
    assert t.stall == 0 and t.makespan == step and t.peak_activation_units == 12
    assert lowered.actions == strict.actions and report.copy_time_factor == 1.0
    _, _, wider, _ = _zbv(0.7, 3.0)
    assert wider.peak_activation_units == 3 and wider.makespan <= step * 1.03


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(family=st.sampled_from(FAMILIES), ranks=st.sampled_from([4, 6]), per_rank=st.sampled_from([2, 4]),
       k=st.floats(0.3, 2.0), policy=st.sampled_from(["all", "auto", "budget:2"]),
       max_stall=st.sampled_from([0.5, 2.0, 10.0]), w_fraction=st.sampled_from([1.0, 0.5]))
def test_a_stall_budget_never_raises_the_peak_nor_exceeds_the_budget(
        family: tuple, ranks: int, per_rank: int, k: float, policy: str, max_stall: float, w_fraction: float) -> None:
    name, v, options = family
    schedule = generate(name, ranks, per_rank * ranks, v, **options)
    costs = CostModel(w_fraction=w_fraction).with_offload_ratio(k)
    step = simulate(schedule, costs).makespan
    strict = simulate(lower(schedule, costs, offload=policy), costs)
    lowered, report = lower_with_report(schedule, costs, offload=replace(OffloadPolicy.parse(policy), max_stall=max_stall))
    t = simulate(lowered, costs)
    assert t.makespan <= step * (1 + max_stall / 100) + 1e-9
    assert t.peak_activation_units <= strict.peak_activation_units + 1e-9
    if report.copy_time_factor == 1.0:  # nothing better under the budget: the strict plan itself
        assert t.as_dict() == strict.as_dict()
    else:  # kept only for a lower peak: the strict plan has the shortest step there is
        assert t.peak_activation_units < strict.peak_activation_units - 1e-9
    if policy.startswith("budget") and strict.peak_activation_units <= 2 + 1e-9:
        assert report.copy_time_factor == 1.0  # a met budget needs no stall


@pytest.mark.parametrize("bad,message", [
    ({"max_stall": -1.0}, "max_stall -1.0: must be a finite percentage >= 0"),
    ({"max_stall": float("nan")}, "max_stall nan: must be a finite percentage >= 0"),
    ({"max_stall": 2.0, "kind": "none"}, "max_stall=2 lets offload copies stall, but offload is none"),
])
def test_a_bad_stall_budget_is_refused_by_name(bad: dict, message: str) -> None:
    from pipeoffload.errors import ConfigError

    with pytest.raises(ConfigError, match="^" + message):
        OffloadPolicy(**({"kind": "all"} | bad))


def test_one_f_one_b_leaves_too_short_activations_that_a_budget_moves() -> None:
    """1F1B's strict plan leaves activations whose windows are too short for their copies (``too_short``,
    not ``unhidden``): the budget's search runs there too. d = 8, m = 32: 4 units to 3 at k = 0.68 for a
    step 0.53 % longer; 6 to 4 at k = 1 with the step unchanged (the plan for copies 0.7x as long)."""
    from pipeoffload.service import SimulateRequest
    from pipeoffload.service import simulate as service_simulate

    def run(k: float, max_stall: float):  # type: ignore[no-untyped-def]
        return service_simulate(SimulateRequest("1f1b", ranks=8, microbatches=32, offload="all", offload_ratio=k,
                                                max_stall=max_stall))

    strict, stalled = run(0.68, 0.0), run(0.68, 2.0)
    assert (strict.timeline.peak_activation_units, stalled.timeline.peak_activation_units) == (4, 3)
    assert stalled.timeline.makespan == pytest.approx(strict.timeline.makespan * 1.0053, rel=1e-3)
    assert stalled.planned_k == pytest.approx(0.68 * 0.95) and stalled.as_dict()["planned_offload_ratio"] == stalled.planned_k
    assert "copies planned for k=0.646" in stalled.title() and "stall budget 2 %" in stalled.title()
    wide = run(1.0, 2.0)
    assert wide.timeline.peak_activation_units == 4 and wide.timeline.makespan == run(1.0, 0.0).timeline.makespan


@pytest.mark.parametrize("k,note", [
    (0.0, "stall budget 2 %: not used, copies take no time"),
    (0.7, "stall budget 2 %: no plan made for faster copies (0.95-0.5x their time) lowers the peak within it"),
])
def test_the_report_says_what_the_budget_did(k: float, note: str) -> None:
    _, report, _, _ = _zbv(k, 2.0)
    assert report.notes == (note,) and report.copy_time_factor == 1.0


def test_a_budget_is_not_combined_with_recompute_auto_nor_plan_ratio() -> None:
    from pipeoffload.errors import ConfigError
    from pipeoffload.service import SimulateRequest

    with pytest.raises(ConfigError, match="^max_stall=2 with recompute=auto: both deal with what the copy lane"):
        lower(generate("zb-v", 4, 8, 2), ZBV_COSTS.with_offload_ratio(0.7), offload=OffloadPolicy("all", max_stall=2),
              recompute="auto")
    with pytest.raises(ConfigError, match="^plan_ratio=0.5 with max_stall=2: a stall budget plans the copies"):
        SimulateRequest("zb-v", offload="all", offload_ratio=0.7, plan_ratio=0.5, max_stall=2)
