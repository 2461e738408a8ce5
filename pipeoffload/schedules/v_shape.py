"""V-shape families: rank r holds stages r (local stage 0) and 2d-1-r (local stage 1); the last stage is on rank 0.

- ``zb-v``: zero bubble with 1F1B's memory (d rank units = 2d activation units).
- ``v-half`` / ``v-min``: the controllable-memory building blocks, about 1/2 and 1/3 of that memory.
- ``1f1b-v``: ZB-V's order without the I/W split (full B), 1F1B's memory.

V-Half and V-Min start from a repeating *building block*: microbatch k's four passes on rank i sit at
slots 6k + (offset of F local stage 0, F local stage 1, I local stage 1, I local stage 0), one slot per pass, so every pass
type repeats every 6 slots and the two free slots per period take the W passes (oldest first). The
offsets are chosen so that each pass comes one slot after its producer on the neighbouring rank and
no two passes of a rank share a slot modulo 6. The blocks then go through a *squeeze*: in the
warm-up (before rank 0's first local stage 0 backward) and the cool-down (after rank 0's last forward)
every pass moves to the earliest free slot its inputs allow, as long as no rank goes above the
block's peak (the highest rank's). The squeezed order of F and I passes is finally replayed in time under the cost model with
W passes filling the gaps (``zero_bubble.fill_weight_passes``), capped at the block's own peak, and
the better of that and the squeezed order as it stands is returned. Memory counts as the simulator
counts it (``semantics.memory_delta`` with ``w_fraction = 1``: F allocates, I frees nothing, W frees).
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from pipeoffload import semantics as sem
from pipeoffload.costs import CostModel
from pipeoffload.errors import ConfigError
from pipeoffload.ir import Action, ActionKind, Schedule
from pipeoffload.placement import Placement
from pipeoffload.schedules.zero_bubble import Filled, fill_weight_passes

F, B, I, W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W  # noqa: E741
_UNIT = CostModel.uniform(0.5, 0.5, 0.5)  # two half-depth stages per rank: a rank's work per microbatch is 3
_EPS = 1e-9
Grid = dict[int, Action]  # slot -> pass, one per rank
_W_FRACTION = 1.0  # the blocks and the squeeze count memory with I freeing nothing and W all of it


def _two_stages(name: str, stages_per_rank: int) -> None:
    if stages_per_rank != 2:
        raise ConfigError.named(lambda n: (
            f"{n.given('stages_per_rank', stages_per_rank)}: {name} uses V placement, which holds exactly 2 "
            f"stages per rank (r and 2d-1-r); pass {n.given('stages_per_rank', 2)}"))


def v_min_offsets(d: int, rank: int) -> tuple[int, int, int, int]:
    """Slots of (F local stage 0, F local stage 1, I local stage 1, I local stage 0): the tightest chain, lifespans ~4d slots."""
    gap = 2 if d % 3 == 0 else 0  # keeps the four passes apart modulo 6
    return rank, 2 * d - 1 - rank, 2 * d + gap + rank, 4 * d + gap - 1 - rank


def v_half_offsets(d: int, rank: int) -> tuple[int, int, int, int]:
    """Chunk 0 forwards two slots apart per rank: lifespans ~6d slots, half of ZB-V's memory."""
    gap = 3 if d % 2 == 0 else 0
    return 2 * rank, 3 * d - 2 - rank, 3 * d + gap + 2 * rank - 1, 6 * d + gap - 2 - rank


def block_grids(d: int, m: int, offsets: Callable[[int, int], Sequence[int]]) -> list[Grid]:
    """Repeat the building block m times per rank and put each rank's W passes in its free slots."""
    grids = []
    for rank in range(d):
        first, last = rank, 2 * d - 1 - rank
        off = offsets(d, rank)
        if len({o % 6 for o in off}) != 4:
            raise AssertionError(f"building block collides on rank {rank} for d={d}: {off}")
        grid = {o + 6 * mb: Action(kind, stage, mb) for mb in range(m)
                for o, kind, stage in zip(off, (F, F, I, I), (first, last, last, first))}
        grids.append(_put_w(grid))
    return grids


