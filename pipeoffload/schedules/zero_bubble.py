"""Zero-bubble families on one stage per rank: ZB-H1, ZB-H2 and the memory-limited ``zb``.

The backward is split into I (input gradient, on the critical path) and W (weight gradient, which
nothing waits for). W passes are what fills the pipeline bubbles. Memory is counted as the simulator
counts it: F allocates one activation unit, I frees ``1 - w_fraction`` of it and W the rest, so a
deferred W keeps its activation alive (with the default ``w_fraction = 1`` an I frees nothing).

Two layers:
- a *skeleton* is the per-rank order of the F and I passes only (warm-up forwards, then I/F pairs,
  then the remaining I's);
- ``fill_weight_passes`` replays the skeletons in time under a cost model and inserts each rank's
  pending W passes (oldest first) into the idle gaps in front of its next F/I, forcing them earlier
  when the next F would exceed the rank's activation limit, and appending the rest at the end.

The ``zb`` generator runs a small grid of skeletons and gap-filling rules through that replay (plus
the closed-form ZB-H1 when it fits) and keeps the one with the shortest makespan: a greedy heuristic
in the spirit of the zero-bubble paper's, with no ILP solver. Every candidate costs one O(actions)
replay, so d = 16, m = 128 takes a few tens of milliseconds.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from pipeoffload import semantics as sem
from pipeoffload.costs import CostModel
from pipeoffload.errors import ConfigError
from pipeoffload.ir import Action, ActionKind, Schedule
from pipeoffload.placement import Placement
from pipeoffload.schedules.classic import equal_rounds

F, B, I, W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W  # noqa: E741
_EPS = 1e-9
_UNIT = CostModel.uniform(1.0, 1.0, 1.0)


@dataclass(frozen=True)
class Filled:
    """Result of ``fill_weight_passes``: the full per-rank orders and what they cost."""

    rows: tuple[tuple[Action, ...], ...]
    makespan: float
    peaks: tuple[float, ...]  # peak resident activation units per rank

    def fits(self, limits: Sequence[float]) -> bool:
        return all(p <= lim + _EPS for p, lim in zip(self.peaks, limits))


class ActionPool:
    """Every F/I/W action of a configuration, made once and shared by all candidates of a search
    (building an ``Action`` costs about as much as placing it)."""

    def __init__(self, num_stages: int, num_microbatches: int) -> None:
        self._table = {k: [[Action(k, s, mb) for mb in range(num_microbatches)] for s in range(num_stages)]
                       for k in (F, I, W)}

    def __call__(self, kind: ActionKind, stage: int, microbatch: int) -> Action:
        return self._table[kind][stage][microbatch]


class _Replay:
    """Time replay of fixed F/I orders with W passes inserted on the fly (see module docstring).

    A skeleton that already contains W passes is replayed as given (its W passes stay where they are).
    Per-stage costs are unpacked into lists once: this loop is the inner loop of the ``zb`` search.
    """

    def __init__(self, placement: Placement, skeleton: Sequence[Sequence[Action]], costs: CostModel,
                 limits: Sequence[float], overfill: float, pool: ActionPool | None) -> None:
        self.skeleton, self.limits, self.overfill = skeleton, limits, overfill
        self.make = pool or Action
        num_stages = placement.num_stages
        stages = range(num_stages)
        self.rank_of = list(placement.stage_to_rank)
        time = sem.durations(costs, num_stages)
        self.t_f, self.t_i, self.t_w, self.t_b = (time[sem.CODE[k]].tolist() for k in (F, I, W, B))
        # memory per stage from the shared rule; w_fraction is the one number the search plans with
        kept = costs.w_fraction
        self.grow_f, self.free_i, self.free_w, self.free_b = (
            [sem.memory_delta(k, costs.act(s), kept) for s in stages] for k in (F, I, W, B))
        n, m = placement.num_ranks, 1 + max((a.microbatch for r in skeleton for a in r), default=0)
        # end times of the timed passes: the F's, and each stage's backward (its I, or its B)
        self.end_f: list[list[float | None]] = [[None] * m for _ in stages]
        self.end_i: list[list[float | None]] = [[None] * m for _ in stages]
        ends = {F: self.end_f, I: self.end_i, B: self.end_i}
        # per kind and stage, what it waits for (semantics.producers): (their end times, stage, its rank);
        # a producer on another rank adds p2p_time
        self.waits: dict[ActionKind, list[tuple[tuple[list[list[float | None]], int, int], ...]]] = {
            kind: [tuple((ends[kinds[0]], p, self.rank_of[p]) for kinds, p in sem.producers(kind, s, num_stages))
                   for s in stages]
            for kind in (F, I, B, W)
        }
        self.p2p = costs.p2p_time
        self.pointer, self.clock = [0] * n, [0.0] * n
        self.mem, self.peak = [0.0] * n, [0.0] * n
        self.pending: list[deque[tuple[int, int]]] = [deque() for _ in range(n)]
        kinds = {a.kind for r in skeleton for a in r}
        unknown = sorted(kinds - self.waits.keys())
        if unknown:  # never timed as another kind
            raise ValueError(f"the W-filling replay times F, I, B and W only, not {', '.join(map(str, unknown))}; "
                             "lower the schedule after it")
        self.pinned = W in kinds
        self.rows: list[list[Action]] = [[] for _ in range(n)]

    def advance(self, rank: int) -> bool:
        """Place as much of ``rank``'s skeleton as its dependencies allow; True if anything moved.

        Written with locals for speed: this loop runs once per action of every ``zb`` candidate.
        """
        order, pending, row = self.skeleton[rank], self.pending[rank], self.rows[rank]
        limit, t_w, make, waits, p2p = self.limits[rank] + _EPS, self.t_w, self.make, self.waits, self.p2p
        grow_f, free_i, free_w, free_b = self.grow_f, self.free_i, self.free_w, self.free_b
        clock, mem, peak, pointer = self.clock[rank], self.mem[rank], self.peak[rank], self.pointer[rank]
        start_pointer, start_w = pointer, len(row)
        while pointer < len(order):
            a = order[pointer]
            kind, s = a.kind, a.stage
            if kind == F:  # make room: W passes free what their I kept
                while pending and mem + grow_f[s] > limit:
                    ws, wmb = pending.popleft()
                    row.append(make(W, ws, wmb))
                    clock += t_w[ws]
                    mem += free_w[ws]
            # ready: when a's inputs are on this rank (-1 while a producer is not placed yet)
            ready, mb = 0.0, a.microbatch
            for ends, producer_stage, owner in waits[kind][s]:
                end = ends[producer_stage][mb]
                if end is None:
                    ready = -1.0
                    break
                if owner != rank:
                    end += p2p
                if end > ready:
                    ready = end
            if ready < 0.0:
                break
            while pending:  # fill the idle gap before ``a`` with W passes
                gap = ready - clock
                ws = pending[0][0]
                if gap <= _EPS or gap + _EPS < self.overfill * t_w[ws]:
                    break
                ws, wmb = pending.popleft()
                row.append(make(W, ws, wmb))
                clock += t_w[ws]
                mem += free_w[ws]
            start = clock if clock > ready else ready
            if kind == F:
                mem += grow_f[s]
                peak = mem if mem > peak else peak
                clock = start + self.t_f[s]
                self.end_f[s][mb] = clock
            elif kind == I:
                clock = start + self.t_i[s]
                self.end_i[s][mb] = clock
                mem += free_i[s]
                if not self.pinned:
                    pending.append((s, mb))
            elif kind == B:  # a full backward: the upstream stage waits for it like for an I
                clock = start + self.t_b[s]
                self.end_i[s][mb] = clock
                mem += free_b[s]
            elif kind == W:  # a W pinned in the skeleton
                clock = start + t_w[s]
                mem += free_w[s]
            row.append(a)
            pointer += 1
        self.clock[rank], self.mem[rank], self.peak[rank], self.pointer[rank] = clock, mem, peak, pointer
        return pointer > start_pointer or len(row) > start_w

    def finish(self) -> Filled:
        ranks = range(len(self.skeleton))
        progress = True
        while progress:
            progress = False
            for rank in ranks:
                progress = self.advance(rank) or progress
        stuck = [r for r in ranks if self.pointer[r] < len(self.skeleton[r])]
        if stuck:
            r = stuck[0]
            raise ValueError(f"skeleton deadlocks: rank {r} waits for {self.skeleton[r][self.pointer[r]]}")
        for rank in ranks:
            for stage, mb in self.pending[rank]:
                self.rows[rank].append(self.make(W, stage, mb))
                self.clock[rank] += self.t_w[stage]
        return Filled(tuple(tuple(r) for r in self.rows), max(self.clock, default=0.0), tuple(self.peak))


def fill_weight_passes(
    placement: Placement,
    skeleton: Sequence[Sequence[Action]],
    costs: CostModel | None = None,
    limits: Sequence[float] | None = None,
    overfill: float = 1.0,
    pool: ActionPool | None = None,
) -> Filled:
    """Insert one W after each I of ``skeleton`` (per-rank F/I orders) where it costs least.

    A skeleton that already holds its W passes is only replayed (timed and measured), not changed;
    full backwards (B) are replayed as they stand.

    Replays the skeletons in time under ``costs`` (unit costs by default). Before each F/I a rank
    runs its oldest pending W passes while they fit in the idle gap before that pass's inputs arrive
    (a W is started when the gap is at least ``overfill`` times its duration: 1.0 never delays the
    next pass, 0.0 uses any gap). Before an F that would take the rank above ``limits[rank]``
    activation units, pending W passes run first whatever the gap. The rest run at the end.
    The returned makespan equals ``simulate`` of the returned schedule under the same costs.
    """
    costs = costs or _UNIT
    limits = limits if limits is not None else [float("inf")] * placement.num_ranks
    return _Replay(placement, skeleton, costs, limits, overfill, pool).finish()


def _one_stage(name: str, stages_per_rank: int) -> None:
    if stages_per_rank != 1:
        raise ConfigError.named(lambda n: (
            f"{n.given('stages_per_rank', stages_per_rank)}: {name} places one stage per rank; use zb-v, "
            "v-half or v-min for two stages per rank"))


def skeleton(num_ranks: int, num_microbatches: int, warmups: Sequence[int],
             pool: ActionPool | None = None) -> list[list[Action]]:
    """F/I order of each rank: ``warmups[r]`` forwards, then I/F pairs, then the remaining I's.

    Warm-ups are clipped to 1..m and made non-increasing along the pipeline: a rank that wants more
    warm-up forwards than its predecessor would wait for a forward its predecessor only runs after
    this rank's first I (a deadlock).
    """
    m, rows, make = num_microbatches, [], pool or Action
    warm = m
    for rank in range(num_ranks):
        warm = max(1, min(warmups[rank], warm))
        order = [make(F, rank, mb) for mb in range(warm)]
        for mb in range(m):
            order.append(make(I, rank, mb))
            if warm + mb < m:
                order.append(make(F, rank, warm + mb))
        rows.append(order)
    return rows


def zb_h1_rows(num_ranks: int, num_microbatches: int, stages_per_rank: int = 1) -> list[list[Action]]:
    """Closed-form ZB-H1 order; with v > 1 stages per rank (loop placement) its interleaved form.

    Forward number k of a rank runs local stage (k // p) % v (rounds of p microbatches, as in
    interleaved 1F1B) and backwards visit local stages in reverse; warm-up (v-1)p + d-1-r forwards,
    then F I pairs, each followed from pair r on by the W of the oldest I (rank r holds back r W
    passes), then the remaining I's and W's. Equal to torch's ZB1P (InterleavedZeroBubble) order.
    """
    d, m, v = num_ranks, num_microbatches, stages_per_rank
    p = m // max(1, m // d)
    placement, total, rows = Placement.loop(d, v), v * m, []
    for rank in range(d):
        stages = placement.stages_of(rank)
        warm = min((v - 1) * p + d - 1 - rank, total)
        next_f, next_i = dict.fromkeys(stages, 0), dict.fromkeys(stages, 0)
        owed: deque[Action] = deque()
        order: list[Action] = []

        def forward(k: int) -> None:
            stage = stages[(k // p) % v]
            order.append(Action(F, stage, next_f[stage]))
            next_f[stage] += 1

        def backward(k: int) -> None:
            stage = stages[v - 1 - ((k - warm) // p) % v]
            order.append(Action(I, stage, next_i[stage]))
            owed.append(Action(W, stage, next_i[stage]))
            next_i[stage] += 1
            if k - warm >= rank:  # rank r keeps r weight passes back to fill its cool-down
                order.append(owed.popleft())

        for k in range(total + warm):
            if k < total:
                forward(k)
            if k >= warm:
                backward(k)
        rows.append(order + list(owed))
    return rows


def zb_h1(num_ranks: int, num_microbatches: int, stages_per_rank: int = 1) -> Schedule:
    """ZB-H1: 1F1B with the backward split into I and W; W passes are held back to fill bubbles.

    rank r: warm-up = min(d-1-r, m) F | steady: F I, plus W of the oldest microbatch from step r on
            | cool-down: the remaining I (each followed by a W) | then the r held-back W passes.
    d=4, m=6 (F = I = W = 1, times 0..20):
        r0  F0 F1 F2 F3 .  .  .  I0 W0 F4 I1 W1 F5 I2 W2 I3 W3 I4 W4 I5 W5
        r1  .  F0 F1 F2 .  .  I0 F3 I1 W0 F4 I2 W1 F5 I3 W2 I4 W3 I5 W4 W5
        r2  .  .  F0 F1 .  I0 F2 I1 F3 I2 W0 F4 I3 W1 F5 I4 W2 I5 W3 W4 W5
        r3  .  .  .  F0 I0 F1 I1 F2 I2 F3 I3 F4 I4 F5 I5 W0 W1 W2 W3 W4 W5
    Every rank peaks at min(d, m) activation units, 1F1B's peak (rank 0's). 1F1B's per-rank profile
    d-r is not enough: rank d-1 must hold d-1 W passes back to finish by 3m+d-1 (docs). With unit
    costs and m >= d the makespan is 3m+d-1, the lower bound for one stage per rank (1F1B: 3(m+d-1)).
    With stages_per_rank = v > 1 (loop placement) it is interleaved zero bubble, torch's ZB1P: warm-up
    (v-1)p + d-1-r forwards in rounds of p = m / max(1, m // d) microbatches (m must split into such
    rounds, as for interleaved-1f1b); at v = 2 its bubble and memory equal zb-v's.
    """
    d, m, v = num_ranks, num_microbatches, stages_per_rank
    if v > 1:  # one stage per rank takes any m
        equal_rounds("zb-h1", d, m, v)
    rows = zb_h1_rows(d, m, v)
    return Schedule(tuple(map(tuple, rows)), Placement.loop(d, v), m, "zb-h1")


def zb_h2_warmups(num_ranks: int) -> list[int]:
    """2(d-r)-1 forwards: all that fit before rank r's first input gradient comes back."""
    return [2 * (num_ranks - r) - 1 for r in range(num_ranks)]


