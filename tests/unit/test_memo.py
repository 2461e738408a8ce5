"""The explicit cache (``_perf.Memo``): keyed by value, owned by its caller, and changing no result."""
from __future__ import annotations

import pytest

from pipeoffload import CostModel, generate, lower, simulate
from pipeoffload._perf import Memo
from pipeoffload.passes.lower import lower_with_report
from pipeoffload.passes.offload import plan_offload
from pipeoffload.planner.evaluate import ScheduleChoice, simulate_choice
from pipeoffload.validation import validate

# one schedule lowered under several cost models: a memo whose key left out the costs (or the policy)
# would hand the second lowering the first one's simulation or offload plan
_COSTS = [CostModel().with_offload_ratio(0.5), CostModel(time_f=1.0, time_i=2.0, time_w=0.5).with_offload_ratio(1.5),
          CostModel(shared_host_link=True).with_offload_ratio(0.5)]
_SCHEDULES = [("interleaved-1f1b", 4, 6, 2), ("zb-h1", 4, 6, 1)]
_POLICIES = [("all", "none"), ("budget:2", "auto"), ("auto", "first:1")]


def _outcome(lowered, report, costs):  # type: ignore[no-untyped-def]
    timeline = simulate(lowered, costs)
    return lowered.to_text(), report, timeline.makespan, [r.peak_activation_units for r in timeline.per_rank]


@pytest.mark.parametrize("family, d, m, v", _SCHEDULES)
def test_a_shared_memo_changes_no_lowering_or_simulation(family: str, d: int, m: int, v: int) -> None:
    schedule = generate(family, d, m, v)
    shared = Memo()
    for costs in _COSTS:
        for offload, recompute in _POLICIES:
            kwargs = {"offload": offload, "recompute": recompute}
            with_shared = lower_with_report(schedule, costs, memo=shared, **kwargs)
            fresh = lower_with_report(schedule, costs, **kwargs)
            assert _outcome(*with_shared, costs) == _outcome(*fresh, costs), (costs, offload, recompute)


def test_a_shared_memo_changes_no_planner_estimate() -> None:
    shared = Memo()
    for costs in _COSTS[:2]:
        for choice in (ScheduleChoice("1f1b"), ScheduleChoice("1f1b", offload="auto"),
                       ScheduleChoice("1f1b", offload="budget:1", recompute="auto")):
            assert (simulate_choice(choice, 2, 24, costs, memo=shared)
                    == simulate_choice(choice, 2, 24, costs)), (costs, choice)


def test_the_memo_keys_by_value_and_keeps_the_most_recent() -> None:
    memo, calls = Memo(keep=2), []

    def square(x: int) -> int:
        calls.append(x)
        return x * x

    assert [memo(square, 3), memo(square, 3), memo(square, 4), memo(square, 3), memo(square, 5)] == [9, 9, 16, 9, 25]
    assert calls == [3, 4, 5] and memo.peek(square, 4) is None and memo.peek(square, 3) == 9  # 4 used least lately
    costs = CostModel().with_offload_ratio(0.5)
    first = memo(simulate, generate("1f1b", 4, 8), costs)
    assert memo(simulate, generate("1f1b", 4, 8), CostModel().with_offload_ratio(0.5)) is first  # equal values
    assert memo(simulate, generate("1f1b", 4, 8), CostModel().with_offload_ratio(0.6)) is not first


def test_equal_schedules_hash_equal_and_cheaply() -> None:
    a, b = generate("interleaved-1f1b", 4, 8, 2), generate("interleaved-1f1b", 4, 8, 2)
    assert a is not b and a == b and hash(a) == hash(b)
    assert len({a, b, lower(a)}) == 2


def test_nothing_is_stored_on_schedules_or_timelines() -> None:
    """Validating, simulating, lowering and planning leave every value as it was built."""
    schedule = generate("interleaved-1f1b", 4, 8, 2)
    costs = CostModel().with_offload_ratio(0.5)
    fields = dict(vars(schedule))
    validate(schedule)
    timeline = simulate(schedule, costs)
    timeline_fields = dict(vars(timeline))
    lower_with_report(schedule, costs, offload="auto", recompute="auto")
    plan_offload(schedule, costs, "all", timeline=timeline)
    simulate_choice(ScheduleChoice("interleaved-1f1b", 2, offload="auto"), 4, 8, costs)
    assert vars(schedule) == fields and vars(timeline) == timeline_fields