def _put_w(grid: Grid) -> Grid:
    """Each free slot takes the oldest pending W; W passes left at the end follow the last pass."""
    out, pending, slot, end = dict(grid), deque[Action](), 0, max(grid)
    while slot <= end or pending:
        a = grid.get(slot)
        if a is not None and a.kind == I:
            pending.append(Action(W, a.stage, a.microbatch))
        elif a is None and pending:
            out[slot] = pending.popleft()
        slot += 1
    return out


def squeeze(grids: list[Grid], m: int, act: Callable[[int], float]) -> list[Grid]:
    """Move warm-up and cool-down passes to earlier free slots without raising the peak memory
    (the highest rank's: a rank below it may rise up to it).

    Passes are visited in slot order (all ranks). A pass may move to any free slot after its inputs
    (``semantics.producers``: previous-stage forward, next-stage backward, its own F or I) and after
    the same pass of the previous microbatch; memory moves with it (``semantics.memory_delta``).
    Steady-state passes, between rank 0's first local stage 0 backward and its last local stage 0
    forward, keep their slots: the block is already dense there.
    """
    num_stages = 2 * len(grids)
    rules = _Rules(num_stages, act)
    unknown = sorted({a.kind for g in grids for a in g.values()} - rules.delta.keys())
    if unknown:
        raise ValueError(f"squeeze moves F, I and W passes only, not {', '.join(map(str, unknown))}")
    length = 1 + max(max(g) for g in grids)
    profiles = [_memory_profile(g, act, length) for g in grids]
    peak = max(max(p) for p in profiles)
    where = {(a.kind, a.stage, a.microbatch): (rank, slot) for rank, g in enumerate(grids) for slot, a in g.items()}
    order = {F: 0, I: 1, W: 2}
    visits = sorted(((slot, rank, order[a.kind], a) for rank, g in enumerate(grids) for slot, a in g.items()),
                    key=lambda v: v[:3])
    phase = "warm-up"
    for _, rank, _, a in visits:
        if (a.kind, a.stage, a.microbatch) == (I, 0, 0):
            phase = "steady"
        if phase == "steady":
            if (a.kind, a.stage, a.microbatch) == (F, 0, m - 1):
                phase = "cool-down"
            continue
        earliest = 1 + max((where[k][1] for k in rules.inputs(a) if k in where), default=-1)
        _move_earlier(grids[rank], profiles[rank], where, a, earliest, peak, rules.delta[a.kind][a.stage])
    return grids


class _Rules:
    """The squeeze's per (kind, stage) tables, from ``semantics`` once: memory effect and producers."""

    def __init__(self, num_stages: int, act: Callable[[int], float]) -> None:
        stages = range(num_stages)
        self.delta = {k: [sem.memory_delta(k, act(s), _W_FRACTION) for s in stages] for k in (F, I, W)}
        # the next stage's backward is named under both kinds; the one the grids hold counts
        self.producers = {k: [[(kind, p) for kinds, p in sem.producers(k, s, num_stages) for kind in kinds]
                              for s in stages] for k in (F, I, W)}

    def inputs(self, a: Action) -> list[tuple[ActionKind, int, int]]:
        """The passes ``a`` must follow: its producers and the same pass of the previous microbatch
        (the block's order)."""
        s, mb = a.stage, a.microbatch
        keys = [(a.kind, s, mb - 1)] if mb > 0 else []
        keys += [(kind, stage, mb) for kind, stage in self.producers[a.kind][s]]
        return keys


def _move_earlier(grid: Grid, profile: list[float], where: dict, a: Action, earliest: int, peak: float,
                  delta: float) -> None:
    """Move ``a`` to the first free slot from ``earliest`` on where an allocation (``delta`` > 0) keeps
    the profile within ``peak``."""
    key = (a.kind, a.stage, a.microbatch)
    current = where[key][1]
    for slot in range(earliest, current):
        if slot in grid:
            continue
        if delta > 0.0 and max(profile[slot:current]) + delta > peak + _EPS:
            continue
        for t in range(slot, current):
            profile[t] += delta
        del grid[current]
        grid[slot] = a
        where[key] = (where[key][0], slot)
        return


