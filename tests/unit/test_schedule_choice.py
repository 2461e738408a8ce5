"""ScheduleChoice holds typed policies: text is parsed once, comparisons are on kinds, not strings."""
from __future__ import annotations

import pytest

from pipeoffload.errors import ConfigError
from pipeoffload.planner.candidates import BUDGET_FROM_MEMORY, level
from pipeoffload.planner.evaluate import ScheduleChoice
from pipeoffload.policies import OffloadPolicy, RecomputePolicy


def test_text_is_parsed_into_policies() -> None:
    c = ScheduleChoice("group-interleaved", 2, 4, "budget:3.5", "first:1")
    assert c.offload == OffloadPolicy("budget", budget=3.5)
    assert c.recompute == RecomputePolicy("first", 1)
    assert c == ScheduleChoice("group-interleaved", 2, 4, OffloadPolicy("budget", budget=3.5), RecomputePolicy("first", 1))
    assert c.label() == "group-interleaved v=2 g=4 offload=budget:3.5 recompute=first:1"
    with pytest.raises(ConfigError, match="offload=.sometimes.: the policy is not understood"):
        ScheduleChoice("1f1b", 1, None, "sometimes")


def test_plain_periodic_and_levels() -> None:
    v2 = ScheduleChoice("group-interleaved", 2, 4)
    assert v2.plain() == v2 and v2.periodic() and level(v2) == 0
    assert level(ScheduleChoice("zb-v", 2, None, "auto")) == 1
    assert not ScheduleChoice("zb-v", 2, None, "auto").periodic()
    assert level(ScheduleChoice("zb-v", 2, None, OffloadPolicy("auto", max_stall=2.0))) == 2
    assert level(ScheduleChoice("zb-v", 2, None, "none", "first:1")) == 2
    assert ScheduleChoice("zb-v", 2, None, "none", "first:1").periodic()
    # one level: where the budget's plan fits, auto's can still be the faster one (a budget's
    # recompute auto chooses from the plan for the real copy times and can recompute more)
    assert level(ScheduleChoice("zb-v", 2, None, "budget:2", "auto")) == 3
    assert level(ScheduleChoice("zb-v", 2, None, "auto", "auto")) == 3
    assert level(ScheduleChoice("zb-v", 2, None, "none", "first:2")) == 4
    assert ScheduleChoice("zb-v", 2, None, "auto", "auto").plain() == ScheduleChoice("zb-v", 2)


def test_choices_order_by_their_text_forms() -> None:
    """budget:10 sorts before budget:9.5 (text order), as the search's tie-breaks always had it."""
    a = ScheduleChoice("1f1b", 1, None, "budget:10")
    b = ScheduleChoice("1f1b", 1, None, "budget:9.5")
    c = ScheduleChoice("1f1b", 1, None, "auto")
    assert sorted([b, a, c]) == [c, a, b]
    assert a < b and b > a and a <= a and c >= c


def test_the_budget_placeholder_is_not_a_user_budget() -> None:
    assert BUDGET_FROM_MEMORY.kind == "budget" and BUDGET_FROM_MEMORY != OffloadPolicy.parse("budget:5")
