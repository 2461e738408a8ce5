"""Discrete-event simulation of a schedule: timeline, bubbles, memory over time, copy-lane stalls.

Model (see docs/decisions.md):
- Each rank has a compute lane that runs its list in order. F/B/I/W/R take their cost-model time.
  SEND is posted without blocking (the data arrives ``p2p_time`` later); RECV blocks the lane until
  the data has arrived. A compute-only schedule is simulated with implicit transfers of ``p2p_time``.
  With ``message_time`` (the runtime's own cost per message, default 0) a SEND holds its lane for
  that long before the data leaves, and a RECV holds it that long after the data has arrived; a
  compute-only schedule's implicit transfers then take ``p2p_time + 2 * message_time``.
- OFFLOAD and RELOAD (and the second window's OFFLOAD_W after I, RELOAD_W before W) are *issued* at
  their list position and run on the rank's copy lane, FIFO. One
  copy engine serves both directions unless ``shared_copy_engine`` is off; with ``shared_host_link``
  ranks 2p and 2p+1 share one host link per direction, so their same-direction copies never overlap.
  A copy reaches its link when it is issued, its input is ready and its engine is free; a link serves
  copies in the order they reach it (ties: lower rank, then earlier in the list), each starting when
  the one before has ended: a copy never overtakes one that reached the link earlier.
- Memory (activation units): F allocates at its start; B frees all at its end; I frees the part W
  does not need, W the rest; R re-allocates at its start; OFFLOAD frees the device copy when the copy
  completes; RELOAD allocates when it starts and its backward (W: its RELOAD_W) waits for it to complete. At equal
  times frees are applied before allocations, except where copies take no time (the runtime on CPU,
  and what ``train`` measures against): a rank then does one thing after another in list order, and a
  RELOAD listed before an OFFLOAD at one instant holds its memory while the offloaded one is still there.
- With ``cores`` (CPU ranks sharing a host's cores; default None: a processor per rank) the timeline
  runs in global time order as processor sharing: the n runnable lanes (computing, or in a message's
  ``message_time``) and ranks' transports (``message_cpu`` per SEND/RECV) each progress at
  min(1, cores / (n + other_load)) of their speed (``other_load``: other processes' runnable threads);
  a rank waiting for data loads no core. No offload copies then.
- WAIT holds the compute lane, like a receive, from the lane's clock until its OFFLOAD's copy has
  completed (zero duration, no memory effect); the time it holds is idle time, not a stall.
"""
from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeoffload import semantics as sem
from pipeoffload._perf import gc_paused
from pipeoffload.costs import CostModel, require_costs
from pipeoffload.errors import ScheduleError
from pipeoffload.ir import Action, ActionKind, Schedule, require_schedule
from pipeoffload.readonly import ReadOnlyDict
from pipeoffload.semantics import coded

K = ActionKind
_STALL_TOL = 1e-9  # relative: a reload later than its backward by float noise only is not a stall
_COMPUTE, _SEND, _COPY = sem.COMPUTE, sem.SEND, sem.COPY
_LIST_KEYS = 1 << 24  # key spaces up to this size index a list; larger ones a dict


class _Pending(dict):  # type: ignore[type-arg]
    """Completion times by key for key spaces too large for a list: a key not done yet reads None."""

    def __missing__(self, key: int) -> None:
        return None


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

    def as_dict(self, activation_bytes: float | None = None) -> dict[str, Any]:
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


class Stalls(ReadOnlyDict[Action, float]):
    """``Timeline.stalls``: a read-only dict (Action -> seconds) that pickles, so a frozen timeline stays
    unchanged; it compares equal to a dict with the same items."""

    __slots__ = ()


