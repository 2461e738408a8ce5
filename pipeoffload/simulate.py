"""Discrete-event simulation of a schedule: timeline, bubbles, memory over time, copy-lane stalls.

Model (see docs/decisions.md):
- Each rank has a compute lane that runs its list in order. F/B/I/W/R take their cost-model time.
  SEND is posted without blocking (the data arrives ``p2p_time`` later); RECV blocks the lane until
  the data has arrived. A compute-only schedule is simulated with implicit transfers of ``p2p_time``.
- OFFLOAD and RELOAD are *issued* at their list position and run on the rank's copy lane, FIFO. One
  copy engine serves both directions unless ``shared_copy_engine`` is off; with ``shared_host_link``
  ranks 2p and 2p+1 share one host link per direction, so their same-direction copies never overlap.
- Memory (activation units): F allocates at its start; B frees all at its end; I frees the part W
  does not need, W the rest; R re-allocates at its start; OFFLOAD frees the device copy when the copy
  completes; RELOAD allocates when it starts and its backward waits for it to complete. At equal
  times frees are applied before allocations.
"""
from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field

from pipeoffload._perf import gc_paused
from pipeoffload.costs import CostModel
from pipeoffload.errors import ScheduleError
from pipeoffload.ir import COPY_KINDS, Action, ActionKind, Schedule

K = ActionKind
_EPS = 1e-12
_STALL_TOL = 1e-9  # relative: a reload later than its backward by float noise only is not a stall
_COMPUTE, _SEND, _RECV, _COPY = "compute", "send", "recv", "copy"  # roles of a step on the compute lane


class DeadlockError(ScheduleError):
    """No rank can make progress; the message lists what every stuck rank waits for."""


@dataclass(frozen=True)
class RankResult:
    rank: int
    busy: float
    bubble_ratio: float
    peak_activation_units: float
    peak_rank_units: float
    peak_host_units: float
    stall: float
    memory: tuple[tuple[float, float], ...]  # (time, resident units) after each change
    host_memory: tuple[tuple[float, float], ...]

    def as_dict(self, activation_bytes: float | None = None) -> dict:
        out = {
            "rank": self.rank,
            "busy": self.busy,
            "bubble_ratio": self.bubble_ratio,
            "peak_activation_units": self.peak_activation_units,
            "peak_rank_units": self.peak_rank_units,
            "peak_host_units": self.peak_host_units,
            "stall": self.stall,
        }
        if activation_bytes is not None:
            out["peak_activation_bytes"] = self.peak_activation_units * activation_bytes
            out["peak_host_bytes"] = self.peak_host_units * activation_bytes
        return out


@dataclass(frozen=True)
class Timeline:
    """Result of ``simulate``: when every action ran, and what that did to time and memory."""

    schedule: Schedule
    costs: CostModel
    start: tuple[tuple[float, ...], ...]  # per rank, aligned with schedule.actions[rank]
    end: tuple[tuple[float, ...], ...]
    makespan: float
    per_rank: tuple[RankResult, ...]
    stalls: dict = field(default_factory=dict)  # Action -> seconds the compute lane waited for its RELOAD

    @property
    def bubble_ratio(self) -> float:
        busy = sum(r.busy for r in self.per_rank)
        return 1.0 - busy / (len(self.per_rank) * self.makespan) if self.makespan > 0 else 0.0

    @property
    def peak_activation_units(self) -> float:
        return max(r.peak_activation_units for r in self.per_rank)

    @property
    def peak_rank_units(self) -> float:
        return max(r.peak_rank_units for r in self.per_rank)

    @property
    def peak_host_units(self) -> float:
        return max(r.peak_host_units for r in self.per_rank)

    @property
    def stall(self) -> float:
        return sum(r.stall for r in self.per_rank)

    def events(self, rank: int):  # type: ignore[no-untyped-def]
        """(action, start, end) for one rank in list order."""
        return zip(self.schedule.actions[rank], self.start[rank], self.end[rank])

    def as_dict(self) -> dict:
        s = self.schedule
        out = {
            "schedule": s.name,
            "ranks": s.num_ranks,
            "microbatches": s.num_microbatches,
            "stages_per_rank": s.stages_per_rank,
            "placement": s.placement.kind,
            "makespan": self.makespan,
            "bubble_ratio": self.bubble_ratio,
            "peak_activation_units": self.peak_activation_units,
            "peak_rank_units": self.peak_rank_units,
            "peak_host_units": self.peak_host_units,
            "stall": self.stall,
            "offloaded": sum(1 for r in s.actions for a in r if a.kind == K.OFFLOAD),
            "recomputed": sum(1 for r in s.actions for a in r if a.kind == K.R),
            "actions": s.num_actions(),
            "per_rank": [r.as_dict(self.costs.activation_bytes) for r in self.per_rank],
        }
        if self.costs.activation_bytes is not None:
            out["peak_activation_bytes"] = self.peak_activation_units * self.costs.activation_bytes
        return out