def zb_h2(num_ranks: int, num_microbatches: int, stages_per_rank: int = 1) -> Schedule:
    """ZB-H2: enough warm-up forwards to cover the round trip, W passes fill every remaining gap.

    rank r: warm-up = min(2(d-r)-1, m) F | steady: I F pairs, W passes in the gaps | cool-down: I's
            with W's between them, then the W's still held. W placement comes from replaying unit
            costs with at most 2d resident activation units per rank.
    d=4, m=8 (F = I = W = 1, times 0..26):
        r0  F0 F1 F2 F3 F4 F5 F6 I0 F7 I1 W0 I2 W1 I3 W2 I4 W3 I5 W4 I6 W5 I7 W6 W7 .  .  .
        r1  .  F0 F1 F2 F3 F4 I0 F5 I1 F6 I2 F7 I3 W0 I4 W1 I5 W2 I6 W3 I7 W4 W5 W6 W7 .  .
        r2  .  .  F0 F1 F2 I0 F3 I1 F4 I2 F5 I3 F6 I4 F7 I5 W0 I6 W1 I7 W2 W3 W4 W5 W6 W7 .
        r3  .  .  .  F0 I0 F1 I1 F2 I2 F3 I3 F4 I4 F5 I5 F6 I6 F7 I7 W0 W1 W2 W3 W4 W5 W6 W7
    Every rank is busy from its first forward to its last pass (the zero-bubble parallelogram); the
    makespan 3m+d-1 is the bound set by the last rank's start. Peak <= 2d activation units. Its
    makespan never exceeds ZB-H1's: when ZB-H1's order is faster under unit costs it is returned.
    Unequal costs show the gain: F=1, I=1.5, W=0.5, d=8, m=32: 106.5 vs ZB-H1's 110.
    """
    _one_stage("zb-h2", stages_per_rank)
    d, m = num_ranks, num_microbatches
    placement = Placement.loop(d, 1)
    filled = fill_weight_passes(placement, skeleton(d, m, zb_h2_warmups(d)), _UNIT, [2.0 * d] * d)
    h1 = zb_h1_rows(d, m)
    if fill_weight_passes(placement, h1).makespan < filled.makespan - _EPS:
        return Schedule(tuple(map(tuple, h1)), placement, m, "zb-h2")
    return Schedule(filled.rows, placement, m, "zb-h2")


