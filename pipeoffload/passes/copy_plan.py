"""Building blocks of the offload placement pass: one rank's timeline, copy lanes, memory curve.

The pass plans copies against the compute timeline of the schedule without copies. A copy is an
action in the rank's list, so it is *issued* at the end of the compute action before it (a "grid
point") and starts when its copy engine (FIFO, as in the simulator) is free. A planned start is
therefore reproduced exactly by the simulator only if it is a grid point or the end of the copy
before it on the same engine; the searches return only such starts ("exact" mode), so the
simulator sees the planned times. On a shared host link, "relaxed" mode also allows a start at the
end of the partner rank's copy: denser, but the simulator's link serves copies in the order they
reach it, and such a copy, issued at its rank's last grid point before that end, can reach the link
before the partner's and go first; so relaxed plans are checked by simulation (see ``offload``).
"""
from __future__ import annotations

import bisect
import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field

import numpy as np

from pipeoffload import semantics as sem
from pipeoffload.costs import CostModel
from pipeoffload.intervals import EPS, Intervals
from pipeoffload.ir import Action, ActionKind, Schedule
from pipeoffload.simulator import Timeline

K = ActionKind
_F, _B, _I, _W, _R = sem.F, sem.B, sem.I, sem.W, sem.R


Lane = Intervals  # a copy engine or a shared host link


@dataclass(slots=True)
class Activation:
    """One offload window of a (stage, microbatch) activation on its rank, with the times the pass
    plans around. Window 0 is F -> backward (all of the activation); window 1 is I -> W (the
    ``w_fraction`` part W still needs: ``size``, ``d2h`` and ``h2d`` are that part's)."""

    stage: int
    microbatch: int
    size: float
    f_end: float  # the earliest a device->host copy can start (end of F; window 1: end of I)
    deadline: float  # start of its backward (I or B; window 1: W): the reload must be complete by then
    back_index: int  # list position of that backward
    d2h: float
    h2d: float
    window: int = 0
    value: float = field(init=False)  # memory-time an offload can save: size x the time it could be away

    def __init__(self, stage: int, microbatch: int, size: float, f_end: float, deadline: float, back_index: int,
                 d2h: float, h2d: float, window: int = 0) -> None:
        # written out (the dataclass keeps an ``__init__`` it finds): no ``__post_init__`` or ``max``
        # call per activation, of which the pass builds one per backward
        self.stage, self.microbatch, self.size, self.f_end, self.deadline = stage, microbatch, size, f_end, deadline
        self.back_index, self.d2h, self.h2d, self.window = back_index, d2h, h2d, window
        gap = deadline - f_end - d2h - h2d
        self.value = size * (gap if gap > 0.0 else 0.0)  # max(0.0, gap), NaN and -0.0 included

    @property
    def ident(self) -> tuple[int, int, int]:
        """(stage, microbatch, window): one candidate of the pass."""
        return self.stage, self.microbatch, self.window

    @property
    def lifespan(self) -> float:
        return self.deadline - self.f_end


