"""Offload and recompute work for every schedule family in the registry (property tests).

For random costs (per-stage times and activation sizes, P2P time, offload ratio, copy engines,
shared host link) and policies, every lowered schedule must validate (``lower`` checks), and the
simulation must show what the pass promises: no backward waits for a reload, offload alone never
lengthens the step nor raises the peak, and the planned peak is the simulated one.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeoffload.costs import CostModel
from pipeoffload.errors import ConfigError
from pipeoffload.ir import ActionKind as K
from pipeoffload.passes.lower import lower_with_report
from pipeoffload.policies import RecomputePolicy
from pipeoffload.schedules import generate, schedule_names

SIZES = [(4, 8, 2), (3, 6, 2), (4, 8, 1), (2, 5, 2)]
OFFLOAD = ["all", "first:1", "auto", "budget:2", "budget:1rank"]
RECOMPUTE = ["first:1", "all", "first:1,lgd", "partial:0.5:0.1"]


def _schedules(name: str):  # type: ignore[no-untyped-def]
    found = []
    for d, m, v in SIZES:
        try:
            found.append(generate(name, d, m, v))
        except ConfigError:
            continue
    return found


@st.composite
def cost_models(draw, num_stages: int) -> CostModel:  # type: ignore[no-untyped-def]
    per_stage = st.lists(st.sampled_from([0.5, 1.0, 1.5, 2.0]), min_size=num_stages, max_size=num_stages)
    costs = CostModel(
        time_f=tuple(draw(per_stage)), time_i=tuple(draw(per_stage)), time_w=tuple(draw(per_stage)),
        activation=tuple(draw(per_stage)), p2p_time=draw(st.sampled_from([0.0, 0.1])),
        shared_copy_engine=draw(st.booleans()), shared_host_link=draw(st.booleans()),
        w_fraction=draw(st.sampled_from([1.0, 0.5])),
    )
    return costs.with_offload_ratio(draw(st.sampled_from([0.0, 0.2, 0.5, 1.0, 2.0])))


@pytest.mark.parametrize("name", schedule_names())
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_offload_is_hidden_for_every_family(name: str, data: st.DataObject) -> None:
    schedules = _schedules(name)
    assert schedules, f"{name}: no size in {SIZES} generates"
    schedule = data.draw(st.sampled_from(schedules))
    costs = data.draw(cost_models(schedule.num_stages))
    policy = data.draw(st.sampled_from(OFFLOAD))
    lowered, report = lower_with_report(schedule, costs, offload=policy)
    from pipeoffload.simulator import simulate

    base, t = simulate(schedule, costs), simulate(lowered, costs)
    assert t.stall == 0
    assert abs(t.makespan - base.makespan) < 1e-9
    assert t.peak_activation_units <= base.peak_activation_units + 1e-9
    assert abs(t.peak_activation_units - report.peak_after) < 1e-9
    assert report.offloaded == sum(a.kind is K.OFFLOAD for row in lowered for a in row)
    assert t.as_dict()["offloaded"] == report.offloaded


@pytest.mark.parametrize("name", schedule_names())
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_recompute_and_offload_combine_for_every_family(name: str, data: st.DataObject) -> None:
    schedule = data.draw(st.sampled_from(_schedules(name)))
    costs = data.draw(cost_models(schedule.num_stages))
    offload = data.draw(st.sampled_from(["none", "first:1", "all", "budget:1"]))
    recompute = data.draw(st.sampled_from(RECOMPUTE + (["auto"] if offload != "none" else [])))
    lowered, report = lower_with_report(schedule, costs, offload=offload, recompute=recompute)
    from pipeoffload.simulator import simulate

    costs = RecomputePolicy.parse(recompute).apply_to(costs)
    t = simulate(lowered, costs)
    recomputed = {(a.stage, a.microbatch) for row in lowered for a in row if a.kind is K.R}
    offloaded = {(a.stage, a.microbatch) for row in lowered for a in row if a.kind is K.OFFLOAD}
    assert recomputed == set(report.recomputed) and not recomputed & offloaded
    assert t.stall == 0
    assert t.peak_activation_units <= simulate(schedule, costs).peak_activation_units + 1e-9
