"""WAIT: the compute lane waits for an OFFLOAD's copy (ir, validator, simulator, the throttled warm-up)."""
from __future__ import annotations

import pytest

from pipeoffload import generate, simulate
from pipeoffload.costs import CostModel
from pipeoffload.errors import ScheduleError
from pipeoffload.ir import Action, ActionKind, Schedule
from pipeoffload.passes.lower import lower, lower_with_report
from pipeoffload.passes.throttle import with_waits
from pipeoffload.validation import validate

K = ActionKind
ONE_RANK = "0F0 0OFFLOAD0 0WAIT0 0F1 0B1 0RELOAD0 0B0\n"


def test_text_form_round_trips():
    assert Action.parse("3WAIT5") == Action(K.WAIT, 3, 5)
    assert str(Action(K.WAIT, 3, 5)) == "3WAIT5"
    assert Schedule.from_text(ONE_RANK).to_text() == ONE_RANK


def test_validator_rejects_a_wait_without_its_offload():
    validate(Schedule.from_text(ONE_RANK))
    for text in ("0F0 0WAIT0 0F1 0B1 0B0\n", "0F0 0WAIT0 0OFFLOAD0 0F1 0B1 0RELOAD0 0B0\n"):
        with pytest.raises(ScheduleError, match="WAIT of stage 0, microbatch 0 waits for its OFFLOAD"):
            validate(Schedule.from_text(text))


def test_the_lane_waits_until_the_copy_ends():
    costs = CostModel(d2h_time=5.0, h2d_time=0.0)
    t = simulate(Schedule.from_text(ONE_RANK), costs)
    times = {str(a): (start, end) for a, start, end in t.events(0)}
    assert times["0OFFLOAD0"] == (1.0, 6.0)
    assert times["0WAIT0"] == (1.0, 6.0)  # from the lane's clock to the copy's end
    assert times["0F1"] == (6.0, 7.0)
    assert t.peak_activation_units == 1.0  # F1 allocates after F0's copy freed it
    assert t.stall == 0.0 and t.per_rank[0].busy == 6.0  # a wait is idle time: neither a stall nor busy
    without = simulate(Schedule.from_text(ONE_RANK.replace("0WAIT0 ", "")), costs)
    assert without.peak_activation_units == 2.0


def test_with_waits_follows_the_rule():
    row = Schedule.from_text("0F0 0OFFLOAD0 0F1 0OFFLOAD1 0F2 0F3 0RELOAD0 0B0 0F4\n").actions[0]
    out = " ".join(str(a) for a in with_waits(row, 1))
    # each warm-up forward waits for the latest offload issued before it, once; none after the first backward
    assert out == "0F0 0OFFLOAD0 0WAIT0 0F1 0OFFLOAD1 0WAIT1 0F2 0F3 0RELOAD0 0B0 0F4"


def test_throttled_warmup_lowers_the_shared_link_peak():
    """1F1B, 4 ranks, two per host link, k = 0.5: the pair's warm-up forwards come faster than one
    link drains them; waiting for the copies takes the peak from 3 to 2 at the same makespan."""
    schedule = generate("1f1b", 4, 8)
    costs = CostModel(shared_host_link=True).with_offload_ratio(0.5)
    lowered, report = lower_with_report(schedule, costs, offload="all")
    t = simulate(lowered, costs)
    assert any(a.kind is K.WAIT for row in lowered.actions for a in row)
    assert report.throttle == 1 and "warm-up forwards wait for copies" in report.summary()
    assert t.peak_activation_units == 2.0 and t.stall == 0.0
    assert t.makespan == simulate(schedule, costs).makespan
    plain = [[a for a in row if a.kind is not K.WAIT] for row in lowered.actions]
    assert simulate(lowered.with_actions(plain), costs).peak_activation_units == 3.0


def test_own_links_keep_their_plans_without_waits():
    schedule = generate("1f1b", 4, 8)
    lowered = lower(schedule, CostModel().with_offload_ratio(0.5), offload="all")
    assert not any(a.kind is K.WAIT for row in lowered.actions for a in row)
