"""What steps 9-12 of a shared-link lowering share (``offload._Runs``) is what a fresh computation gives.

The throttled compute timings and the simulations of planned states are made once per lowering and
handed to every step that asks again; each answer must be the one its own computation would give,
for every key it is asked with (copy times, limit, throttle): equal figures, times and timelines."""
from __future__ import annotations

import numpy as np

from pipeoffload.costs import CostModel
from pipeoffload.ir import ActionKind
from pipeoffload.passes.copy_plan import RankTimeline, rank_timelines
from pipeoffload.passes.offload import _candidates, _copies_scaled, _emit, _emitted_key, _Runs
from pipeoffload.passes.slots import SlotPattern, plan_pair, slot_length
from pipeoffload.passes.throttle import throttled_timeline
from pipeoffload.policies import OffloadPolicy
from pipeoffload.schedules import generate
from pipeoffload.simulator import Timeline, simulate

K = ActionKind
BASE = generate("1f1b", 4, 8, 1).compute_only()
COSTS = CostModel(shared_host_link=True).with_offload_ratio(0.6)
SLOWER = _copies_scaled(COSTS, 1.25)


def _same_timeline(a: Timeline, b: Timeline) -> bool:
    return (a.schedule.actions == b.schedule.actions and a.start == b.start and a.end == b.end
            and a.makespan == b.makespan and [r.memory for r in a.per_rank] == [r.memory for r in b.per_rank]
            and [r.stall for r in a.per_rank] == [r.stall for r in b.per_rank])


def _same_rank_timeline(a: RankTimeline, b: RankTimeline) -> bool:
    def acts(tl: RankTimeline) -> list[tuple]:
        return [(key, x.f_end, x.deadline, x.back_index, x.d2h, x.h2d, x.size, x.window)
                for xs in (tl.activations, tl.w_activations) for key, x in sorted(xs.items())]
    return (a.rank == b.rank and a.actions == b.actions and a.clocks == b.clocks and acts(a) == acts(b)
            and np.array_equal(a.memory, b.memory) and a.point_list == b.point_list)


def test_a_throttled_timing_is_the_fresh_one_for_its_copy_times_and_limit() -> None:
    runs = _Runs(BASE, frozenset())
    fresh = {(costs, limit): throttled_timeline(BASE, costs, limit, frozenset())
             for costs in (COSTS, SLOWER) for limit in (1, 2)}
    # the keys matter here: each copy-time and limit gives another timing (else this test could not fail)
    assert fresh[(COSTS, 1)].start != fresh[(COSTS, 2)].start
    assert fresh[(COSTS, 1)].start != fresh[(SLOWER, 1)].start
    for (costs, limit), timeline in fresh.items():
        got, timelines = runs.throttled(costs, limit)
        assert _same_timeline(got, timeline), (costs.d2h_time, limit)
        expected = rank_timelines(BASE, timeline, costs)
        assert len(timelines) == len(expected)
        assert all(_same_rank_timeline(x, y) for x, y in zip(timelines, expected, strict=True)), (costs.d2h_time, limit)
        assert runs.throttled(costs, limit)[0] is got  # asked again: the same answer, not made again


def _slot_states(timelines: list[RankTimeline]) -> dict:  # type: ignore[type-arg]
    chosen = _candidates(timelines, OffloadPolicy.parse("all"), set())
    pattern = SlotPattern(slot_length(chosen), 0, 0.0)
    states = {}
    for members in ([0, 1], [2, 3]):
        states.update(plan_pair([timelines[r] for r in members], {r: chosen[r] for r in members}, pattern))
    return states


def test_a_plan_simulation_is_the_fresh_one_for_its_lists_throttle_and_copy_times() -> None:
    runs = _Runs(BASE, frozenset())
    timelines = rank_timelines(BASE, simulate(BASE, COSTS), COSTS)
    plain = _slot_states(timelines)
    # the same copies at the same list positions with a throttle: only the waits differ, so the key must
    # hold the throttle (the copies' key alone is equal)
    waiting = _slot_states([tl.with_throttle(1) for tl in timelines])
    assert [_emitted_key(plain[r]) for r in range(4)] == [_emitted_key(waiting[r]) for r in range(4)]
    rows = {name: [_emit(states[r]) for r in range(4)] for name, states in (("plain", plain), ("waiting", waiting))}
    assert any(a.kind is K.WAIT for row in rows["waiting"] for a in row)
    assert rows["plain"] != rows["waiting"]
    for costs in (COSTS, SLOWER):
        for name, states in (("plain", plain), ("waiting", waiting)):
            fresh = simulate(BASE.with_actions(rows[name]), costs)
            assert _same_timeline(runs.simulated(costs, states), fresh), (name, costs.d2h_time)
        assert _same_timeline(runs.simulated(costs), simulate(BASE, costs))
    assert runs.simulated(COSTS, plain).makespan != runs.simulated(SLOWER, plain).makespan \
        or runs.simulated(COSTS, plain).per_rank != runs.simulated(SLOWER, plain).per_rank