class _Link:
    """Busy intervals of one exclusive resource; a copy takes the earliest gap that fits."""

    __slots__ = ("starts", "ends")

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []

    def reserve(self, ready: float, duration: float) -> float:
        i = bisect.bisect_right(self.ends, ready)
        t = ready
        while i < len(self.starts):
            if t + duration <= self.starts[i] + _EPS:
                break
            t = max(t, self.ends[i])
            i += 1
        self.starts.insert(i, t)
        self.ends.insert(i, t + duration)
        return t


def simulate(schedule: Schedule, costs: CostModel | None = None) -> Timeline:
    """Simulate ``schedule`` under ``costs`` (uniform unit costs when omitted)."""
    with gc_paused():
        return _Simulation(schedule, costs or CostModel()).run()


class _Simulation:
    def __init__(self, schedule: Schedule, costs: CostModel) -> None:
        costs.check_stages(schedule.num_stages)
        self.schedule = schedule
        self.costs = costs
        self.placement = schedule.placement
        self.lowered = schedule.is_lowered()
        self.last_stage = schedule.num_stages - 1
        n = schedule.num_ranks
        self.pos = [0] * n
        self.clock = [0.0] * n
        self.start = [[0.0] * len(r) for r in schedule.actions]
        self.end = [[0.0] * len(r) for r in schedule.actions]
        self.done: dict[tuple[ActionKind, int, int], float] = {}  # completion time per action key
        self.waiters: dict[tuple[ActionKind, int, int], list[int]] = defaultdict(list)
        self.ready: list[int] = []
        self.queued: list[bool] = []
        self.mem_events: list[list[tuple[float, float]]] = [[] for _ in range(n)]
        self.host_events: list[list[tuple[float, float]]] = [[] for _ in range(n)]
        self.resident: dict[tuple[int, int], float] = {}
        self.on_host: dict[tuple[int, int], float] = {}
        self.busy = [0.0] * n
        self.stall = [0.0] * n
        self.stalls: dict[Action, float] = {}
        self._back_kind: dict[tuple[int, int], ActionKind] | None = None
        self.recomputed = {(a.stage, a.microbatch) for r in schedule.actions for a in r if a.kind == K.R}
        self.engine_free: dict[tuple[int, str], float] = defaultdict(float)
        self.links: dict[tuple[int, str], _Link] = defaultdict(_Link)

    # ---- dependencies, resolved once per action ----------------------------------------------
    def _backward_kind(self, stage: int, mb: int) -> ActionKind:
        """B or I: which backward (stage, mb) runs; only needed where no RECV_B stands for it."""
        if self._back_kind is None:
            self._back_kind = {
                (a.stage, a.microbatch): a.kind for r in self.schedule.actions for a in r if a.kind in (K.B, K.I)
            }
        return self._back_kind.get((stage, mb), K.B)

    def _deps(self, a: Action, rank: int) -> tuple[tuple[tuple[ActionKind, int, int], float], ...]:
        """(key, delay) pairs: ``a`` may start once every key has completed, plus its delay."""
        s, mb, kind = a.stage, a.microbatch, a.kind
        if kind is K.W:
            return (((K.I, s, mb), 0.0),)
        if kind == K.R:
            return (((K.F, s, mb), 0.0),)
        if kind == K.F:
            if s == 0:
                return ()
            return (self._neighbour((K.F, s - 1, mb), (K.RECV_F, s, mb), rank),)
        # B or I: its own forward, and the output gradient unless this is the last stage
        own = ((K.F, s, mb), 0.0)
        if s == self.last_stage:
            return (own,)
        if self.lowered and self.placement.rank_of(s + 1) != rank:
            return (own, ((K.RECV_B, s, mb), 0.0))
        grad = (self._backward_kind(s + 1, mb), s + 1, mb)
        return (own, self._neighbour(grad, (K.RECV_B, s, mb), rank))

    def _neighbour(self, producer: tuple[ActionKind, int, int], recv: tuple[ActionKind, int, int],
                   rank: int) -> tuple[tuple[ActionKind, int, int], float]:
        if self.placement.rank_of(producer[1]) == rank:
            return (producer, 0.0)
        if self.lowered:
            return (recv, 0.0)
        return (producer, self.costs.p2p_time)  # compute-only schedule: implicit transfer

    def _compile(self, rank: int) -> list[tuple]:  # type: ignore[type-arg]
        """Resolve each step's dependencies and duration once, so the event loop only looks up times."""
        ops: list[tuple] = []  # type: ignore[type-arg]
        append = ops.append
        timers = {K.F: self.costs.f, K.B: self.costs.b, K.I: self.costs.i, K.W: self.costs.w, K.R: self.costs.r}
        duration: dict[tuple[ActionKind, int], float] = {}
        deps = self._deps
        p2p = self.costs.p2p_time
        SEND_F, SEND_B, RECV_F, RECV_B = K.SEND_F, K.SEND_B, K.RECV_F, K.RECV_B
        for a in self.schedule.actions[rank]:
            kind, stage, mb = a.kind, a.stage, a.microbatch
            key = (kind, stage, mb)
            if kind is SEND_F or kind is SEND_B:
                append((a, key, _SEND, (), 0.0, None))
            elif kind is RECV_F:
                append((a, key, _RECV, (((SEND_F, stage - 1, mb), p2p),), 0.0, None))
            elif kind is RECV_B:
                append((a, key, _RECV, (((SEND_B, stage + 1, mb), p2p),), 0.0, None))
            elif kind in COPY_KINDS:
                append((a, key, _COPY, (), 0.0, None))
            else:
                time = duration.get((kind, a.stage))
                if time is None:
                    time = duration[(kind, a.stage)] = timers[kind](a.stage)
                reload = (K.RELOAD, stage, mb) if kind is K.B or kind is K.I else None
                append((a, key, _COMPUTE, deps(a, rank), time, reload))
        return ops

    # ---- main loop ---------------------------------------------------------------------------
    def run(self) -> Timeline:
        self.ops = [self._compile(rank) for rank in range(self.schedule.num_ranks)]
        self.ready = list(range(self.schedule.num_ranks))
        self.queued = [True] * self.schedule.num_ranks
        while self.ready:
            rank = self.ready.pop()
            self.queued[rank] = False
            self._advance(rank)
        stuck = [r for r in range(self.schedule.num_ranks) if self.pos[r] < len(self.schedule.actions[r])]
        if stuck:
            self._report_deadlock(stuck)
        return self._result()

    def _wake(self, key: tuple[ActionKind, int, int]) -> None:
        for waiter in self.waiters.pop(key):
            if not self.queued[waiter]:
                self.queued[waiter] = True
                self.ready.append(waiter)

    def _advance(self, rank: int) -> None:
        """Run this rank's lane as far as dependencies allow, waking ranks that waited on it."""
        ops = self.ops[rank]
        done, waiters = self.done, self.waiters
        starts, ends = self.start[rank], self.end[rank]
        step, clock, busy = self.pos[rank], self.clock[rank], self.busy[rank]
        while step < len(ops):
            a, key, role, deps, duration, reload = ops[step]
            if role is _COPY:
                start, end = self._copy(rank, a, clock)
                starts[step], ends[step], done[key] = start, end, end
                step += 1
                if key in waiters:
                    self._wake(key)
                continue  # issuing a copy does not occupy the compute lane
            ready = clock
            blocked = None
            for dep, delay in deps:
                t = done.get(dep)
                if t is None:
                    blocked = dep
                    break
                if t + delay > ready:
                    ready = t + delay
            if blocked is not None:
                waiters[blocked].append(rank)
                break
            if role is _COMPUTE:
                start = ready
                if reload is not None:
                    reload_end = done.get(reload)
                    if reload_end is not None and reload_end > start + _STALL_TOL * max(1.0, start):
                        self.stalls[a] = reload_end - start
                        self.stall[rank] += reload_end - start
                        start = reload_end
                end = start + duration
                busy += duration
                self._account(rank, a, start, end)
            else:  # a receive waits from the lane's clock until the data arrives; a send is instant
                start, end = clock, ready
            starts[step], ends[step], done[key] = start, end, end
            clock = end
            step += 1
            if key in waiters:
                self._wake(key)
        self.pos[rank], self.clock[rank], self.busy[rank] = step, clock, busy

    def _account(self, rank: int, a: Action, start: float, end: float) -> None:
        key = (a.stage, a.microbatch)
        size = self.costs.act(a.stage)
        events = self.mem_events[rank]
        if a.kind == K.F:
            amount = 0.0 if key in self.recomputed else size
            self.resident[key] = amount
            events.append((start, amount))
        elif a.kind == K.R:
            self.resident[key] = self.resident.get(key, 0.0) + size
            events.append((start, size))
        elif a.kind == K.B:
            events.append((end, -self.resident.pop(key, 0.0)))
        elif a.kind == K.I:
            keep = self.resident.get(key, 0.0) * self.costs.w_fraction_of(a.stage)
            events.append((end, keep - self.resident.get(key, 0.0)))
            self.resident[key] = keep
        elif a.kind == K.W:
            events.append((end, -self.resident.pop(key, 0.0)))

    def _copy(self, rank: int, a: Action, issue: float) -> tuple[float, float]:
        """Place one copy on the copy lane (and shared link); update device and host memory."""
        key = (a.stage, a.microbatch)
        costs = self.costs
        if a.kind == K.OFFLOAD:
            direction, per_unit = "d2h", costs.d2h_time
            amount = self.resident.get(key, 0.0)
            ready = max(issue, self.done.get((K.F, a.stage, a.microbatch), issue))
        else:
            direction, per_unit = "h2d", costs.h2d_time
            amount = self.on_host.get(key, 0.0)
            offload_end = self.done.get((K.OFFLOAD, a.stage, a.microbatch), issue)
            ready = max(issue, offload_end)
        lane = "both" if costs.shared_copy_engine else direction
        ready = max(ready, self.engine_free[(rank, lane)])
        duration = per_unit * amount
        link_owner = rank // 2 if costs.shared_host_link else rank
        start = self.links[(link_owner, direction)].reserve(ready, duration) if duration > 0 else ready
        end = start + duration
        self.engine_free[(rank, lane)] = end
        if a.kind == K.OFFLOAD:
            self.resident[key] = 0.0
            self.on_host[key] = amount
            self.mem_events[rank].append((end, -amount))
            self.host_events[rank].append((start, amount))
        else:
            self.resident[key] = self.resident.get(key, 0.0) + amount
            self.mem_events[rank].append((start, amount))
            self.host_events[rank].append((end, -self.on_host.pop(key, 0.0)))
        return start, end

    # ---- results -----------------------------------------------------------------------------
    def _result(self) -> Timeline:
        ends = [max(row, default=0.0) for row in self.end]
        makespan = max(ends, default=0.0)
        per_rank = []
        v = max(self.schedule.stages_per_rank, 1)
        for rank in range(self.schedule.num_ranks):
            memory, peak = _curve(self.mem_events[rank])
            host, host_peak = _curve(self.host_events[rank])
            busy = self.busy[rank]
            per_rank.append(
                RankResult(
                    rank=rank,
                    busy=busy,
                    bubble_ratio=1.0 - busy / makespan if makespan > 0 else 0.0,
                    peak_activation_units=peak,
                    peak_rank_units=peak / v,
                    peak_host_units=host_peak,
                    stall=self.stall[rank],
                    memory=memory,
                    host_memory=host,
                )
            )
        return Timeline(
            self.schedule, self.costs, tuple(map(tuple, self.start)), tuple(map(tuple, self.end)),
            makespan, tuple(per_rank), dict(self.stalls),
        )

    def _report_deadlock(self, stuck: list[int]) -> None:
        lines = []
        for rank in stuck:
            a = self.schedule.actions[rank][self.pos[rank]]
            waits = [str(Action(*k)) for k, ranks in self.waiters.items() if rank in ranks]
            owner = ""
            for k in waits:
                other = self.placement.rank_of(Action.parse(k).stage)
                if other != rank:
                    owner = f" (rank {other} never reaches it)"
            lines.append(f"rank {rank} step {self.pos[rank]} {a} waits for {', '.join(waits) or '?'}{owner}")
        first = stuck[0]
        raise DeadlockError("deadlock: " + "; ".join(lines), first, self.pos[first],
                            self.schedule.actions[first][self.pos[first]], self.schedule.actions)


def _curve(events: list[tuple[float, float]]) -> tuple[tuple[tuple[float, float], ...], float]:
    """Cumulative memory after each event, frees before allocations at equal times; and its peak."""
    level, peak = 0.0, 0.0
    curve = []
    for t, delta in sorted(events):
        level += delta
        if abs(level) < 1e-9:
            level = 0.0
        peak = max(peak, level)
        curve.append((t, level))
    return tuple(curve), peak
