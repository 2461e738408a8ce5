"""The copy-lane searches of the offload pass against plain reference searches kept here.

``CopyGroup.earliest``/``latest`` are written out for speed (and ``earliest`` crosses runs of narrow
gaps in one scan); the references below are the straightforward step-per-interval searches they
replaced. On random lanes, grids and copies (lone engine, separate engines, shared host link, exact
and relaxed), both must return the same start, bit for bit.
"""
from __future__ import annotations

import bisect
import random

import pytest

from pipeoffload import generate
from pipeoffload.costs import CostModel
from pipeoffload.intervals import EPS
from pipeoffload.passes.copy_plan import CopyGroup, RankTimeline
from pipeoffload.simulator import simulate


def _next_start(clocks, engine, link, t):  # type: ignore[no-untyped-def]
    best = None
    p = bisect.bisect_left(clocks, t - EPS)
    if p < len(clocks):
        best = clocks[p]
    for ends in (engine, link) if link is not None else (engine,):
        i = bisect.bisect_left(ends, t - EPS)
        if i < len(ends) and (best is None or ends[i] < best):
            best = ends[i]
    return best


def _prev_start(clocks, engine, link, t):  # type: ignore[no-untyped-def]
    best = None
    p = bisect.bisect_right(clocks, t + EPS) - 1
    if p >= 0:
        best = clocks[p]
    for ends in (engine, link) if link is not None else (engine,):
        i = bisect.bisect_right(ends, t + EPS)
        if i and (best is None or ends[i - 1] > best):
            best = ends[i - 1]
    return best


def ref_earliest(group: CopyGroup, rank: int, direction: str, t: float, duration: float, limit: float):  # type: ignore[no-untyped-def]
    lanes = group.lanes(rank, direction)
    clocks, engine = group.timelines[rank].clocks, lanes[0].ends
    link = lanes[1].ends if group.relaxed else None
    cursor = _next_start(clocks, engine, link, t)
    while cursor is not None and cursor <= limit + EPS:
        blocked = None
        reach = cursor + duration - EPS if duration > 0 else cursor - EPS
        for lane in lanes:
            i = bisect.bisect_right(lane.ends, cursor + EPS)
            if i < len(lane.ends) and lane.starts[i] < reach and (blocked is None or lane.ends[i] > blocked):
                blocked = lane.ends[i]
        if blocked is None:
            return cursor
        cursor = _next_start(clocks, engine, link, blocked)
    return None


def ref_latest(group: CopyGroup, rank: int, direction: str, t: float, duration: float, lower: float):  # type: ignore[no-untyped-def]
    lanes = group.lanes(rank, direction)
    clocks, engine = group.timelines[rank].clocks, lanes[0].ends
    link = lanes[1].ends if group.relaxed else None
    cursor = _prev_start(clocks, engine, link, t)
    while cursor is not None and cursor >= lower - EPS:
        blocked = None
        reach = cursor + duration - EPS if duration > 0 else cursor - EPS
        for lane in lanes:
            i = bisect.bisect_right(lane.ends, cursor + EPS)
            if i < len(lane.ends) and lane.starts[i] < reach and (blocked is None or lane.starts[i] < blocked):
                blocked = lane.starts[i]
        if blocked is None:
            return cursor
        cursor = _prev_start(clocks, engine, link, blocked - duration)
    return None


def _timelines(costs: CostModel) -> list[RankTimeline]:
    schedule = generate("group-interleaved", 4, 16, 2, group_size=4)
    tl = simulate(schedule, costs)
    return [RankTimeline(r, schedule.actions[r], tl.start[r], tl.end[r], costs, set()) for r in range(2)]


COSTS = [
    CostModel(d2h_time=0.5, h2d_time=0.5),
    CostModel(d2h_time=0.3, h2d_time=1.1, shared_copy_engine=False),
    CostModel(d2h_time=0.7, h2d_time=0.4, shared_host_link=True),
]


@pytest.mark.parametrize("relaxed", [False, True])
@pytest.mark.parametrize("costs", COSTS, ids=["engine", "separate", "shared-link"])
def test_searches_match_the_plain_reference(costs: CostModel, relaxed: bool) -> None:
    rng = random.Random(11)
    timelines = _timelines(costs)
    horizon = timelines[0].clocks[-1]
    for _ in range(20):
        group = CopyGroup(timelines, costs, relaxed)
        for _ in range(300):
            rank, direction = rng.choice([0, 1]), rng.choice(["d2h", "h2d"])
            # durations on the grid's scale, some exactly its step (copies end on grid points)
            duration = rng.choice([0.0, 0.25, 0.5, 1.0, rng.uniform(0.05, 3.0)])
            t = rng.choice([rng.uniform(0, horizon), rng.choice(timelines[rank].clocks)])
            limit = t + rng.uniform(0, horizon)
            got = group.earliest(rank, direction, t, duration, limit)
            assert got == ref_earliest(group, rank, direction, t, duration, limit)
            lower = t - rng.uniform(0, horizon)
            late = group.latest(rank, direction, t, duration, lower)
            assert late == ref_latest(group, rank, direction, t, duration, lower)
            start = got if rng.random() < 0.7 else late
            if start is not None and duration > 0:
                group.reserve(rank, direction, start, duration)
        for lane in {id(x): x for key in group._lanes for x in group.lanes(*key)}.values():
            assert lane.ends == sorted(lane.ends)  # the searches kept the lanes free of overlaps


def test_an_overloaded_engine_is_crossed_to_its_first_wide_gap() -> None:
    """Back-to-back copies with one gap wide enough: the search lands in it (not before)."""
    costs = COSTS[0]
    group = CopyGroup(_timelines(costs)[:1], costs)
    for k in range(50):
        group.reserve(0, "d2h", 1.0 + k * 1.0 + (0.6 if k >= 30 else 0.0), 1.0)
    want = ref_earliest(group, 0, "d2h", 1.0, 0.5, 1e9)
    assert want is not None and abs(want - 31.0) < 1e-9
    assert group.earliest(0, "d2h", 1.0, 0.5, 1e9) == want
    assert group.earliest(0, "d2h", 1.0, 0.7, 1e9) == ref_earliest(group, 0, "d2h", 1.0, 0.7, 1e9)