def _memory_profile(grid: Grid, act: Callable[[int], float], length: int) -> list[float]:
    """Resident activation units after each slot (``semantics.memory_delta`` of each pass)."""
    level, out = 0.0, []
    deltas: dict[tuple[ActionKind, int], float] = {}
    for slot in range(length):
        a = grid.get(slot)
        if a is not None:
            delta = deltas.get((a.kind, a.stage))
            if delta is None:
                delta = deltas[(a.kind, a.stage)] = sem.memory_delta(a.kind, act(a.stage), _W_FRACTION)
            level += delta
        out.append(level)
    return out


def _best_of(placement: Placement, squeezed_rows: Sequence[Sequence[Action]], costs: CostModel) -> Filled:
    """The squeezed order as it stands, or its F/I order with W passes re-placed in time: the faster.
    The re-placed one is capped at the squeezed order's own per-rank peaks."""
    as_is = fill_weight_passes(placement, squeezed_rows, costs)
    skeleton = [[a for a in row if a.kind != W] for row in squeezed_rows]
    refilled = fill_weight_passes(placement, skeleton, costs, as_is.peaks)
    if refilled.fits(as_is.peaks) and refilled.makespan < as_is.makespan - _EPS:
        return refilled
    return as_is


def _block_schedule(name: str, d: int, m: int, offsets: Callable[[int, int], Sequence[int]],
                    costs: CostModel | None) -> Schedule:
    costs = costs or _UNIT
    placement = Placement.v(d, 2)
    costs.check_stages(placement.num_stages)
    grids = squeeze(block_grids(d, m, offsets), m, lambda s: 1.0)
    rows = [[g[slot] for slot in sorted(g)] for g in grids]
    return Schedule(_best_of(placement, rows, costs).rows, placement, m, name)


def v_half(num_ranks: int, num_microbatches: int, stages_per_rank: int = 2, *,
           costs: CostModel | None = None) -> Schedule:
    """V-Half: building block (F local stage 0, F local stage 1, I local stage 1, I local stage 0) at slots
    (2i, 3d-2-i, 3d+g+2i-1, 6d+g-2-i) + 6k on rank i, g = 3 for even d (else 0), then squeezed.

    rank r: warm-up = local stage 0 forwards (squeezed forward as far as memory allows) | steady: every 6
            slots one F and one I per local stage and two W | cool-down: the I chains with W's between.
    d=4, m=8, first 32 of 53 slots (0.5 per pass; lowercase: local stage 1, the stage 2d-1-r):
        r0  F0 F1 F2 F3 F4 .  .  f0 i0 w0 f1 i1 w1 f2 .  .  I0 i2 W0 f3 w2 F5 I1 i3 W1 f4 w3 F6 I2 i4 W2 f5 ...
        r1  .  F0 F1 F2 F3 .  f0 .  f1 i0 w0 f2 i1 w1 .  I0 F4 W0 f3 i2 I1 w2 F5 W1 f4 i3 I2 w3 F6 W2 f5 i4 ...
        r2  .  .  F0 F1 F2 f0 .  f1 .  f2 i0 w0 F3 i1 I0 w1 W0 f3 F4 I1 i2 W1 w2 f4 F5 I2 i3 W2 w3 f5 F6 I3 ...
        r3  .  .  .  F0 f0 F1 f1 F2 f2 .  .  i0 I0 w0 F3 W0 f3 i1 I1 w1 F4 W1 f4 i2 I2 w2 F5 W2 f5 i3 I3 w3 ...
    Peak <= floor((d+2)/2) rank units (3 / 5 / 9 at d = 4 / 8 / 16). Bubble about d/(2m) plus the
    fill and drain: 0.081 at d = 8, m = 32 with unit costs. ``costs`` (default 0.5 per pass) drives
    where W passes go.
    """
    _two_stages("v-half", stages_per_rank)
    return _block_schedule("v-half", num_ranks, num_microbatches, v_half_offsets, costs)


