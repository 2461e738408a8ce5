"""Plans for faster copies that never stall (own links): where the copy lane leaves something the policy
wanted off the device, the pass also makes its plans as if copies took 0.95-0.5x their time and keeps,
per rank, the lowest peak among those that run at the real times with no stall at all.
docs/offload.md, step 7.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipeoffload.passes.offload as offload_pass
from pipeoffload.costs import CostModel
from pipeoffload.passes.lower import lower, lower_with_report
from pipeoffload.schedules import generate
from pipeoffload.simulator import simulate

FAMILIES = [("1f1b", 1, {}), ("interleaved-1f1b", 2, {}), ("group-interleaved", 2, {"group_size": 2}),
            ("zb-h1", 1, {}), ("zb-v", 2, {}), ("v-min", 2, {})]


@pytest.mark.parametrize("name,v,k,peak", [
    ("1f1b", 1, 1.0, 4),  # 6 with the plan for the real copy times alone
    ("1f1b", 1, 0.8, 4),  # 5
    ("interleaved-1f1b", 2, 1.0, 9),  # 11
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
    monkeypatch.setattr(offload_pass, "_FASTER", ())
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


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(family=st.sampled_from(FAMILIES), ranks=st.sampled_from([4, 6]), per_rank=st.sampled_from([2, 4]),
       k=st.floats(0.3, 2.0), policy=st.sampled_from(["all", "auto", "budget:2"]),
       w_fraction=st.sampled_from([1.0, 0.5]))
def test_plans_for_faster_copies_never_stall_nor_raise_the_peak(
        family: tuple, ranks: int, per_rank: int, k: float, policy: str, w_fraction: float) -> None:
    name, v, options = family
    schedule = generate(name, ranks, per_rank * ranks, v, **options)
    costs = CostModel(w_fraction=w_fraction).with_offload_ratio(k)
    step = simulate(schedule, costs).makespan
    lowered, report = lower_with_report(schedule, costs, offload=policy)
    t = simulate(lowered, costs)
    assert t.stall == 0 and t.makespan == pytest.approx(step, abs=1e-9)
    assert report.copy_time_factor == 1.0 and not report.notes
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(offload_pass, "_FASTER", ())
        without = simulate(lower(schedule, costs, offload=policy), costs)
    assert t.peak_activation_units <= without.peak_activation_units + 1e-9