@dataclass(frozen=True)
class Timeline:
    """Result of ``simulate``: when every action ran, and what that did to time and memory."""

    schedule: Schedule
    costs: CostModel
    start: tuple[tuple[float, ...], ...]  # per rank, aligned with schedule.actions[rank]
    end: tuple[tuple[float, ...], ...]
    makespan: float
    per_rank: tuple[RankResult, ...]
    # Action -> seconds the compute lane waited for its RELOAD, read-only (``Stalls``); left out of the hash,
    # so a timeline hashes by its schedule, costs and times (equal timelines still compare their stalls too)
    stalls: Mapping[Action, float] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.stalls, Stalls):  # a dict given here stays the caller's; the timeline keeps a copy
            object.__setattr__(self, "stalls", Stalls(self.stalls))

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
    def peak_host_rank_units(self) -> float:
        """``peak_host_units`` (activation units) in rank units, the unit of ``peak_rank_units``."""
        return self.peak_host_units / max(self.schedule.stages_per_rank, 1)

    @property
    def stall(self) -> float:
        """Time compute lanes waited for reloads, summed over ranks (not the step's lengthening)."""
        return sum(r.stall for r in self.per_rank)

    @property
    def max_rank_stall(self) -> float:
        """The stall of the rank that waited longest for its reloads."""
        return max((r.stall for r in self.per_rank), default=0.0)

    def __repr__(self) -> str:
        """The headline figures: the generated repr listed every action's schedule entry, start and end
        (188 KB for zb-v d = 8, m = 32 with offload, all of a notebook's output)."""
        s = self.schedule
        return (f"Timeline(schedule={s.name!r}, ranks={s.num_ranks}, microbatches={s.num_microbatches}, "
                f"stages_per_rank={s.stages_per_rank}, actions={s.num_actions()}, makespan={self.makespan:g}, "
                f"bubble_ratio={self.bubble_ratio:.4g}, peak_rank_units={self.peak_rank_units:g}, "
                f"peak_host_units={self.peak_host_units:g}, stall={self.stall:g})")

    def events(self, rank: int) -> Iterator[tuple[Action, float, float]]:
        """(action, start, end) for one rank in list order."""
        return zip(self.schedule.actions[rank], self.start[rank], self.end[rank])

    def as_dict(self) -> dict[str, Any]:
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
            "stall": self.stall,  # summed over ranks: kept under this name for compatibility
            "stall_summed_over_ranks": self.stall,
            "stall_max_over_ranks": self.max_rank_stall,
            "offloaded": sum(1 for r in s.actions for a in r if a.kind == K.OFFLOAD),
            "offloaded_after_i": sum(1 for r in s.actions for a in r if a.kind == K.OFFLOAD_W),
            "recomputed": sum(1 for r in s.actions for a in r if a.kind == K.R),
            "actions": s.num_actions(),
            "per_rank": [r.as_dict(self.costs.activation_bytes) for r in self.per_rank],
        }
        if self.costs.activation_bytes is not None:
            out["peak_activation_bytes"] = self.peak_activation_units * self.costs.activation_bytes
        return out


def simulate(schedule: Schedule, costs: CostModel | None = None) -> Timeline:
    """Simulate ``schedule`` under ``costs`` (uniform unit costs when omitted).

    It expects a valid schedule (``validate``; ``lower`` validates what it returns) and does not
    validate it: it refuses a forward without its backward (``ScheduleError``) and a deadlock, and times
    whatever else it is given."""
    require_schedule(schedule, "simulate")
    require_costs(costs, "simulate")
    with gc_paused():
        simulation = _Simulation(schedule, costs or CostModel())
        simulation.run()
        return simulation.timeline()


@dataclass(frozen=True)
class Figures:
    """The per-rank figures of a simulation, without per-action times or memory curves."""

    makespan: float
    busy: tuple[float, ...]
    peak_activation_units: tuple[float, ...]
    peak_host_units: tuple[float, ...]
    stall: tuple[float, ...]


def simulate_figures(schedule: Schedule, costs: CostModel | None = None) -> Figures:
    """What ``simulate`` reports per rank, equal to its figures (``figures_of``), for searches that need
    no timeline."""
    require_schedule(schedule, "simulate_figures")
    require_costs(costs, "simulate_figures")
    with gc_paused():
        simulation = _Simulation(schedule, costs or CostModel())
        simulation.run()
        return simulation.figures()