def v_min(num_ranks: int, num_microbatches: int, stages_per_rank: int = 2, *,
          costs: CostModel | None = None) -> Schedule:
    """V-Min: building block (F local stage 0, F local stage 1, I local stage 1, I local stage 0) at slots
    (i, 2d-1-i, 2d+g+i, 4d+g-1-i) + 6k on rank i, g = 2 when 3 divides d (else 0): every pass
    follows its producer with no slack, so activations live as short as the chain allows.

    rank r: warm-up = local stage 0 forwards until memory is full, local stage 1 forwards on the way back
            | steady: every 6 slots F F I I and two W | cool-down: the I chains with W's between.
    d=4, m=8, first 32 of 59 slots (0.5 per pass; lowercase: local stage 1):
        r0  F0 F1 F2 .  .  .  .  f0 i0 w0 f1 i1 .  .  .  I0 w1 W0 F3 f2 i2 I1 w2 W1 F4 f3 i3 I2 w3 W2 F5 f4 ...
        r1  .  F0 F1 .  .  .  f0 .  f1 i0 w0 F2 .  .  I0 i1 W0 w1 f2 F3 I1 i2 W1 w2 f3 F4 I2 i3 W2 w3 f4 F5 ...
        r2  .  .  F0 F1 .  f0 .  f1 .  .  i0 w0 F2 I0 W0 .  i1 f2 w1 I1 F3 W1 i2 f3 w2 I2 F4 W2 i3 f4 w3 I3 ...
        r3  .  .  .  F0 f0 F1 f1 .  .  .  .  i0 I0 w0 W0 F2 f2 i1 I1 w1 W1 F3 f3 i2 I2 w2 W2 F4 f4 i3 I3 w3 ...
    Peak <= floor((d+4)/3) rank units (2 / 4 / 6 at d = 4 / 8 / 16). Bubble about 2d/(3m):
    0.123 at d = 8, m = 32 with unit costs; V-Min loses most when F, I and W times differ.
    """
    _two_stages("v-min", stages_per_rank)
    return _block_schedule("v-min", num_ranks, num_microbatches, v_min_offsets, costs)


def zb_v_rows(d: int, m: int, split: bool = True) -> list[list[Action]]:
    """The ZB-V order (zero-bubble paper, section 6), or with ``split=False`` the same order with
    each I and its W merged into one B (1F1B-V). Built for max(m, 2d-1) microbatches, the fewest
    the pattern needs, then the extra ones are dropped (their passes leave no gaps in the order)."""
    n, rows = max(m, 2 * d - 1), []
    for rank in range(d):
        first, last = rank, 2 * d - 1 - rank
        count: dict[tuple[ActionKind, int], int] = {}
        order: list[Action] = []

        def emit(kind: ActionKind, stage: int) -> None:
            mb = count.get((kind, stage), 0)
            count[(kind, stage)] = mb + 1
            order.append(Action(kind, stage, mb))

        def backward(stage: int) -> None:
            emit(I if split else B, stage)
            if split:
                emit(W, stage)

        for _ in range(2 * (d - rank) - 1):
            emit(F, first)
        for _ in range(rank):
            emit(F, last)
            emit(F, first)
        for _ in range(d - rank):
            emit(F, last)
            backward(last)
        while count.get((F, last), 0) < count[(F, first)] or count[(F, first)] < n:
            if count[(F, first)] < n:
                emit(F, first)
            backward(first)
            emit(F, last)
            backward(last)
        for _ in range(rank):  # cool-down: input gradients first, weight gradients held back
            emit(I if split else B, first)
            emit(I if split else B, last)
        for _ in range(d - rank):
            emit(I if split else B, first)
            if split:
                emit(W, first)
        for stage in (last, first) if split else ():
            while count.get((W, stage), 0) < n:
                emit(W, stage)
        rows.append([a for a in order if a.microbatch < m])
    return rows