class RankTimeline:
    """One rank's compute actions with their simulated times, grid points and baseline memory."""

    throttle = 0  # warm-up forwards wait for the throttle-th latest offload (``passes.throttle``); 0: never

    def __init__(self, rank: int, actions: tuple[Action, ...], starts: tuple[float, ...],
                 ends: tuple[float, ...], costs: CostModel, recomputed: set[tuple[int, int]],
                 codes: tuple[np.ndarray, np.ndarray] | None = None, per_stage: _PerStage | None = None) -> None:
        """``codes``: the rank's (kind code, stage) arrays, and ``per_stage``: ``_per_stage(costs, ...)``,
        when the caller has them (``rank_timelines`` takes them from the schedule's coded form, once
        for every rank); otherwise read from ``actions`` and ``costs``."""
        self.rank = rank
        self.actions = actions
        self.clocks = [0.0, *ends]  # clocks[p]: issue time of a copy placed before action p
        self.point_list = sorted({0.0, *starts, *ends})
        self.points = np.array(self.point_list)
        self.activations: dict[tuple[int, int], Activation] = {}  # window 0 (F -> backward)
        self.w_activations: dict[tuple[int, int], Activation] = {}  # window 1 (I -> W), where W needs some
        self.memory = self._baseline(actions, starts, ends, costs, recomputed, codes, per_stage)

    def _baseline(self, actions, starts, ends, costs, recomputed, codes, per_stage):  # type: ignore[no-untyped-def]
        """Resident activation units at each point (frees before allocations at equal times), and the
        windows the pass may move: each backward (B or I) of an activation not recomputed whose F
        came earlier on the rank; each W whose I came earlier and that needs a part of it."""
        n = len(actions)
        points = self.points
        if not n:
            self.activations = {}
            return np.zeros(len(points))
        if codes is None:
            kind = np.fromiter((sem.CODE[a.kind] for a in actions), dtype=np.int64, count=n)
            stage = np.fromiter((a.stage for a in actions), dtype=np.int64, count=n)
        else:
            kind, stage = codes
        if per_stage is None:
            per_stage = _per_stage(costs, int(stage.max()) + 1)
        sizes, fractions, size_of, keep_of = per_stage
        start, end = np.asarray(starts, dtype=float), np.asarray(ends, dtype=float)
        size = size_of[stage]
        keep = keep_of[stage]
        is_f = kind == _F
        if recomputed:
            dropped = np.fromiter(((a.stage, a.microbatch) in recomputed for a in actions), dtype=bool, count=n)
            is_f &= ~dropped
        at_start = is_f | (kind == _R)
        at_end = (kind == _W) | (kind == _B) | (kind == _I)
        counted = at_start | at_end
        amount = np.where(at_start, size, np.where(kind == _W, -size * keep,
                                                   np.where(kind == _B, -size, -size * (1.0 - keep))))
        at = np.searchsorted(points, np.where(at_start, start, end))
        delta = np.bincount(at[counted], weights=amount[counted], minlength=len(points))
        memory = np.cumsum(delta)
        memory[np.abs(memory) < EPS] = 0.0
        f_end: dict[tuple[int, int], float] = {}
        found: dict[tuple[int, int], Activation] = {}
        i_end: dict[tuple[int, int], float] = {}
        found_w: dict[tuple[int, int], Activation] = {}
        listed = np.flatnonzero((kind == _F) | (kind == _B) | (kind == _I) | (kind == _W))
        for p, code in zip(listed.tolist(), kind[listed].tolist()):
            a = actions[p]
            key = a[1:]  # (stage, microbatch)
            if code == _F:
                f_end[key] = ends[p]
            elif code == _W:
                fraction = fractions[a.stage]
                if key in i_end and fraction > 0.0:
                    x = sizes[a.stage]
                    found_w[key] = Activation(a.stage, a.microbatch, x[0] * fraction, i_end[key], starts[p], p,
                                              x[1] * fraction, x[2] * fraction, window=1)
            else:  # B or I
                if code == _I:
                    i_end[key] = ends[p]
                if key not in recomputed and key in f_end:
                    x = sizes[a.stage]
                    found[key] = Activation(a.stage, a.microbatch, x[0], f_end[key], starts[p], p, x[1], x[2])
        self.activations = found
        self.w_activations = found_w
        return memory

    def with_throttle(self, limit: int) -> RankTimeline:
        """The same timeline whose warm-up forwards wait for their ``limit``-th latest offload (a shallow
        copy: everything else is shared)."""
        out = object.__new__(RankTimeline)
        out.__dict__.update(self.__dict__)
        out.throttle = limit
        return out

    def with_copy_times(self, factor: float) -> RankTimeline:
        """The same timeline with every copy taking ``factor`` times as long (the compute times,
        points and baseline memory do not depend on copy times, so they are shared, not rebuilt)."""
        out = object.__new__(RankTimeline)
        out.__dict__.update(self.__dict__)

        def scaled(xs: dict[tuple[int, int], Activation]) -> dict[tuple[int, int], Activation]:
            return {key: Activation(x.stage, x.microbatch, x.size, x.f_end, x.deadline, x.back_index,
                                    x.d2h * factor, x.h2d * factor, x.window) for key, x in xs.items()}

        out.activations, out.w_activations = scaled(self.activations), scaled(self.w_activations)
        return out

    def off_range(self, d2h_end: float, h2d_start: float) -> tuple[int, int]:
        """Point indices [lo, hi) at which an activation is off the device.

        The device copy is gone from the first point at or after the D2H end; the reload counts
        from the last point at or before its start (conservative when that is not a grid point).
        """
        lo = bisect.bisect_left(self.point_list, d2h_end - EPS)
        hi = bisect.bisect_right(self.point_list, h2d_start + EPS) - 1
        return lo, hi

    def grid_floor(self, t: float) -> float | None:
        """The latest issue point at or before ``t``."""
        p = bisect.bisect_right(self.clocks, t + EPS) - 1
        return self.clocks[p] if p >= 0 else None

    def grid_ceil(self, t: float) -> float | None:
        p = bisect.bisect_left(self.clocks, t - EPS)
        return self.clocks[p] if p < len(self.clocks) else None

    def position(self, t: float, limit: int | None = None) -> int:
        """List position whose issue time is the latest at or before ``t`` (capped at ``limit``)."""
        p = bisect.bisect_right(self.clocks, t + EPS) - 1
        return p if limit is None or p < limit else limit


