"""The one validator: every schedule, generated, lowered or hand-written, passes through here.

Checks per (stage, microbatch): exactly one F and either one B or one I and one W, in dependency
order on the owning rank; R only between F and the backward, at most once; OFFLOAD after F and
before the backward, RELOAD after OFFLOAD and before the backward; the second window's OFFLOAD_W
after I and before W, RELOAD_W after OFFLOAD_W and before W; WAIT after its OFFLOAD (the copy it
waits for); each stage's actions on its
placement rank; and, for lowered schedules, SEND/RECV present exactly where ranks differ and in
order. ``check_p2p_order`` dry-runs the comm order with the runtime's p2p semantics. A forward-only
schedule (evaluation: ``validate(..., forward_only=True)``) has exactly one F per (stage,
microbatch), with its SEND_F/RECV_F when lowered, and nothing else.
"""
from __future__ import annotations

import numpy as np

from pipeoffload import semantics as sem
from pipeoffload._perf import gc_paused
from pipeoffload.errors import ScheduleError
from pipeoffload.ir import COMM_KINDS, Action, ActionKind, Schedule, require_schedule
from pipeoffload.semantics import CodedSchedule, coded

K = ActionKind


_BIT = {kind: 1 << i for i, kind in enumerate(ActionKind)}
_F, _B, _I, _W, _R = (_BIT[k] for k in (K.F, K.B, K.I, K.W, K.R))
_OFF, _REL = _BIT[K.OFFLOAD], _BIT[K.RELOAD]
_OFFW, _RELW = _BIT[K.OFFLOAD_W], _BIT[K.RELOAD_W]
_SF, _RF, _SB, _RB = (_BIT[k] for k in (K.SEND_F, K.RECV_F, K.SEND_B, K.RECV_B))
_WAIT = _BIT[K.WAIT]
_BACK = _B | _I


def validate(schedule: Schedule, *, forward_only: bool = False) -> None:
    """Raise ``ScheduleError`` (rank, step, action and the marked grid) at the first violation.

    One pass over every rank's list keeps a bit set of what each (stage, microbatch) has done so
    far; each action checks its preconditions against it. A final pass checks completeness.
    ``forward_only``: the schedule of an evaluation (F and its comms only, no backward).
    """
    require_schedule(schedule, "validate")
    with gc_paused():
        c = coded(schedule)
        if forward_only or not _proved_valid(schedule, c):
            _validate(schedule, forward_only)
        if c.lowered:
            _check_p2p(schedule, c)


def _check_p2p(schedule: Schedule, c: CodedSchedule) -> None:
    if not _p2p_order_ok(c):
        _check_p2p_order(schedule)  # finds the stuck ranks and reports them