def zb_v(num_ranks: int, num_microbatches: int, stages_per_rank: int = 2, *,
         costs: CostModel | None = None) -> Schedule:
    """ZB-V: the zero-bubble order on V placement (two half-depth stages per rank).

    rank r (s0 = r, s1 = 2d-1-r): warm-up = 2(d-r)-1 F s0, r x (F s1, F s0), (d-r) x (F s1 I s1 W s1)
            | steady: F s0 I s0 W s0 F s1 I s1 W s1 | cool-down: r x (I s0 I s1), (d-r) x (I s0 W s0),
            then the held W s1 and W s0.
    d=4, m=8, first 32 of 51 slots (0.5 per pass; lowercase: local stage 1):
        r0  F0 F1 F2 F3 F4 F5 F6 f0 i0 w0 f1 i1 w1 f2 i2 w2 f3 i3 w3 F7 I0 W0 f4 i4 w4 I1 W1 f5 i5 w5 I2 W2 ...
        r1  .  F0 F1 F2 F3 F4 f0 F5 f1 i0 w0 f2 i1 w1 f3 i2 w2 F6 I0 W0 f4 i3 w3 F7 I1 W1 f5 i4 w4 I2 W2 f6 ...
        r2  .  .  F0 F1 F2 f0 F3 f1 F4 f2 i0 w0 f3 i1 w1 F5 I0 W0 f4 i2 w2 F6 I1 W1 f5 i3 w3 F7 I2 W2 f6 i4 ...
        r3  .  .  .  F0 f0 F1 f1 F2 f2 F3 f3 i0 w0 F4 I0 W0 f4 i1 w1 F5 I1 W1 f5 i2 w2 F6 I2 W2 f6 i3 w3 F7 ...
    Peak = min(2d, ~2m) activation units = d rank units (1F1B's); with unit costs the bubble is the
    fill only: 0.035 at d = 8, m = 32 (ZB-H1 on the same d, m: 0.068). With ``costs`` given, W passes
    are also re-placed in time under them and the faster order (within the same peak) is kept.
    """
    _two_stages("zb-v", stages_per_rank)
    placement = Placement.v(num_ranks, 2)
    costs = costs or _UNIT
    costs.check_stages(placement.num_stages)
    best = _best_of(placement, zb_v_rows(num_ranks, num_microbatches), costs)
    return Schedule(best.rows, placement, num_microbatches, "zb-v")


def one_f_one_b_v(num_ranks: int, num_microbatches: int, stages_per_rank: int = 2) -> Schedule:
    """1F1B-V: ZB-V's forward/backward order with each I and W merged into one full B.

    rank r (s0 = r, s1 = 2d-1-r): warm-up = 2(d-r)-1 F s0, r x (F s1, F s0), (d-r) x (F s1 B s1)
            | steady: F s0 B s0 F s1 B s1 | cool-down: r x (B s0 B s1), then (d-r) x B s0.
    d=4, m=8, first 32 of 60 slots (0.5 per slot, a B takes two; lowercase: local stage 1):
        r0  F0 F1 F2 F3 F4 F5 F6 f0 b0 .  f1 b1 .  f2 b2 .  f3 b3 .  F7 .  .  .  B0 .  f4 b4 .  .  B1 .  f5 ...
        r1  .  F0 F1 F2 F3 F4 f0 F5 f1 .  b0 .  f2 b1 .  f3 b2 .  F6 .  .  B0 .  f4 b3 .  F7 B1 .  f5 b4 .  ...
        r2  .  .  F0 F1 F2 f0 F3 f1 F4 f2 .  .  b0 .  f3 b1 .  F5 .  B0 .  f4 b2 .  F6 B1 .  f5 b3 .  F7 B2 ...
        r3  .  .  .  F0 f0 F1 f1 F2 f2 F3 f3 .  .  .  b0 .  F4 B0 .  f4 b1 .  F5 B1 .  f5 b2 .  F6 B2 .  f6 ...
    Peak d rank units (1F1B's). Without a W to fill the drain its bubble stays near 1F1B-interleaved's:
    0.127 at d = 8, m = 32 with unit costs (1F1B: 0.18, ZB-V: 0.035).
    """
    _two_stages("1f1b-v", stages_per_rank)
    rows = zb_v_rows(num_ranks, num_microbatches, split=False)
    return Schedule(tuple(map(tuple, rows)), Placement.v(num_ranks, 2), num_microbatches, "1f1b-v")