def rank_timelines(schedule: Schedule, timeline: Timeline, costs: CostModel) -> list[RankTimeline]:
    """Every rank's ``RankTimeline`` of a compute-only ``schedule`` simulated as ``timeline`` (a search
    keeps them in its ``_perf.Memo`` under the schedule and costs, which determine the timeline)."""
    recomputed = ({(a.stage, a.microbatch) for row in schedule.actions for a in row if a.kind is K.R}
                  if K.R in schedule.kinds() else set())  # the usual case, no R, found by a C-level scan
    c = sem.coded(schedule)  # carried by a validated schedule; else built once here, not per rank
    bounds = c.offsets.tolist()
    per_stage = _per_stage(costs, schedule.num_stages)
    return [RankTimeline(r, schedule.actions[r], timeline.start[r], timeline.end[r], costs, recomputed,
                         (c.kind[bounds[r]:bounds[r + 1]], c.stage[bounds[r]:bounds[r + 1]]), per_stage)
            for r in range(schedule.num_ranks)]


# per stage: (activation units, D2H time, H2D time), the w_fraction, and the units and w_fraction as arrays
_PerStage = tuple[list[tuple[float, float, float]], list[float], np.ndarray, np.ndarray]


def _per_stage(costs: CostModel, num_stages: int) -> _PerStage:
    sizes = [(costs.act(s), costs.d2h(s), costs.h2d(s)) for s in range(num_stages)]
    fractions = [costs.w_fraction_of(s) for s in range(num_stages)]
    return sizes, fractions, np.array([x[0] for x in sizes]), np.array(fractions)


@dataclass(slots=True)
class Placed:
    """A planned offload: its D2H and H2D copy windows and the point range it is off the device."""

    activation: Activation
    d2h_start: float
    h2d_start: float
    lo: int
    hi: int

    @property
    def d2h_end(self) -> float:
        return self.d2h_start + self.activation.d2h


