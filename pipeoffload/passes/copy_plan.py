"""Building blocks of the offload placement pass: one rank's timeline, copy lanes, memory curve.

The pass plans copies against the compute timeline of the schedule without copies. A copy is an
action in the rank's list, so it is *issued* at the end of the compute action before it (a "grid
point") and starts when its copy engine (FIFO, as in the simulator) is free. A planned start is
therefore reproduced exactly by the simulator only if it is a grid point or the end of the copy
before it on the same engine; the searches return only such starts ("exact" mode), so the
simulator sees the planned times. On a shared host link, "relaxed" mode also allows a start at the
end of the partner rank's copy: denser, but which of two such copies goes first then depends on the
simulator's processing order, so relaxed plans are checked by simulation (see ``offload``).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

from pipeoffload import semantics as sem
from pipeoffload.costs import CostModel
from pipeoffload.intervals import EPS, Intervals
from pipeoffload.ir import Action, ActionKind

K = ActionKind
_F, _B, _I, _W, _R = sem.F, sem.B, sem.I, sem.W, sem.R


Lane = Intervals  # a copy engine or a shared host link


@dataclass(slots=True)
class Activation:
    """One (stage, microbatch) activation on its rank, with the times the pass plans around."""

    stage: int
    microbatch: int
    size: float
    f_end: float  # the earliest a device->host copy can start
    deadline: float  # start of its backward (I or B): the reload must be complete by then
    back_index: int  # list position of that backward
    d2h: float
    h2d: float
    value: float = field(init=False)  # memory-time an offload can save: size x the time it could be away

    def __post_init__(self) -> None:
        self.value = self.size * max(0.0, self.deadline - self.f_end - self.d2h - self.h2d)

    @property
    def lifespan(self) -> float:
        return self.deadline - self.f_end


class RankTimeline:
    """One rank's compute actions with their simulated times, grid points and baseline memory."""

    def __init__(self, rank: int, actions: tuple[Action, ...], starts: tuple[float, ...],
                 ends: tuple[float, ...], costs: CostModel, recomputed: set[tuple[int, int]]) -> None:
        self.rank = rank
        self.actions = actions
        self.clocks = [0.0, *ends]  # clocks[p]: issue time of a copy placed before action p
        self.point_list = sorted({0.0, *starts, *ends})
        self.points = np.array(self.point_list)
        self.activations: dict[tuple[int, int], Activation] = {}
        self.memory = self._baseline(actions, starts, ends, costs, recomputed)

    def _baseline(self, actions, starts, ends, costs, recomputed):  # type: ignore[no-untyped-def]
        """Resident activation units at each point (frees before allocations at equal times), and the
        activations the pass may move: each backward (B or I) of an activation not recomputed whose F
        came earlier on the rank."""
        n = len(actions)
        points = self.points
        if not n:
            self.activations = {}
            return np.zeros(len(points))
        kind = np.fromiter((sem.CODE[a.kind] for a in actions), dtype=np.int64, count=n)
        stage = np.fromiter((a.stage for a in actions), dtype=np.int64, count=n)
        start, end = np.asarray(starts, dtype=float), np.asarray(ends, dtype=float)
        num_stages = int(stage.max()) + 1
        sizes = [(costs.act(s), costs.d2h(s), costs.h2d(s)) for s in range(num_stages)]
        size = np.array([x[0] for x in sizes])[stage]
        keep = costs.w_fraction
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
        F, B, I = K.F, K.B, K.I  # noqa: E741
        for p in np.flatnonzero((kind == _F) | (kind == _B) | (kind == _I)).tolist():
            a = actions[p]
            key = (a.stage, a.microbatch)
            if a.kind is F:
                f_end[key] = ends[p]
            elif (a.kind is B or a.kind is I) and key not in recomputed and key in f_end:
                x = sizes[a.stage]
                found[key] = Activation(a.stage, a.microbatch, x[0], f_end[key], starts[p], p, x[1], x[2])
        self.activations = found
        return memory

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
        return p if limit is None else min(p, limit)


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