def _proved_valid(schedule: Schedule, c: CodedSchedule) -> bool:
    """The rules below, checked on whole arrays of list positions (no comm-order dry run).

    True proves the schedule passes ``_validate``; False means it may not, and ``_validate`` then finds
    the first violation and reports it. Every rule is "X runs before Y" on one rank, and all of an
    activation's actions run on its stage's rank, so comparing positions in the rank-ordered flat
    list decides it; an absent action sits at +inf.
    """
    num_stages, num_mb = schedule.num_stages, schedule.num_microbatches
    if not len(c.kind):
        return num_mb == 0
    if c.num_microbatches != num_mb or c.stage.min() < 0 or c.stage.max() >= num_stages or c.microbatch.min() < 0:
        return False
    owner = np.asarray(schedule.placement.stage_to_rank, dtype=np.int64)
    if np.any(owner[c.stage] != c.rank):
        return False
    never = len(c.kind)
    pos = np.full(c.num_keys, never, dtype=np.int64)
    flat = np.arange(len(c.kind))
    pos[c.keys] = flat
    if np.any(pos[c.keys] != flat):  # a key written twice: a duplicate action
        return False
    P = pos.reshape(len(sem.KINDS), num_stages, num_mb)
    has = P < never
    f, b, i, w, r = P[sem.F], P[sem.B], P[sem.I], P[sem.W], P[sem.R]
    off, rel = P[sem.OFFLOAD], P[sem.RELOAD]
    off_w, rel_w = P[sem.OFFLOAD_W], P[sem.RELOAD_W]
    back = np.minimum(b, i)
    lowered = c.lowered
    stages = np.arange(num_stages)
    cross_in = np.zeros(num_stages, dtype=bool)
    cross_in[1:] = owner[1:] != owner[:-1]
    cross_out = np.zeros(num_stages, dtype=bool)
    cross_out[:-1] = owner[:-1] != owner[1:]
    cin, cout = cross_in[:, None], cross_out[:, None]

    def before(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return x < y

    ok = has[sem.F].all() & ~(has[sem.B] & has[sem.I]).any()
    ok &= (has[sem.B] | (has[sem.I] & has[sem.W])).all() & (~has[sem.OFFLOAD] | has[sem.RELOAD]).all()
    # F after the previous stage's F on the same rank, or after its RECV_F
    same_in = (~cross_in & (stages > 0))
    ok &= before(f[:-1], f[1:])[same_in[1:]].all()
    # backwards: after own F, after a RELOAD if offloaded, after the next stage's backward on the same rank
    for y, present in ((b, has[sem.B]), (i, has[sem.I])):
        ok &= (before(f, y) | ~present).all()
        ok &= (~before(off, y) | before(rel, y) | ~present).all()
        same_out = ~cross_out & (stages < num_stages - 1)
        ok &= (before(back[1:], y[:-1]) | ~present[:-1])[same_out[:-1]].all()
    ok &= (before(i, w) | ~has[sem.W]).all()
    ok &= (before(f, r) & ~before(back, r) & ~before(off, r) | ~has[sem.R]).all()
    ok &= (before(f, off) & ~before(back, off) & ~before(r, off) | ~has[sem.OFFLOAD]).all()
    ok &= (before(off, rel) & ~before(back, rel) | ~has[sem.RELOAD]).all()
    # the second window: OFFLOAD_W after I and before W, RELOAD_W after it and before W
    ok &= (~has[sem.OFFLOAD_W] | has[sem.RELOAD_W]).all()
    ok &= (before(i, off_w) & before(off_w, w) | ~has[sem.OFFLOAD_W]).all()
    ok &= (before(off_w, rel_w) & before(rel_w, w) | ~has[sem.RELOAD_W]).all()
    # a wait: after the OFFLOAD whose copy it waits for
    ok &= (before(off, P[sem.WAIT]) | ~has[sem.WAIT]).all()
    if not lowered:
        return bool(ok)
    sf, rf, sb, rb = P[sem.SEND_F], P[sem.RECV_F], P[sem.SEND_B], P[sem.RECV_B]
    # comm only across ranks, and then complete
    ok &= (has[sem.SEND_F] == cout).all() & (has[sem.RECV_B] == cout).all()
    ok &= (has[sem.RECV_F] == cin).all() & (has[sem.SEND_B] == cin).all()
    ok &= (before(rf, f) | ~cin).all() & (before(f, sf) | ~cout).all()
    ok &= (before(rb, back) | ~cout).all() & (before(back, sb) | ~cin).all()
    return bool(ok)


_FORWARD_KINDS = frozenset({K.F, K.SEND_F, K.RECV_F})


def _validate(schedule: Schedule, forward_only: bool = False) -> None:
    rows = schedule.actions
    placement = schedule.placement
    num_stages, num_mb = placement.num_stages, schedule.num_microbatches
    lowered = schedule.is_lowered()
    owner = placement.stage_to_rank
    # per stage: does the activation come from / go to another rank?
    cross_in = [s > 0 and owner[s - 1] != owner[s] for s in range(num_stages)]
    cross_out = [s < num_stages - 1 and owner[s + 1] != owner[s] for s in range(num_stages)]
    state: dict[tuple[int, int], int] = {}

    def fail(reason: str, rank: int | None = None, step: int | None = None) -> None:
        action = rows[rank][step] if rank is not None and step is not None else None
        raise ScheduleError(reason, rank, step, action, rows)

    for rank, row in enumerate(rows):
        for step, a in enumerate(row):
            kind, stage, mb = a.kind, a.stage, a.microbatch
            if not (0 <= stage < num_stages and 0 <= mb < num_mb):
                fail(f"{a} is outside stages 0..{num_stages - 1} / microbatches 0..{num_mb - 1}", rank, step)
            if owner[stage] != rank:
                fail(f"stage {stage} belongs to rank {owner[stage]}", rank, step)
            key = (stage, mb)
            have = state.get(key, 0)
            bit = _BIT[kind]
            if have & bit:
                fail(f"duplicate {a}: it already ran at step {row.index(a)} on this rank; each (stage, "
                     f"microbatch) has one {kind.value} (a microbatch number written twice?)", rank, step)
            if forward_only and kind not in _FORWARD_KINDS:
                fail(f"{a} in a forward-only schedule: it has F, SEND_F and RECV_F actions only", rank, step)
            problem = _precondition(kind, stage, mb, have, state, lowered, cross_in, cross_out, owner)
            if problem:
                fail(problem, rank, step)
            state[key] = have | bit
    _check_complete(schedule, state, lowered, cross_in, cross_out, fail, forward_only)


def _precondition(kind, stage, mb, have, state, lowered, cross_in, cross_out, owner) -> str | None:  # type: ignore[no-untyped-def]
    """Why ``kind`` may not run now for (stage, mb) given what it has done (``have``), or None."""
    here = _Here(stage, mb)
    if kind is K.F:
        if stage > 0 and not cross_in[stage] and not state.get((stage - 1, mb), 0) & _F:
            return f"F of {here} runs before F of stage {stage - 1} on the same rank"
        if lowered and cross_in[stage] and not have & _RF:
            return f"F of {here} runs before its RECV_F ({stage}RECV_F{mb})"
    elif kind is K.B or kind is K.I:
        if not have & _F:
            return f"backward of {here} runs before its F"
        if have & _BACK:
            return f"{here} has both B and I: use one full backward or the I/W pair"
        if have & _OFF and not have & _REL:
            return f"{here} was offloaded and its backward runs before its RELOAD"
        nxt = stage + 1
        if nxt < len(owner) and not cross_out[stage] and not state.get((nxt, mb), 0) & _BACK:
            return f"backward of {here} runs before stage {nxt}'s on the same rank"
        if lowered and cross_out[stage] and not have & _RB:
            return f"backward of {here} runs before its RECV_B ({stage}RECV_B{mb})"
    elif kind is K.W:
        if not have & _I:
            return f"W of {here} runs before its I"
        if have & _B:
            return f"{here} has both B and W: use one full backward or the I/W pair"
        if have & _OFFW and not have & _RELW:
            return f"{here} was offloaded after its I and its W runs before its RELOAD_W"
    elif kind is K.R:
        if not have & _F or have & _BACK:
            return f"R of {here} must come after its F and before its backward"
        if have & _OFF:
            return f"{here} is both offloaded and recomputed: choose one per (stage, microbatch)"
    elif kind is K.OFFLOAD:
        if not have & _F or have & _BACK:
            return f"OFFLOAD of {here} must come after its F and before its backward"
        if have & _R:
            return f"{here} is both recomputed and offloaded: choose one per (stage, microbatch)"
    elif kind is K.RELOAD:
        if not have & _OFF or have & _BACK:
            return f"RELOAD of {here} must come after its OFFLOAD and before its backward"
    elif kind is K.OFFLOAD_W:
        if not have & _I or have & _W:
            return f"OFFLOAD_W of {here} must come after its I and before its W"
    elif kind is K.RELOAD_W:
        if not have & _OFFW or have & _W:
            return f"RELOAD_W of {here} must come after its OFFLOAD_W and before its W"
    elif kind is K.WAIT:
        if not have & _OFF:
            return (f"WAIT of {here} waits for its OFFLOAD, which does not come before it on this rank "
                    f"({stage}OFFLOAD{mb}): put the WAIT after the OFFLOAD, or drop it")
    else:  # comm
        needed = cross_out[stage] if kind in (K.SEND_F, K.RECV_B) else cross_in[stage]
        if not needed:
            return f"{stage}{kind.value}{mb} is not needed: the neighbouring stage is on the same rank"
        if kind is K.SEND_F and not have & _F:
            return f"{stage}SEND_F{mb} must come after its F"
        if kind is K.RECV_F and have & _F:
            return f"{stage}RECV_F{mb} must come before its F"
        if kind is K.SEND_B and not have & _BACK:
            return f"{stage}SEND_B{mb} must come after its backward"
        if kind is K.RECV_B and have & _BACK:
            return f"{stage}RECV_B{mb} must come before its backward"
    return None


class _Here:
    """Formats "stage s, microbatch m" only when an error message actually needs it."""

    __slots__ = ("stage", "mb")

    def __init__(self, stage: int, mb: int) -> None:
        self.stage, self.mb = stage, mb

    def __format__(self, spec: str) -> str:
        return f"stage {self.stage}, microbatch {self.mb}"


def _check_complete(schedule, state, lowered, cross_in, cross_out, fail,  # type: ignore[no-untyped-def]
                    forward_only=False) -> None:
    placement = schedule.placement
    for stage in range(placement.num_stages):
        rank = placement.rank_of(stage)
        expect = _F
        if lowered:
            back = 0 if forward_only else 1
            expect |= (_RF | _SB * back if cross_in[stage] else 0) | (_SF | _RB * back if cross_out[stage] else 0)
        for mb in range(schedule.num_microbatches):
            have = state.get((stage, mb), 0)
            here = _Here(stage, mb)
            if expect & ~have:
                missing = [k.value for k in ActionKind if expect & _BIT[k] and not have & _BIT[k]]
                last = _last_step(schedule, rank)
                end = "its list is empty" if last is None else f"its list ends at step {last} without it"
                fail(f"{here} has no {'/'.join(missing)} on rank {rank} ({end}; the schedule has microbatches "
                     f"0..{schedule.num_microbatches - 1})", rank, last)
            if forward_only:
                continue
            if not have & _B and (have & (_I | _W)) != (_I | _W):
                what = "I" if have & _W else ("W" if have & _I else "B (or I and W)")
                fail(f"{here} has no {what}: every F needs one B, or one I and one W", rank,
                     _find(schedule, rank, K.F, stage, mb))
            if have & _OFF and not have & _REL:
                fail(f"{here} is offloaded but never reloaded", rank, _find(schedule, rank, K.OFFLOAD, stage, mb))
            if have & _OFFW and not have & _RELW:
                fail(f"{here} is offloaded after its I but never reloaded (RELOAD_W)", rank,
                     _find(schedule, rank, K.OFFLOAD_W, stage, mb))


def _find(schedule: Schedule, rank: int, kind: ActionKind, stage: int, mb: int) -> int:
    return schedule.actions[rank].index(Action(kind, stage, mb))


def _last_step(schedule: Schedule, rank: int) -> int | None:
    return len(schedule.actions[rank]) - 1 if schedule.actions[rank] else None


def _partner(a: Action) -> tuple[ActionKind, int, int]:
    """The action on the other rank that completes the same transfer."""
    if a.kind == K.SEND_F:
        return (K.RECV_F, a.stage + 1, a.microbatch)
    if a.kind == K.RECV_F:
        return (K.SEND_F, a.stage - 1, a.microbatch)
    if a.kind == K.SEND_B:
        return (K.RECV_B, a.stage - 1, a.microbatch)
    return (K.SEND_B, a.stage + 1, a.microbatch)


def check_p2p_order(schedule: Schedule) -> None:
    """Dry-run the comm order as the runtime executes it: each run of consecutive SEND/RECV actions
    is posted as one batch; sends never block (they are waited for at the end of the step), and the
    rank blocks until every receive of its batch has been matched by a posted send. Raises
    ``ScheduleError`` naming every stuck rank if the order can deadlock. (A strict rendezvous, in
    which a send blocks until its receive is posted, would reject GPipe with several stages per rank.)"""
    with gc_paused():
        _check_p2p(schedule, coded(schedule))


def _p2p_order_ok(c: CodedSchedule) -> bool:
    """The dry run of ``check_p2p_order`` on integer arrays: True when no rank stays blocked.

    A rank that reaches a batch posts the batch's sends, then blocks until its receives are matched.
    So a send is posted exactly when its rank has reached the send's batch, and a rank's progress is
    one number, its frontier: the batch of the first receive it is blocked on (every batch up to it
    is posted). Only receives need stepping through, each asking whether its send's rank has reached
    the send's batch. Whether ranks get stuck does not depend on the order ranks are advanced in
    (posting only ever satisfies more receives), so any order answers it. False may also mean that
    the schedule repeats a send or posts one off its stage's rank (only the first posting counts);
    ``_check_p2p_order`` then decides.
    """
    receives = _receives_and_their_sends(c)
    if receives is None:
        return True
    need, source, batch, rank, end = receives
    n = c.num_ranks
    bounds = np.searchsorted(rank, np.arange(n + 1)).tolist()
    needs, sources, batches = need.tolist(), source.tolist(), batch.tolist()
    at = bounds[:-1]  # per rank: its next receive to match
    frontier = [batches[at[r]] if at[r] < bounds[r + 1] else end for r in range(n)]
    waiting: list[list[int]] = [[] for _ in range(n)]  # per rank: the ranks blocked on one of its sends
    ready = list(range(n))
    while ready:
        r = ready.pop()
        q, stop = at[r], bounds[r + 1]
        while q < stop and frontier[sources[q]] >= needs[q]:
            q += 1
        at[r] = q
        reached = batches[q] if q < stop else end
        if reached != frontier[r]:
            frontier[r] = reached
            if waiting[r]:
                ready.extend(waiting[r])
                waiting[r] = []
        if q < stop:
            waiting[sources[q]].append(r)
    return at == bounds[1:]


_IS_COMM = (sem.LANE == sem.SEND) | (sem.LANE == sem.RECV)
_BACKWARD = np.zeros(len(sem.KINDS), dtype=np.int64)  # per kind: 1 for the gradient's transfer
_BACKWARD[[sem.SEND_B, sem.RECV_B]] = 1
_TO_SENDER = np.zeros(len(sem.KINDS), dtype=np.int64)  # per kind: a receive's stage -> its sender's
_TO_SENDER[sem.RECV_F], _TO_SENDER[sem.RECV_B] = -1, 1


def _receives_and_their_sends(c: CodedSchedule
                              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int] | None:
    """Per receive that can block, in flat order: the batch that posts its send (``end + 1``: none),
    that batch's rank, the receive's own batch and rank; and ``end``, past every batch. Batches are
    the maximal runs of comm actions on one rank, numbered in flat order. None without comm actions.
    A receive whose send comes earlier in its own rank's list, or in the same batch, never blocks
    and is left out (one whose send comes later there waits on its own rank, which never comes)."""
    where = np.flatnonzero(_IS_COMM[c.kind])
    if not len(where):
        return None
    kind, rank = c.kind[where], c.rank[where]
    starts = np.empty(len(where), dtype=bool)
    starts[0] = True
    np.not_equal(where[1:], where[:-1] + 1, out=starts[1:])
    starts[1:] |= rank[1:] != rank[:-1]
    batch = np.cumsum(starts) - 1
    end = int(batch[-1]) + 1
    # a transfer's slot: its direction, the sending stage and the microbatch (one slot: outside)
    s, m = c.num_stages, c.num_microbatches
    stage, mb = c.stage[where] + _TO_SENDER[kind], c.microbatch[where]
    slot = (_BACKWARD[kind] * s + stage) * m + mb
    slot[(stage < 0) | (stage >= s) | (mb < 0)] = 2 * s * m
    is_send = sem.LANE[kind] == sem.SEND
    posted_in = np.full(2 * s * m + 1, end + 1, dtype=np.int64)
    sends = np.flatnonzero(is_send & (slot < 2 * s * m))[::-1]
    posted_in[slot[sends]] = batch[sends]  # written last to first: the first posting counts
    recv = np.flatnonzero(~is_send)
    need, own_batch, own_rank = posted_in[slot[recv]], batch[recv], rank[recv]
    source = rank[starts][np.minimum(need, end - 1)]
    keep = (source != own_rank) | (need > own_batch)
    return need[keep], source[keep], own_batch[keep], own_rank[keep], end


def _check_p2p_order(schedule: Schedule) -> None:
    rows = schedule.actions
    pointer = [0] * len(rows)
    posted: set[tuple[ActionKind, int, int]] = set()
    waiting: dict[tuple[ActionKind, int, int], list[int]] = {}  # send key -> ranks blocked on it
    ready = list(range(len(rows)))
    comm = COMM_KINDS
    while ready:
        rank = ready.pop()
        row, step = rows[rank], pointer[rank]
        while step < len(row):
            if row[step].kind not in comm:
                step += 1
                continue
            end = step
            while end < len(row) and row[end].kind in comm:
                end += 1
            batch = row[step:end]
            for a in batch:  # posting a batch makes its sends visible even if the rank then blocks
                if a.kind is K.SEND_F or a.kind is K.SEND_B:
                    key = (a.kind, a.stage, a.microbatch)
                    if key not in posted:
                        posted.add(key)
                        ready.extend(waiting.pop(key, ()))
            missing = next((p for a in batch if a.kind is K.RECV_F or a.kind is K.RECV_B
                            for p in (_partner(a),) if p not in posted), None)
            if missing is not None:
                waiting.setdefault(missing, []).append(rank)
                break
            step = end
        pointer[rank] = step
    stuck = [r for r, row in enumerate(rows) if pointer[r] < len(row)]
    if stuck:
        lines = []
        for rank in stuck:
            row, step = rows[rank], pointer[rank]
            end = step
            while end < len(row) and row[end].kind in comm:
                end += 1
            blocked = [str(a) for a in row[step:end] if a.kind in (K.RECV_F, K.RECV_B) and _partner(a) not in posted]
            lines.append(f"rank {rank} blocks on {{{', '.join(blocked)}}}")
        first = stuck[0]
        step = next(i for i in range(pointer[first], len(rows[first]))
                    if rows[first][i].kind in (K.RECV_F, K.RECV_B) and _partner(rows[first][i]) not in posted)
        raise ScheduleError("comm order deadlocks (receives wait on sends never posted): " + "; ".join(lines),
                            first, step, rows[first][step], rows)