class _Way:
    """One rank's copies in one direction: the grid points they may start at and the lanes they book
    (its engine first, then the pair's link when shared; the engine's when no link). The searches'
    inner loops read these attributes, so each search starts with no lookups but the object's."""

    __slots__ = ("books", "clocks", "e_starts", "e_ends", "l_starts", "l_ends", "lanes", "relaxed", "shared")

    def __init__(self, clocks: list[float], lanes: list[Lane], relaxed: bool) -> None:
        self.clocks = clocks
        self.lanes = lanes
        self.books = [(lane.starts, lane.ends) for lane in lanes]
        self.e_starts, self.e_ends = lanes[0].starts, lanes[0].ends
        self.l_starts, self.l_ends = lanes[-1].starts, lanes[-1].ends
        self.shared = len(lanes) > 1
        self.relaxed = relaxed

    def earliest(self, t: float, duration: float, limit: float) -> float | None:
        """``CopyGroup.earliest`` of this rank and direction."""
        clocks, e_starts, e_ends = self.clocks, self.e_starts, self.e_ends
        relaxed, shared = self.relaxed, self.shared
        n_clocks, n_engine = len(clocks), len(e_ends)
        bound = limit + EPS
        lone = not shared and not relaxed  # runs of narrow gaps are crossed in one scan (``CopyGroup.earliest``)
        narrow = None  # set at the first such scan
        query = t
        while True:
            low = query - EPS  # the first grid point or engine (relaxed: link) end >= query
            p = bisect_left(clocks, low)
            cursor = clocks[p] if p < n_clocks else _INF
            i = bisect_left(e_ends, low)  # the engine's intervals before i end before the cursor
            if i < n_engine and e_ends[i] < cursor:
                cursor = e_ends[i]
            first = i
            if relaxed:
                l_ends = self.l_ends
                i = bisect_left(l_ends, low)
                if i < len(l_ends) and l_ends[i] < cursor:
                    cursor = l_ends[i]
            if cursor > bound:  # also when there is none (infinity)
                return None
            reach = cursor + duration - EPS if duration > 0 else cursor - EPS
            blocked = None  # the latest end among the intervals the copy would overlap
            i = first  # the first engine interval ending after cursor + EPS (a bisection only if not this one)
            if i < n_engine and e_ends[i] <= cursor + EPS:
                i = bisect_right(e_ends, cursor + EPS, i + 1)
            if i < n_engine and e_starts[i] < reach:
                # (a gap as wide as the copy is wider than ``narrow``: no scan, and no ``slack`` to work out)
                if lone and i + 1 < n_engine and e_starts[i + 1] - e_ends[i] < duration:
                    if narrow is None:  # a gap narrower than ``narrow`` blocks the copy wherever within EPS
                        # of the gap's start it would start; ends more than ``apart`` apart make each step
                        # block on the next; a blocking end past ``beyond`` leaves no start <= bound + EPS
                        slack = 3 * EPS + 8 * math.ulp(max(abs(e_ends[-1]), abs(t), abs(duration)))
                        narrow, apart, beyond = duration - slack, 2 * EPS + slack, bound + EPS
                    # a run of busy intervals with narrow gaps: each would block the next start; the scan
                    # stops past ``beyond`` (the next step's start would be past ``limit`` anyway)
                    while (i + 1 < n_engine and e_ends[i] <= beyond and e_starts[i + 1] - e_ends[i] < narrow
                           and e_ends[i + 1] - e_ends[i] > apart):
                        i += 1
                blocked = e_ends[i]
            if shared:
                l_starts, l_ends = self.l_starts, self.l_ends
                i = bisect_right(l_ends, cursor + EPS)
                if i < len(l_ends) and l_starts[i] < reach and (blocked is None or l_ends[i] > blocked):
                    blocked = l_ends[i]
            if blocked is None:
                return cursor
            query = blocked

    def latest(self, t: float, duration: float, lower: float) -> float | None:
        """``CopyGroup.latest`` of this rank and direction."""
        clocks, e_starts, e_ends = self.clocks, self.e_starts, self.e_ends
        relaxed, shared = self.relaxed, self.shared
        n_engine = len(e_ends)
        bound = lower - EPS
        query = t
        while True:
            high = query + EPS  # the last grid point or engine (relaxed: link) end <= query
            p = bisect_right(clocks, high) - 1
            cursor = clocks[p] if p >= 0 else -_INF
            i = bisect_right(e_ends, high)  # the engine's intervals before i end by the cursor
            if i and e_ends[i - 1] > cursor:
                cursor = e_ends[i - 1]
            first = i
            if relaxed:
                l_ends = self.l_ends
                i = bisect_right(l_ends, high)
                if i and l_ends[i - 1] > cursor:
                    cursor = l_ends[i - 1]
            if cursor < bound:  # also when there is none (minus infinity)
                return None
            reach = cursor + duration - EPS if duration > 0 else cursor - EPS
            blocked = None  # the earliest start among the intervals the copy would overlap
            i = first  # the first engine interval ending after cursor + EPS (a bisection only if not this one)
            if i < n_engine and e_ends[i] <= cursor + EPS:
                i = bisect_right(e_ends, cursor + EPS, i + 1)
            if i < n_engine and e_starts[i] < reach:
                blocked = e_starts[i]
            if shared:
                l_starts, l_ends = self.l_starts, self.l_ends
                i = bisect_right(l_ends, cursor + EPS)
                if i < len(l_ends) and l_starts[i] < reach and (blocked is None or l_starts[i] < blocked):
                    blocked = l_starts[i]
            if blocked is None:
                return cursor
            query = blocked - duration

    def reserve(self, t: float, duration: float) -> None:
        if duration <= 0:
            return
        for starts, ends in self.books:  # ``Intervals.add``, written out: the pass's most frequent call
            i = bisect_left(starts, t)
            starts.insert(i, t)
            ends.insert(i, t + duration)

    def release(self, t: float, duration: float) -> None:
        for lane in self.lanes:
            lane.remove(t, duration)


_INF = math.inf