class CopyGroup:
    """Ranks planned together because they share copy resources (one rank, or a host-link pair)."""

    def __init__(self, timelines: list[RankTimeline], costs: CostModel, relaxed: bool = False) -> None:
        self.timelines = {tl.rank: tl for tl in timelines}
        self.relaxed = relaxed and costs.shared_host_link
        links = {"d2h": Lane(), "h2d": Lane()}
        self._engine: dict[tuple[int, str], Lane] = {}
        self._lanes: dict[tuple[int, str], list[Lane]] = {}
        for rank in self.timelines:
            shared = Lane()
            for direction in ("d2h", "h2d"):
                engine = shared if costs.shared_copy_engine else Lane()
                self._engine[(rank, direction)] = engine
                self._lanes[(rank, direction)] = [engine, links[direction]] if costs.shared_host_link else [engine]

    def lanes(self, rank: int, direction: str) -> list[Lane]:
        """Every resource such a copy occupies: its engine first, then the pair's link when shared."""
        return self._lanes[(rank, direction)]

    def _next_start(self, rank: int, direction: str, t: float) -> float | None:
        """The first start at or after ``t`` the simulator reproduces: a grid point or the end of a
        copy on the engine (or, relaxed, on the shared link)."""
        lanes = self.lanes(rank, direction)
        return _next_start(self.timelines[rank].clocks, lanes[0].ends, lanes[1].ends if self.relaxed else None, t)

    def _prev_start(self, rank: int, direction: str, t: float) -> float | None:
        lanes = self.lanes(rank, direction)
        return _prev_start(self.timelines[rank].clocks, lanes[0].ends, lanes[1].ends if self.relaxed else None, t)

    def earliest(self, rank: int, direction: str, t: float, duration: float, limit: float) -> float | None:
        """The first valid start >= t (and <= limit) at which the copy fits on all its resources.

        The inner loop of the pass (a search per copy over the free gaps): written with locals.
        """
        lanes = self.lanes(rank, direction)
        clocks, engine = self.timelines[rank].clocks, lanes[0].ends
        link = lanes[1].ends if self.relaxed else None
        bound = limit + EPS
        cursor = _next_start(clocks, engine, link, t)
        while cursor is not None and cursor <= bound:
            blocked = None  # the latest end among the intervals the copy would overlap
            reach = cursor + duration - EPS if duration > 0 else cursor - EPS
            for lane in lanes:
                ends = lane.ends
                i = bisect.bisect_right(ends, cursor + EPS)
                if i < len(ends) and lane.starts[i] < reach and (blocked is None or ends[i] > blocked):
                    blocked = ends[i]
            if blocked is None:
                return cursor
            cursor = _next_start(clocks, engine, link, blocked)
        return None

    def latest(self, rank: int, direction: str, t: float, duration: float, lower: float) -> float | None:
        """The last valid start <= t (and >= lower) at which the copy fits on all its resources."""
        lanes = self.lanes(rank, direction)
        clocks, engine = self.timelines[rank].clocks, lanes[0].ends
        link = lanes[1].ends if self.relaxed else None
        bound = lower - EPS
        cursor = _prev_start(clocks, engine, link, t)
        while cursor is not None and cursor >= bound:
            blocked = None  # the earliest start among the intervals the copy would overlap
            reach = cursor + duration - EPS if duration > 0 else cursor - EPS
            for lane in lanes:
                ends = lane.ends
                i = bisect.bisect_right(ends, cursor + EPS)
                if i < len(ends):
                    start = lane.starts[i]
                    if start < reach and (blocked is None or start < blocked):
                        blocked = start
            if blocked is None:
                return cursor
            cursor = _prev_start(clocks, engine, link, blocked - duration)
        return None

    def reserve(self, rank: int, direction: str, t: float, duration: float) -> None:
        for lane in self.lanes(rank, direction):
            lane.add(t, duration)

    def release(self, rank: int, direction: str, t: float, duration: float) -> None:
        for lane in self.lanes(rank, direction):
            lane.remove(t, duration)

    def place(self, rank: int, x: Activation) -> Placed | None:
        """Reserve D2H (earliest) then H2D (latest) for ``x``; None if they do not fit."""
        d2h = self.earliest(rank, "d2h", x.f_end, x.d2h, x.deadline - x.h2d - x.d2h)
        if d2h is None:
            return None
        self.reserve(rank, "d2h", d2h, x.d2h)
        h2d = self.latest(rank, "h2d", x.deadline - x.h2d, x.h2d, d2h + x.d2h)
        if h2d is None:
            self.release(rank, "d2h", d2h, x.d2h)
            return None
        self.reserve(rank, "h2d", h2d, x.h2d)
        return self._placed(rank, x, d2h, h2d)

    def unplace(self, rank: int, p: Placed) -> None:
        self.release(rank, "d2h", p.d2h_start, p.activation.d2h)
        self.release(rank, "h2d", p.h2d_start, p.activation.h2d)

    def _placed(self, rank: int, x: Activation, d2h: float, h2d: float) -> Placed:
        lo, hi = self.timelines[rank].off_range(d2h + x.d2h, h2d)
        return Placed(x, d2h, h2d, lo, hi)

    def pack(self, chosen: list[tuple[int, Activation]]) -> tuple[list[tuple[int, Placed]], list[tuple[int, Activation]]]:
        """Place a whole set in time order: reloads latest-deadline first, each as late as it can
        go; then offloads in order of their forwards, each as early as it can go before its reload.

        Packing in time order leaves no gaps too short for a copy (the greedy by value can), so a
        set is hidden whenever any placement of it is. Returns (placed, not placed).
        """
        reloads: dict[tuple[int, int, int], float] = {}
        failed = []
        for rank, x in sorted(chosen, key=lambda rx: (-rx[1].deadline, rx[0], rx[1].stage, rx[1].microbatch)):
            h2d = self.latest(rank, "h2d", x.deadline - x.h2d, x.h2d, x.f_end + x.d2h)
            if h2d is None:
                failed.append((rank, x))
                continue
            self.reserve(rank, "h2d", h2d, x.h2d)
            reloads[(rank, x.stage, x.microbatch)] = h2d
        placed = []
        for rank, x in sorted(chosen, key=lambda rx: (rx[1].f_end, rx[0], rx[1].stage, rx[1].microbatch)):
            h2d = reloads.get((rank, x.stage, x.microbatch))
            if h2d is None:
                continue
            d2h = self.earliest(rank, "d2h", x.f_end, x.d2h, h2d - x.d2h)
            p = None if d2h is None else self._placed(rank, x, d2h, h2d)
            if p is None or p.hi <= p.lo:
                self.release(rank, "h2d", h2d, x.h2d)
                failed.append((rank, x))
                continue
            assert d2h is not None
            self.reserve(rank, "d2h", d2h, x.d2h)
            placed.append((rank, p))
        return placed, failed


def _next_start(clocks: list[float], engine: list[float], link: list[float] | None, t: float) -> float | None:
    """min(first grid point >= t, first engine end >= t[, first link end >= t]), within EPS."""
    best = None
    p = bisect.bisect_left(clocks, t - EPS)
    if p < len(clocks):
        best = clocks[p]
    i = bisect.bisect_left(engine, t - EPS)
    if i < len(engine) and (best is None or engine[i] < best):
        best = engine[i]
    if link is not None:
        i = bisect.bisect_left(link, t - EPS)
        if i < len(link) and (best is None or link[i] < best):
            best = link[i]
    return best


def _prev_start(clocks: list[float], engine: list[float], link: list[float] | None, t: float) -> float | None:
    """max(last grid point <= t, last engine end <= t[, last link end <= t]), within EPS."""
    best = None
    p = bisect.bisect_right(clocks, t + EPS) - 1
    if p >= 0:
        best = clocks[p]
    i = bisect.bisect_right(engine, t + EPS)
    if i and (best is None or engine[i - 1] > best):
        best = engine[i - 1]
    if link is not None:
        i = bisect.bisect_right(link, t + EPS)
        if i and (best is None or link[i - 1] > best):
            best = link[i - 1]
    return best