def _is_number(x: object) -> bool:
    return not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x)


def _limits(memory_limit: float | Sequence[float] | None, d: int, costs: CostModel) -> list[float]:
    if memory_limit is None:
        limits = [float(d) * max(costs.act(r) for r in range(d))] * d
    elif _is_number(memory_limit):
        limits = [float(memory_limit)] * d  # type: ignore[arg-type]
    else:
        if isinstance(memory_limit, (str, bytes)) or not isinstance(memory_limit, Sequence) or not all(
                _is_number(x) for x in memory_limit):
            raise ConfigError(f"memory_limit={memory_limit!r}: must be a finite number of activation units, or a "
                              f"sequence of {d} (one per rank), e.g. memory_limit={d}")
        limits = [float(x) for x in memory_limit]
        if len(limits) != d:
            raise ConfigError(f"memory_limit has {len(limits)} values for {d} ranks: give one per rank or a scalar")
    for rank, limit in enumerate(limits):
        if limit + _EPS < costs.act(rank):
            raise ConfigError(
                f"memory_limit={limit:g} on rank {rank}: below one microbatch's activation ({costs.act(rank):g} "
                "units); raise it to at least that, or offload/recompute"
            )
    return limits


def _warmup_grid(d: int, m: int, limits: Sequence[float], costs: CostModel) -> list[tuple[int, ...]]:
    """Warm-up depths to try: 1F1B's d-r plus a few extra forwards, up to what memory allows."""
    fit = [max(1, int(limits[r] / max(costs.act(r), _EPS) + _EPS)) for r in range(d)]
    extras = sorted({0, 1, 2, d // 4, d // 2, d})
    grid = {tuple(min(m, fit[r], d - r + extra) for r in range(d)) for extra in extras}
    grid.add(tuple(min(m, fit[r], 2 * (d - r) - 1) for r in range(d)))
    grid.add(tuple(min(m, fit[r]) for r in range(d)))
    # Below 1F1B's depths (a limit under d - r units) the depths taper along the pipeline instead:
    # rank r keeps its share (d - r) / d of what the limit holds, rounded down, to nearest or up, so
    # the ranks that cannot keep 1F1B's depth give up a little each rather than the early ranks all
    # sitting at the limit (d = 8, limit 4: (4, 4, 3, 3, 2, 2, 1, 1), a step about half as long as
    # (4, 4, 4, 4, 4, 3, 2, 1); benchmarks/zb_vs_exhaustive.py).
    for up in (0.0, 0.5, 1.0):  # floor, nearest (halves up), ceiling; _EPS: 3 * 6 / 6 is 3, not 2.999...
        grid.add(tuple(min(m, fit[r], max(1, math.floor(fit[r] * (d - r) / d + up - (_EPS if up == 1.0 else -_EPS))))
                       for r in range(d)))
    return sorted(grid)


def zb(
    num_ranks: int,
    num_microbatches: int,
    stages_per_rank: int = 1,
    *,
    memory_limit: float | Sequence[float] | None = None,
    costs: CostModel | None = None,
) -> Schedule:
    """Zero bubble under a memory limit: the best of a few greedy schedules, judged by ``costs``.

    ``memory_limit``: activation units each rank may hold (a scalar or one value per rank); default
    d units, 1F1B's peak. ``costs``: per-stage F/I/W times, activation sizes, w_fraction and P2P
    time (unit costs by default). Candidates: skeletons with warm-up min(m, d-r+e, fit) for a few
    extra depths e (fit = how many activations the limit holds), each replayed with two gap-filling
    rules, plus the closed-form ZB-H1 when it fits. The shortest makespan wins (ties: lower peak).
    rank r: warm-up = that depth of F | steady: I F pairs, W in gaps or when memory is full
            | cool-down: I's with W's between them, the rest of the W's at the end.
    A limit of d behaves like zb-h1 (never slower under any costs), 2d like zb-h2.
    """
    _one_stage("zb", stages_per_rank)
    d, m = num_ranks, num_microbatches
    costs = costs or _UNIT
    costs.check_stages(d)
    limits = _limits(memory_limit, d, costs)
    placement, pool = Placement.loop(d, 1), ActionPool(d, m)
    candidates = [fill_weight_passes(placement, zb_h1_rows(d, m), costs)]  # ZB-H1, its W passes pinned
    h2 = tuple(min(m, w) for w in zb_h2_warmups(d))  # ZB-H2's own skeleton and gap rule
    runs = [(h2, 1.0)] + [(w, rule) for w in _shortlist(d, m, limits, costs, pool) for rule in (1.0, 0.0)]
    for warmups, overfill in dict.fromkeys(runs):
        rows = skeleton(d, m, warmups, pool)
        candidates.append(fill_weight_passes(placement, rows, costs, limits, overfill, pool))
    fitting = [f for f in candidates if f.fits(limits)]
    if not fitting:  # one forward in flight, W forced before the next: fits any limit >= one activation
        fitting = [fill_weight_passes(placement, skeleton(d, m, [1] * d, pool), costs, limits, 1.0, pool)]
    best = min(fitting, key=lambda f: (f.makespan, max(f.peaks)))
    return Schedule(best.rows, placement, m, "zb")


def _shortlist(d: int, m: int, limits: Sequence[float], costs: CostModel, pool: ActionPool,
               keep: int = 2) -> list[tuple[int, ...]]:
    """The ``keep`` best warm-up depths, ranked on a pipeline shortened to min(m, 3d) microbatches.

    Depths differ in the warm-up and cool-down transients, which a 3d-microbatch pipeline already
    shows; ranking there and replaying only the best in full keeps d = 16, m = 128 fast.
    """
    short = min(m, 3 * d)
    placement, ranked = Placement.loop(d, 1), []
    for warmups in _warmup_grid(d, m, limits, costs):
        filled = fill_weight_passes(placement, skeleton(d, short, warmups, pool), costs, limits, 1.0, pool)
        if filled.fits(limits):
            ranked.append((filled.makespan, max(filled.peaks), warmups))
    ranked.sort()
    return [w for _, _, w in ranked[:keep]]