def figures_of(timeline: Timeline) -> Figures:
    """The per-rank figures of a timeline (equal to what ``simulate_figures`` computes)."""
    ranks = timeline.per_rank
    return Figures(timeline.makespan, tuple(r.busy for r in ranks), tuple(r.peak_activation_units for r in ranks),
                   tuple(r.peak_host_units for r in ranks), tuple(r.stall for r in ranks))


class _Simulation:
    """The event loop over the integer-coded schedule (``semantics.CodedSchedule``).

    Each rank's lane runs as far as its inputs allow; a rank that waits is parked on the key it waits
    for and woken when that action completes. Memory amounts are known before timing
    (``semantics.memory_amounts``), so the loop only computes times.
    """

    def __init__(self, schedule: Schedule, costs: CostModel) -> None:
        costs.check_stages(schedule.num_stages)
        self.schedule = schedule
        self.costs = costs
        self.c = c = coded(schedule)
        if (missing := c.forward_without_backward) is not None:  # simulate expects a valid schedule
            raise ScheduleError(f"stage {missing[0]}, microbatch {missing[1]} has an F but no B (or I and W); "
                                "simulate expects a valid schedule: validate(schedule) names every violation")
        self.inputs = c.inputs(costs.p2p_time if c.lowered else costs.p2p_time + 2 * costs.message_time)
        self.duration = sem.durations(costs, c.num_stages)[c.kind, c.stage]
        self.amount = sem.memory_amounts(c, costs)  # an array: no float object per action
        self.host_amount = sem.host_effects(c, costs, self.amount)
        n = schedule.num_ranks
        total = len(c.kind)
        self.offsets = c.offsets.tolist()
        self.pos = self.offsets[:-1]
        self.clock = [0.0] * n
        self.start = [0.0] * total
        self.end = [0.0] * total
        self.waiters: dict[int, list[int]] = {}  # key -> ranks parked on it
        self.busy = [0.0] * n
        self.stall = [0.0] * n
        self.stalled: list[tuple[int, float]] = []  # (flat index, seconds) of backwards that waited
        self.copies, self.num_links = self._copy_resources()  # (engine, link, duration) per action
        # device memory at equal times: frees first, or list order where copies are instant (module docstring)
        self._frees_first = costs.d2h_time > 0 or costs.h2d_time > 0

    # ---- main loop ---------------------------------------------------------------------------
    def run(self) -> None:
        """Run each rank's lane as far as its inputs allow; a rank that waits is parked on the key it
        waits for and queued again (LIFO) when that action completes."""
        if self.costs.cores is not None:
            self._loop_cores(self.costs.cores)  # processor sharing: a timeline in global time order
        else:
            self._loop()
        n = self.schedule.num_ranks
        stuck = [r for r in range(n) if self.pos[r] < self.offsets[r + 1]]
        if stuck:
            self._report_deadlock(stuck)

    def _columns(self) -> tuple[list[int], list[int], list[int], list[float], list[int], list[float], list[int],
                                list[float]]:
        """Per action, as Python lists the loops index: lane, key, first input, its delay, second input,
        its delay, the reload a backward waits for, compute duration. (Separate lists, not one tuple
        per action: a send reads two of them, and no 10^5 tuples are built.)"""
        c, inputs = self.c, self.inputs
        lanes = sem.LANE[c.kind]
        # without copies no reload ever completes, so no backward waits for one: -1 (no int per action)
        reloads = inputs.reload.tolist() if np.any(lanes == sem.COPY) else [-1] * len(lanes)
        return (lanes.tolist(), c.keys.tolist(), inputs.first.tolist(), _floats(inputs.first_delay),
                inputs.second.tolist(), _floats(inputs.second_delay), reloads, self.duration.tolist())

    def _done(self) -> list[float | None] | _Pending:
        """Completion time per action key, None until it completes: a list where the key space is small
        enough, else a dict that answers None for a missing key (both are read as ``done[key]``)."""
        num_keys = self.c.num_keys
        return [None] * num_keys if num_keys <= _LIST_KEYS else _Pending()

    def _loop(self) -> None:
        """The event loop, written with locals (the hottest loop of the package): a link is FIFO and
        causal; a SEND holds its lane for its ``message_time`` and a RECV for its own after the data
        has arrived. With own host links a rank's copies of one direction all pass its engine, FIFO,
        so the link never reorders them; with a shared host link the pair's copies meet on it.

        A lane does not wait for its copies. With own host links it books each at once, on its engine
        (FIFO): the copy starts when it is issued, its input is ready and its engine is free. With a
        shared host link it queues each on its engine and runs on; a backward whose reload is still
        queued parks on it. Such copies are booked only while no lane can run. Then every event still
        to come happens at or after the earliest time a queued copy can
        reach its link (a lane resumes only after a booking, or after what a resumed lane produced),
        so the copy that reaches its link first (ties: lower rank, then earlier in the list) can be
        booked: it starts when it arrives or when its link's last copy ends. Bookings therefore go in
        the order the copies reach their links; a later copy never takes a gap before an earlier one.
        """
        lanes, keys, first, first_delay, second, second_delay, reloads, durations = self._columns()
        done = self._done()
        n = self.schedule.num_ranks
        waiters, starts, ends = self.waiters, self.start, self.end
        pos, offsets, clocks, busies = self.pos, self.offsets, self.clock, self.busy
        stall, stalled = self.stall, self.stalled
        engine, link, length = (x.tolist() for x in self.copies)
        shared = self.costs.shared_host_link
        engine_free = [0.0] * (2 * n)
        link_free = [0.0] * self.num_links
        queues: list[deque[int]] = [deque() for _ in range(2 * n)]  # per engine: its queued copies, FIFO
        unbooked: dict[int, int] = {}  # key of a queued copy -> its flat index
        heads: list[tuple[float, int]] = []  # (link arrival, flat index) of engine heads whose input is known
        blocked: dict[int, int] = {}  # key of a queued copy -> the engine head waiting for it as its input

        def arrive(j: int) -> None:
            """Queue head ``j``: onto ``heads`` when its input is known (starts[j] holds its issue time)."""
            dep = first[j]
            if dep in unbooked:
                blocked[dep] = j
                return
            t = done[dep] if dep >= 0 else None
            at = starts[j]
            if t is not None and t > at:
                at = t
            if engine_free[engine[j]] > at:
                at = engine_free[engine[j]]
            heapq.heappush(heads, (at, j))

        ready = list(range(n))
        queued = [True] * n
        while True:
            while ready:
                rank = ready.pop()
                queued[rank] = False
                stop = offsets[rank + 1]
                clock, busy = clocks[rank], busies[rank]
                for i in range(pos[rank], stop):  # on a break ``i`` is the action the rank waits at
                    lane, key = lanes[i], keys[i]
                    if lane == _COPY:
                        if shared:  # queued; booked when no lane can run (see above)
                            starts[i] = clock
                            queue = queues[engine[i]]
                            queue.append(i)
                            unbooked[key] = i
                            if len(queue) == 1:
                                arrive(i)
                            continue
                        # an own link: the engine alone orders the rank's copies (FIFO), so it is booked now
                        t = done[first[i]]  # its F or I (OFFLOAD), or its OFFLOAD (RELOAD): earlier in the list
                        at = clock if t is None or clock >= t else t
                        slot = engine[i]
                        if engine_free[slot] > at:
                            at = engine_free[slot]
                        starts[i], ends[i], done[key] = at, at + length[i], at + length[i]
                        engine_free[slot] = at + length[i]
                    elif lane == _SEND:
                        starts[i] = clock
                        clock += durations[i]
                        ends[i] = done[key] = clock
                    else:
                        at = clock
                        dep = first[i]
                        if dep >= 0:
                            t = done[dep]
                            if t is None:
                                waiters.setdefault(dep, []).append(rank)
                                break
                            if t + first_delay[i] > at:
                                at = t + first_delay[i]
                            dep = second[i]
                            if dep >= 0:
                                t = done[dep]
                                if t is None:
                                    waiters.setdefault(dep, []).append(rank)
                                    break
                                if t + second_delay[i] > at:
                                    at = t + second_delay[i]
                        if lane == _COMPUTE:
                            start = at
                            reload = reloads[i]
                            if reload >= 0:
                                if reload in unbooked:
                                    waiters.setdefault(reload, []).append(rank)
                                    break
                                reload_end = done[reload]
                                if reload_end is not None and reload_end > start + _STALL_TOL * (start if start > 1.0 else 1.0):
                                    stalled.append((i, reload_end - start))
                                    stall[rank] += reload_end - start
                                    start = reload_end
                            duration = durations[i]
                            clock = start + duration
                            busy += duration
                            starts[i] = start
                        else:
                            starts[i] = clock
                            clock = at + durations[i]
                        ends[i] = done[key] = clock
                    if key in waiters:
                        for waiter in waiters.pop(key):
                            if not queued[waiter]:
                                queued[waiter] = True
                                ready.append(waiter)
                else:
                    i = stop
                pos[rank], clocks[rank], busies[rank] = i, clock, busy
            if not heads:
                return
            while heads and not ready:  # book in arrival order until a lane can run again
                at, j = heapq.heappop(heads)
                key, duration = keys[j], length[j]
                if duration > 0:
                    if link_free[link[j]] > at:
                        at = link_free[link[j]]
                    link_free[link[j]] = at + duration
                starts[j], ends[j], done[key] = at, at + duration, at + duration
                engine_free[engine[j]] = at + duration
                del unbooked[key]
                queue = queues[engine[j]]
                queue.popleft()
                if queue:
                    arrive(queue[0])
                if key in blocked:
                    arrive(blocked.pop(key))
                for waiter in waiters.pop(key, ()):
                    if not queued[waiter]:
                        queued[waiter] = True
                        ready.append(waiter)

    def _loop_cores(self, cores: float) -> None:
        """The event loop with ``cores`` (processor sharing; CPU ranks, no copies): in global time
        order, every lane doing work (a compute action, or a SEND's or RECV's ``message_time``) and
        every rank's pending ``message_cpu`` (its transport's own thread) is runnable, and each of the
        n runnable ones progresses at min(1, cores / (n + other_load)) of its speed. A rank waiting
        for a receive's data or in a transfer loads no core. Start and end times are walls (``busy``:
        the walls of its compute actions)."""
        if np.any(sem.LANE[self.c.kind] == sem.COPY):
            raise ScheduleError("cores (processor sharing) models CPU ranks; the schedule has offload copies")
        lanes, keys, first, first_delay, second, second_delay, _, durations = self._columns()
        done = self._done()
        n = self.schedule.num_ranks
        message_cpu = self.costs.message_cpu if self.c.lowered else 0.0  # a compute-only schedule has no SEND/RECV
        other = self.costs.other_load
        waiters, starts, ends = self.waiters, self.start, self.end
        pos, offsets, busies = self.pos, self.offsets, self.busy
        left = [-1.0] * n  # work left in the lane's current action; -1.0: not working
        background = [0.0] * n  # transport CPU still to run per rank
        since = [0.0] * n  # when the lane reached its current action
        timers: list[tuple[float, int]] = []  # (time its data is in, rank)
        ready = list(range(n))
        now = 0.0

        def start(rank: int) -> None:
            """Run ``rank``'s lane at ``now`` as far as it can without doing work; park or time it."""
            i, stop = pos[rank], offsets[rank + 1]
            while i < stop:
                at = now
                for dep, delay in ((first[i], first_delay[i]), (second[i], second_delay[i])):
                    if dep < 0:
                        break
                    t = done[dep]
                    if t is None:
                        waiters.setdefault(dep, []).append(rank)
                        pos[rank] = i
                        return
                    at = max(at, t + delay)
                if at > now:
                    heapq.heappush(timers, (at, rank))
                    pos[rank] = i
                    return
                starts[i] = since[rank] if lanes[i] != _COMPUTE else now
                if lanes[i] in (_SEND, sem.RECV):
                    background[rank] += message_cpu
                if durations[i] > 0:
                    pos[rank], left[rank] = i, durations[i]
                    return
                finish(rank, i)
                i += 1
            pos[rank] = stop

        def finish(rank: int, i: int) -> None:
            key = keys[i]
            ends[i] = done[key] = since[rank] = now
            if lanes[i] == _COMPUTE:
                busies[rank] += now - starts[i]
            for waiter in waiters.pop(key, ()):
                ready.append(waiter)

        while True:
            while ready:
                rank = ready.pop()
                if left[rank] < 0:  # not already at work (a rank can be woken twice)
                    start(rank)
            working = [r for r in range(n) if left[r] > 0]
            busy_bg = [r for r in range(n) if background[r] > 0]
            runnable = len(working) + len(busy_bg)
            if not runnable and not timers:
                return
            rate = min(1.0, cores / (runnable + other)) if runnable else 0.0
            least = min([left[r] for r in working] + [background[r] for r in busy_bg], default=math.inf)
            until = min(now + least / rate if runnable else math.inf, timers[0][0] if timers else math.inf)
            progress = (until - now) * rate
            tolerance = 1e-12 * max(1.0, until)
            now = until
            for r in working:
                left[r] -= progress
                if left[r] <= tolerance:
                    left[r] = -1.0
                    finish(r, pos[r])
                    pos[r] += 1
                    ready.append(r)
            for r in busy_bg:
                background[r] = background[r] - progress if background[r] - progress > tolerance else 0.0
            while timers and timers[0][0] <= now:
                ready.append(heapq.heappop(timers)[1])

    def _copy_resources(self) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], int]:
        """Per action (flat index): its copy engine slot, its host link's number and its copy duration
        (-1, -1, 0 for actions that are not copies); and the number of host links. One engine per rank,
        or one per direction; with a shared host link ranks 2p and 2p+1 share one link per direction."""
        costs, c = self.costs, self.c
        copy, offload = sem.LANE[c.kind] == sem.COPY, sem.TO_HOST[c.kind]
        separate = 0 if costs.shared_copy_engine else 1
        engine = np.where(copy, 2 * c.rank + np.where(offload, 0, separate), -1)
        owner = c.rank // 2 if costs.shared_host_link else c.rank
        link = np.where(copy, 2 * owner + np.where(offload, 0, 1), -1)
        per_unit = np.where(offload, costs.d2h_time, costs.h2d_time)
        length = np.where(copy, per_unit * sem.copy_units(c, self.amount), 0.0)
        return (engine.astype(np.int64), link.astype(np.int64), length), 2 * (int(owner.max(initial=0)) + 1)

    # ---- results -----------------------------------------------------------------------------
    def _memory_events(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """Per rank: (times, deltas) of device memory and of host memory. Computed on the whole flat
        arrays once (not once per rank: the times are converted from lists a single time), then cut
        at the ranks' bounds; each rank keeps its events in list order."""
        kind = self.c.kind
        amount = self.amount
        start, end = np.array(self.start), np.array(self.end)
        lane = sem.LANE[kind]
        offload = sem.TO_HOST[kind]
        reload = (lane == sem.COPY) & ~offload
        device = (lane == sem.COMPUTE) | offload | reload
        copies = offload | reload
        times = np.where(sem.AT_END[kind] | offload, end, start)[device]
        deltas = np.where(offload, -amount, amount)[device]
        host_times = np.where(offload, start, end)[copies]
        host_deltas = self.host_amount[copies]
        # where each rank's events begin in the selected arrays
        at = np.searchsorted(np.flatnonzero(device), self.offsets).tolist()
        host_at = np.searchsorted(np.flatnonzero(copies), self.offsets).tolist()
        return [(times[at[r]:at[r + 1]], deltas[at[r]:at[r + 1]],
                 host_times[host_at[r]:host_at[r + 1]], host_deltas[host_at[r]:host_at[r + 1]])
                for r in range(self.schedule.num_ranks)]

    def figures(self) -> Figures:
        peaks, host = [], []
        for times, deltas, host_times, host_deltas in self._memory_events():
            peaks.append(_peak(times, deltas, self._frees_first))
            host.append(_peak(host_times, host_deltas, frees_first=False))
        return Figures(max(self.end, default=0.0), tuple(self.busy), tuple(peaks), tuple(host), tuple(self.stall))

    def timeline(self) -> Timeline:
        offsets = self.offsets
        ranks = range(self.schedule.num_ranks)
        start = tuple(tuple(self.start[offsets[r]:offsets[r + 1]]) for r in ranks)
        end = tuple(tuple(self.end[offsets[r]:offsets[r + 1]]) for r in ranks)
        makespan = max((max(row, default=0.0) for row in end), default=0.0)
        per_rank = []
        v = max(self.schedule.stages_per_rank, 1)
        for rank, (times, deltas, host_times, host_deltas) in zip(ranks, self._memory_events()):
            memory, peak = _curve(times, deltas, self._frees_first)
            host, host_peak = _curve(host_times, host_deltas, frees_first=False)
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
        rank_of, steps, rows = self.c.rank, self.c.step, self.schedule.actions
        stalls = {rows[int(rank_of[i])][int(steps[i])]: seconds for i, seconds in self.stalled}
        return Timeline(self.schedule, self.costs, start, end, makespan, tuple(per_rank), stalls)

    def _report_deadlock(self, stuck: list[int]) -> None:
        rows = self.schedule.actions
        lines = []
        for rank in stuck:
            step = self.pos[rank] - self.offsets[rank]
            waits = [str(Action(*self.c.action(k))) for k, ranks in self.waiters.items() if rank in ranks]
            owner = ""
            for k in waits:
                other = self.schedule.placement.rank_of(Action.parse(k).stage)
                if other != rank:
                    owner = f" (rank {other} never reaches it)"
            lines.append(f"rank {rank} step {step} {rows[rank][step]} waits for {', '.join(waits) or '?'}{owner}")
        first = stuck[0]
        step = self.pos[first] - self.offsets[first]
        raise DeadlockError("deadlock: " + "; ".join(lines), first, step, rows[first][step], rows)


def _floats(values: np.ndarray) -> list[float]:
    """``values.tolist()``; all zeros (the delays without p2p time, or of a lowered schedule's second
    inputs) as one 0.0 repeated, with no float object made per action."""
    return values.tolist() if values.any() else [0.0] * len(values)


def _curve(times: np.ndarray, deltas: np.ndarray, frees_first: bool = True
           ) -> tuple[tuple[tuple[float, float], ...], float]:
    """Cumulative memory after each event (ties ordered as ``_levels`` orders them); and its peak."""
    times, levels = _levels(times, deltas, frees_first)
    if not len(times):
        return (), 0.0
    return tuple(zip(times.tolist(), levels.tolist())), max(0.0, float(levels.max()))


def _peak(times: np.ndarray, deltas: np.ndarray, frees_first: bool = True) -> float:
    levels = _levels(times, deltas, frees_first)[1]
    return max(0.0, float(levels.max())) if len(levels) else 0.0


def _levels(times: np.ndarray, deltas: np.ndarray, frees_first: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Event times in order and the level after each. At equal times device memory (``frees_first``)
    frees before it allocates, unless copies take no time; host memory keeps the events in list order, the order the runtime
    issues the copies: an OFFLOAD's host buffer exists from its issue, a RELOAD's until it has
    completed, so an offload listed before a reload at the same instant is on the host with it.

    A level within 1e-9 of zero is float noise and is set to zero. Vectorised; where such noise
    actually occurs (and so changes later sums) the events are summed one by one instead.
    """
    if not len(times):
        return times, deltas
    order = np.lexsort((deltas, times)) if frees_first else np.argsort(times, kind="stable")
    times, deltas = times[order], deltas[order]
    levels = np.cumsum(deltas)
    tiny = np.abs(levels) < 1e-9
    if np.any(tiny & (levels != 0.0)):
        level = 0.0
        out = []
        for delta in deltas.tolist():
            level += delta
            if abs(level) < 1e-9:
                level = 0.0
            out.append(level)
        levels = np.asarray(out)
    else:
        levels[tiny] = 0.0
    return times, levels