class CopyGroup:
    """Ranks planned together because they share copy resources (one rank, or a host-link pair)."""

    def __init__(self, timelines: list[RankTimeline], costs: CostModel, relaxed: bool = False) -> None:
        self.timelines = {tl.rank: tl for tl in timelines}
        self.relaxed = relaxed and costs.shared_host_link
        links = {"d2h": Lane(), "h2d": Lane()}
        self._lanes: dict[tuple[int, str], list[Lane]] = {}
        for rank in self.timelines:
            shared = Lane()
            for direction in ("d2h", "h2d"):
                engine = shared if costs.shared_copy_engine else Lane()
                self._lanes[(rank, direction)] = [engine, links[direction]] if costs.shared_host_link else [engine]
        self._ways = {key: _Way(self.timelines[key[0]].clocks, lanes, self.relaxed) for key, lanes in self._lanes.items()}
        # own host links: a rank's copies book its engine(s) alone (``settled``); one engine: both directions
        self._own_links, self._one_engine = not costs.shared_host_link, costs.shared_copy_engine
        self.settled = True  # after ``pack``: packing its set again without its failures places the same
        # per rank: (D2H way, H2D way, grid points): what ``place`` and ``pack`` read
        self._rank = {rank: (self._ways[(rank, "d2h")], self._ways[(rank, "h2d")], tl.point_list)
                      for rank, tl in self.timelines.items()}

    def lanes(self, rank: int, direction: str) -> list[Lane]:
        """Every resource such a copy occupies: its engine first, then the pair's link when shared."""
        return self._lanes[(rank, direction)]

    def earliest(self, rank: int, direction: str, t: float, duration: float, limit: float) -> float | None:
        """The first valid start >= t (and <= limit) at which the copy fits on all its resources.

        The inner loop of the pass: each step is the first valid start at or after the end of the
        interval that blocked the last one; a lane check is one bisection. On a lone engine (the
        planner's usual case) a run of intervals whose gaps are too short for the copy, even at
        the EPS-earliest start, is crossed in one scan instead of a step per interval: an
        overloaded lane is otherwise walked from each copy's forward to the lane's backlog.
        Written out with locals (no calls but the bisections); ``tests/unit/test_copy_lanes.py``
        checks it against the plain step-per-interval search.
        """
        return self._ways[(rank, direction)].earliest(t, duration, limit)

    def latest(self, rank: int, direction: str, t: float, duration: float, lower: float) -> float | None:
        """The last valid start <= t (and >= lower) at which the copy fits on all its resources
        (written out like ``earliest``)."""
        return self._ways[(rank, direction)].latest(t, duration, lower)

    def reserve(self, rank: int, direction: str, t: float, duration: float) -> None:
        self._ways[(rank, direction)].reserve(t, duration)

    def release(self, rank: int, direction: str, t: float, duration: float) -> None:
        self._ways[(rank, direction)].release(t, duration)

    def place(self, rank: int, x: Activation) -> Placed | None:
        """Reserve D2H (earliest) then H2D (latest) for ``x``; None if they do not fit."""
        out, back, points = self._rank[rank]
        d2h = out.earliest(x.f_end, x.d2h, x.deadline - x.h2d - x.d2h)
        if d2h is None:
            return None
        out.reserve(d2h, x.d2h)
        h2d = back.latest(x.deadline - x.h2d, x.h2d, d2h + x.d2h)
        if h2d is None:
            out.release(d2h, x.d2h)
            return None
        back.reserve(h2d, x.h2d)
        return _placed(points, x, d2h, h2d)

    def unplace(self, rank: int, p: Placed) -> None:
        self.release(rank, "d2h", p.d2h_start, p.activation.d2h)
        self.release(rank, "h2d", p.h2d_start, p.activation.h2d)

    def pack(self, chosen: list[tuple[int, Activation]]) -> tuple[list[tuple[int, Placed]], list[tuple[int, Activation]]]:
        """Place a whole set in time order: reloads latest-deadline first, each as late as it can
        go; then offloads in order of their forwards, each as early as it can go before its reload.

        Packing in time order leaves no gaps too short for a copy (the greedy by value can), so a
        set is hidden whenever any placement of it is. Returns (placed, not placed), and sets ``settled``.
        """
        ways = self._rank
        reloads: list[float | None] = [None] * len(chosen)  # by position in ``chosen``
        failed = []
        released: list[tuple[int, int]] = []  # (position in ``chosen``, offloads placed before its release)
        # by deadline, latest first (ties: rank, stage, microbatch, window; then the given order)
        by_deadline = sorted([(-x.deadline, rank, x.stage, x.microbatch, x.window, k)
                              for k, (rank, x) in enumerate(chosen)])
        for entry in by_deadline:
            k = entry[-1]
            rank, x = chosen[k]
            back = ways[rank][1]
            h2d = back.latest(x.deadline - x.h2d, x.h2d, x.f_end + x.d2h)
            if h2d is None:
                failed.append((rank, x))
                continue
            back.reserve(h2d, x.h2d)
            reloads[k] = h2d
        placed: list[tuple[int, Placed]] = []
        # Offloads come in order of their forwards, so while copies are only added, an offload of the
        # same rank and duration cannot start before the previous one did: no start earlier than that
        # was valid for the previous search, and adding copies makes none valid (the start points are
        # grid points and engine ends, and a new copy's end lies after its start). A release frees
        # room, so it forgets these. In relaxed mode a link end is a start point too: no such hint.
        resume: dict[tuple[int, float], float] = {}
        # by forward end (ties: rank, stage, microbatch, window; then the given order)
        for entry in sorted([(x.f_end, rank, x.stage, x.microbatch, x.window, k) for k, (rank, x) in enumerate(chosen)]):
            k = entry[-1]
            h2d = reloads[k]
            if h2d is None:
                continue
            rank, x = chosen[k]
            out, back, points = ways[rank]
            after = resume.get((rank, x.d2h), x.f_end)
            d2h = out.earliest(after if after > x.f_end else x.f_end, x.d2h, h2d - x.d2h)
            p = None if d2h is None else _placed(points, x, d2h, h2d)
            if p is None or p.hi <= p.lo:
                back.release(h2d, x.h2d)
                failed.append((rank, x))
                released.append((k, len(placed)))
                resume.clear()
                continue
            out.reserve(p.d2h_start, x.d2h)
            if not self.relaxed:
                resume[(rank, x.d2h)] = p.d2h_start
            placed.append((rank, p))
        self.settled = not failed or (self._own_links and self._unaffected(chosen, by_deadline, reloads, placed,
                                                                           released))
        return placed, failed

    def _unaffected(self, chosen: list[tuple[int, Activation]], by_deadline: list[tuple], reloads: list[float | None],
                    placed: list[tuple[int, Placed]], released: list[tuple[int, int]]) -> bool:
        """Whether ``pack`` of ``chosen`` without its failures would place every other copy where this one
        did (own host links). A failed reload booked nothing; an offload that failed released its reload,
        which the reload searches after it (and, on one engine, the offload searches before the release)
        saw. A search finds the first (offload) or last (reload) valid start from its query. An interval
        that ends more than ``margin`` before the lower of the query and the start found, or starts more
        than ``margin`` after the higher plus the copy's duration, never set the search's cursor nor
        blocked a step (nor ended a narrow-gap scan: a gap that wide is no narrow one), so without it
        the search finds the same start; where that holds for every search that saw a released
        interval, the next packing makes the same searches on the same lanes (``pack``'s resume hint
        changes no start)."""
        if not released:
            return True
        gone = {k for k, _ in released}
        where = {entry[-1]: n for n, entry in enumerate(by_deadline)}
        margin = 8 * EPS + 64 * math.ulp(-by_deadline[0][0])  # beyond the EPS tolerances (and the narrow scan's)
        for k, before in released:
            rank, x = chosen[k]
            start = reloads[k]
            assert start is not None
            end = start + x.h2d
            for entry in by_deadline[where[k] + 1:]:  # the reloads booked after it that stay
                j = entry[-1]
                h2d = reloads[j]
                if chosen[j][0] != rank or h2d is None or j in gone:
                    continue
                y = chosen[j][1]
                if not (start > y.deadline - y.h2d + y.h2d + margin or end < h2d - margin):
                    return False
            if self._one_engine:  # the offloads placed while it was booked
                for r, p in placed[:before]:
                    y = p.activation
                    if r == rank and not (start > p.d2h_start + y.d2h + margin or end < y.f_end - margin):
                        return False
        return True


def _placed(points: list[float], x: Activation, d2h: float, h2d: float) -> Placed:
    """``x`` placed at these starts, with the range of grid ``points`` it is off the device
    (``RankTimeline.off_range``, written out)."""
    lo = bisect_left(points, d2h + x.d2h - EPS)
    hi = bisect_right(points, h2d + EPS) - 1
    return Placed(x, d2h, h2d, lo, hi)
