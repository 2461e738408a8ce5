"""What each action kind means, defined once: its lane, its inputs, its duration and its memory effect.

The simulator takes each action's inputs, duration and memory amount from here; the validator and
the offload pass run on the integer-coded form below (the validator's order rules are the "waits
for" column read as list order on one rank). The rules, per kind (see docs/decisions.md):

  kind      lane     waits for (same rank unless a transfer is named)            memory, at which instant
  F         compute  F of the previous stage (its RECV_F when lowered)           + activation at start
                                                                                   (nothing if recomputed)
  B / I     compute  own F; the next stage's backward (its RECV_B when lowered);  B: - all at end
                     an OFFLOADed activation's RELOAD (the wait is a stall)        I: - (1 - w_fraction) at end
  W         compute  own I; its RELOAD_W when the I -> W window was offloaded      - the rest at end
                     (the wait is a stall)
  R         compute  own F                                                        + activation at start
  SEND_*    send     nothing (posted without blocking; holds its lane message_time, then arrives
                     p2p_time later)
  RECV_F/B  recv     the matching SEND on the neighbouring rank, + p2p_time; then
                     holds its lane message_time
  OFFLOAD   copy     own F; the rank's copy engine (FIFO) and host link          - device copy at copy end
  RELOAD    copy     own OFFLOAD; the copy engine and host link                  + at copy start
  OFFLOAD_W copy     own I; as OFFLOAD (the second window: what W needs)         - that part at copy end
  RELOAD_W  copy     own OFFLOAD_W; as RELOAD                                    + at copy start
  WAIT      wait     own OFFLOAD's copy end (the compute lane idles until then)   nothing

An activation has two offload windows: F -> backward (OFFLOAD/RELOAD: all of it) and, when the
backward is split, I -> W (OFFLOAD_W/RELOAD_W: the ``w_fraction`` part that W still needs). Each is
optional; the copy kinds of both windows share the rank's copy engine and host link. When both are
offloaded the host keeps, from RELOAD to RELOAD_W, the part W needs (``host_copy_kept``): OFFLOAD_W
then copies nothing (it takes no copy time and frees the device part when the engine reaches it).

A WAIT (text ``3WAIT5``) holds the rank's compute lane until the OFFLOAD of (stage, microbatch) has
completed: zero duration, no memory effect of its own. The lowering pass puts one before a warm-up
forward so that forwards run no faster than the host link drains them (it lowers the peak where
forwards would otherwise pile up on the device faster than their copies leave). It waits like a
receive: from the lane's clock until its input is done. Only the first window has one.

A compute-only schedule (no SEND/RECV) is timed with implicit transfers: a producer on another rank
adds ``p2p_time + 2 * message_time`` (``message_time`` is 0 unless the profiler measured it).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from pipeoffload.ir import ActionKind, Schedule

if TYPE_CHECKING:  # pragma: no cover
    from pipeoffload.costs import CostModel

K = ActionKind
KINDS: tuple[ActionKind, ...] = tuple(ActionKind)
CODE: dict[ActionKind, int] = {kind: code for code, kind in enumerate(KINDS)}
F, B, I, W, R = (CODE[k] for k in (K.F, K.B, K.I, K.W, K.R))  # noqa: E741
SEND_F, RECV_F, SEND_B, RECV_B = (CODE[k] for k in (K.SEND_F, K.RECV_F, K.SEND_B, K.RECV_B))
OFFLOAD, RELOAD = CODE[K.OFFLOAD], CODE[K.RELOAD]
OFFLOAD_W, RELOAD_W = CODE[K.OFFLOAD_W], CODE[K.RELOAD_W]
WAIT = CODE[K.WAIT]

# lanes: where an action runs; HOLD: the compute lane waits (for a copy) without computing
COMPUTE, SEND, RECV, COPY, HOLD = 0, 1, 2, 3, 4
LANE = np.array([COMPUTE] * 5 + [SEND, RECV, SEND, RECV] + [COPY, COPY] + [COPY, COPY] + [HOLD], dtype=np.int8)
# device -> host copies (the others of lane COPY are host -> device); per kind code
TO_HOST = np.zeros(len(KINDS), dtype=bool)
TO_HOST[[OFFLOAD, OFFLOAD_W]] = True
assert len(LANE) == len(KINDS)


def durations(costs: CostModel, num_stages: int) -> np.ndarray:
    """Lane time of each (kind code, stage): the compute time of a compute kind; ``message_time`` for a
    SEND or RECV (what the runtime's lane spends on it besides waiting; 0 by default); zero for copy
    and wait kinds (copies are timed by size)."""
    table = np.zeros((len(KINDS), num_stages))
    for code, lookup in ((F, costs.f), (B, costs.b), (I, costs.i), (W, costs.w), (R, costs.r)):
        table[code] = [lookup(s) for s in range(num_stages)]
    table[(LANE == SEND) | (LANE == RECV)] = costs.message_time
    return table


@dataclass(frozen=True)
class Inputs:
    """Per action (flat, in rank order): up to two keys it waits for (-1: none) and their delays."""

    first: np.ndarray
    first_delay: np.ndarray
    second: np.ndarray
    second_delay: np.ndarray
    reload: np.ndarray  # the RELOAD key a backward (RELOAD_W key a W) waits for (-1 for other kinds)


class CodedSchedule:
    """A schedule as flat integer arrays (kind code, stage, microbatch, rank; list order per rank).

    A *key* names one action across ranks: ``(kind * num_stages + stage) * num_microbatches + mb``.
    Hot loops index lists by keys instead of hashing ``Action`` objects.
    """

    def __init__(self, schedule: Schedule) -> None:
        rows = schedule.actions
        code = CODE
        self._set(schedule, np.array([len(r) for r in rows], dtype=np.int64),
                  np.array([code[a.kind] for r in rows for a in r], dtype=np.int64),
                  np.array([a.stage for r in rows for a in r], dtype=np.int64),
                  np.array([a.microbatch for r in rows for a in r], dtype=np.int64))

    @classmethod
    def of_arrays(cls, schedule: Schedule, lengths: np.ndarray, kind: np.ndarray, stage: np.ndarray,
                  microbatch: np.ndarray) -> CodedSchedule:
        """The coded form of ``schedule`` from arrays its builder already has (they must be its actions)."""
        out = cls.__new__(cls)
        out._set(schedule, lengths, kind, stage, microbatch)
        return out

    def _set(self, schedule: Schedule, lengths: np.ndarray, kind: np.ndarray, stage: np.ndarray,
             microbatch: np.ndarray) -> None:
        self.rows = schedule.actions  # what this form codes (``coded`` checks it against a schedule's)
        self.placement = schedule.placement
        self.num_ranks = len(lengths)
        self.num_stages = schedule.num_stages
        self.lengths = lengths
        self.offsets = np.concatenate(([0], np.cumsum(self.lengths)))
        self.kind, self.stage, self.microbatch = kind, stage, microbatch
        used = 1 + int(self.microbatch.max()) if len(self.microbatch) else 0
        self.num_microbatches = max(schedule.num_microbatches, used)
        self.rank = np.repeat(np.arange(self.num_ranks, dtype=np.int64), self.lengths)
        self.step = np.arange(len(self.kind), dtype=np.int64) - self.offsets[self.rank]

    @property
    def num_keys(self) -> int:
        return len(KINDS) * self.num_stages * self.num_microbatches

    def key_of(self, kind: int | np.ndarray, stage: int | np.ndarray, mb: int | np.ndarray) -> np.ndarray:
        return (np.asarray(kind) * self.num_stages + stage) * self.num_microbatches + mb

    @cached_property
    def forward_without_backward(self) -> tuple[int, int] | None:
        """The first (stage, microbatch) with an F but no B or I, where the schedule has backwards (a
        schedule of forwards only, an evaluation's, has none to miss); None where every F has one. The
        one rule of ``validate`` that ``simulate`` checks (once per coded form: one vectorised pass)."""
        ids = self.stage * self.num_microbatches + self.microbatch
        size = self.num_stages * self.num_microbatches
        forwards = np.bincount(ids[self.kind == F], minlength=size)
        backward = (self.kind == B) | (self.kind == I)
        backwards = np.bincount(ids[backward], minlength=size)
        if not backwards.any():
            return None
        missing = np.flatnonzero((forwards > 0) & (backwards == 0))
        return divmod(int(missing[0]), self.num_microbatches) if len(missing) else None

    @cached_property
    def keys(self) -> np.ndarray:
        return self.key_of(self.kind, self.stage, self.microbatch)

    def action(self, key: int) -> tuple[ActionKind, int, int]:
        rest, mb = divmod(int(key), self.num_microbatches)
        kind, stage = divmod(rest, self.num_stages)
        return KINDS[kind], stage, mb

    @cached_property
    def lowered(self) -> bool:
        return bool(np.any(LANE[self.kind] == SEND) or np.any(LANE[self.kind] == RECV))

    @cached_property
    def host_copy_kept(self) -> np.ndarray:
        """Per (stage, microbatch): both windows offloaded, so the host keeps what W needs from the
        first window's copy and OFFLOAD_W copies nothing."""
        out = np.zeros((2, self.num_stages, self.num_microbatches), dtype=bool)
        for row, code in enumerate((OFFLOAD, OFFLOAD_W)):
            mask = self.kind == code
            out[row, self.stage[mask], self.microbatch[mask]] = True
        return out[0] & out[1]

    @cached_property
    def recomputed(self) -> np.ndarray:
        """Per (stage, microbatch): whether an R re-creates the activation (its F then keeps nothing)."""
        out = np.zeros((self.num_stages, self.num_microbatches), dtype=bool)
        mask = self.kind == R
        out[self.stage[mask], self.microbatch[mask]] = True
        return out

    def inputs(self, p2p_time: float) -> Inputs:
        """What each action waits for, from the rules in the module docstring. Each rule runs on the
        flat indices of its kinds' actions (not on masks over all of them)."""
        kind, stage, mb, rank = self.kind, self.stage, self.microbatch, self.rank
        owner = np.asarray(self.placement.stage_to_rank, dtype=np.int64)
        last = self.num_stages - 1
        n = len(kind)
        first, second = np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)
        first_delay, second_delay = np.zeros(n), np.zeros(n)
        reload = np.full(n, -1, dtype=np.int64)
        lowered = self.lowered
        key = self.key_of
        at = [np.flatnonzero(kind == code) for code in range(len(KINDS))]  # each kind's actions

        def of(code: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            j = at[code]
            return j, stage[j], mb[j]

        # F: the previous stage's F (or its RECV_F when lowered and on another rank)
        j = at[F][stage[at[F]] > 0]
        s, m = stage[j], mb[j]
        cross = owner[s - 1] != rank[j]
        if lowered:
            first[j] = np.where(cross, key(RECV_F, s, m), key(F, s - 1, m))
        else:
            first[j] = key(F, s - 1, m)
            first_delay[j[cross]] = p2p_time
        # W: own I, and its RELOAD_W; R: own F
        j, s, m = of(W)
        first[j] = key(I, s, m)
        reload[j] = key(RELOAD_W, s, m)
        j, s, m = of(R)
        first[j] = key(F, s, m)
        # B / I: own F and its RELOAD, then the next stage's backward (or its RECV_B)
        back = np.concatenate((at[B], at[I]))
        s, m = stage[back], mb[back]
        first[back] = key(F, s, m)
        reload[back] = key(RELOAD, s, m)
        j = back[s < last]
        cross = owner[stage[j] + 1] != rank[j]
        if lowered:
            via_recv = j[cross]
            second[via_recv] = key(RECV_B, stage[via_recv], mb[via_recv])
            direct = j[~cross]
        else:
            direct = j
            second_delay[j[cross]] = p2p_time
        s, m = stage[direct] + 1, mb[direct]
        second[direct] = key(np.where(self._has_input_gradient()[s, m], I, B), s, m)
        # receives: the matching send, one transfer later
        j, s, m = of(RECV_F)
        first[j] = key(SEND_F, s - 1, m)
        first_delay[j] = p2p_time
        j, s, m = of(RECV_B)
        first[j] = key(SEND_B, s + 1, m)
        first_delay[j] = p2p_time
        # copies: an OFFLOAD starts after its F, a RELOAD after its OFFLOAD (neither blocks the lane);
        # the second window: OFFLOAD_W after its I, RELOAD_W after its OFFLOAD_W; a wait: the end of
        # its own OFFLOAD's copy
        for code, after in ((OFFLOAD, F), (RELOAD, OFFLOAD), (OFFLOAD_W, I), (RELOAD_W, OFFLOAD_W), (WAIT, OFFLOAD)):
            j, s, m = of(code)
            first[j] = key(after, s, m)
        return Inputs(first, first_delay, second, second_delay, reload)

    def _has_input_gradient(self) -> np.ndarray:
        """Per (stage, microbatch): whether its backward is an I (else a B is assumed)."""
        out = np.zeros((self.num_stages, self.num_microbatches), dtype=bool)
        mask = self.kind == I
        out[self.stage[mask], self.microbatch[mask]] = True
        return out


def coded(schedule: Schedule) -> CodedSchedule:
    """The integer-coded form of ``schedule``: the one it carries (``Schedule.coded``) when that codes
    these very actions, else built anew (a caller that needs it twice keeps it, or ``with_coded``)."""
    carried = schedule.coded
    if carried is not None and carried.rows is schedule.actions:
        return carried
    return CodedSchedule(schedule)


def with_coded(schedule: Schedule, form: CodedSchedule | None = None) -> Schedule:
    """``schedule`` carrying its coded form (``form``, which must code its actions, or built here);
    ``schedule`` itself when it already carries it."""
    if form is None:
        form = coded(schedule)
    if schedule.coded is form:
        return schedule
    return Schedule(schedule.actions, schedule.placement, schedule.num_microbatches, schedule.name, coded=form)


def memory_effects(c: CodedSchedule, costs: CostModel) -> list[float]:
    """Per action (flat order): the activation units it adds to (+) or frees from (-) the device, or for
    a copy the units it moves. Instants: F and R at their start, B, I and W at their end; an OFFLOAD
    frees at the end of its copy and a RELOAD allocates at the start of its copy.

    The amounts depend only on each activation's own actions, which all run on its rank in list order,
    so they are known before any timing.
    """
    return memory_amounts(c, costs).tolist()


def memory_amounts(c: CodedSchedule, costs: CostModel) -> np.ndarray:
    """``memory_effects`` as a float array (what the simulator reads; no float object per action)."""
    fast = _memory_effects_in_order(c, costs)
    return fast if fast is not None else np.asarray(_memory_effects_in_turn(c, costs), dtype=float)


def _memory_effects_in_turn(c: CodedSchedule, costs: CostModel) -> list[float]:
    """``memory_effects`` action by action, for any order."""
    size = [costs.act(s) for s in range(c.num_stages)]
    keep_fraction = [costs.w_fraction_of(s) for s in range(c.num_stages)]
    m = c.num_microbatches
    recomputed = c.recomputed
    resident: dict[int, float] = {}
    on_host: dict[int, float] = {}
    out = [0.0] * len(c.kind)
    for index, (kind, stage, mb) in enumerate(zip(c.kind.tolist(), c.stage.tolist(), c.microbatch.tolist())):
        key = stage * m + mb
        if kind == F:
            amount = 0.0 if recomputed[stage, mb] else size[stage]
            resident[key] = amount
        elif kind == B or kind == W:
            amount = -resident.pop(key, 0.0)
        elif kind == I:
            held = resident.get(key, 0.0)
            keep = held * keep_fraction[stage]
            amount = keep - held
            resident[key] = keep
        elif kind == R:
            amount = size[stage]
            resident[key] = resident.get(key, 0.0) + amount
        elif kind == OFFLOAD or kind == OFFLOAD_W:
            amount = resident.get(key, 0.0)
            resident[key] = 0.0
            on_host[key] = amount
        elif kind == RELOAD or kind == RELOAD_W:
            amount = on_host.pop(key, 0.0)
            resident[key] = resident.get(key, 0.0) + amount
        else:
            continue
        out[index] = amount
    return out


def copy_units(c: CodedSchedule, amounts: list[float] | np.ndarray) -> np.ndarray:
    """Per action: activation units its copy moves over the host link (0 for non-copies, and for an
    OFFLOAD_W whose host copy was kept); copy time is this times the per-unit D2H or H2D time."""
    amount = np.asarray(amounts, dtype=float)
    moves = np.where(LANE[c.kind] == COPY, amount, 0.0)
    kept = (c.kind == OFFLOAD_W) & c.host_copy_kept[c.stage, c.microbatch]
    moves[kept] = 0.0
    return moves


def host_effects(c: CodedSchedule, costs: CostModel, amounts: list[float] | np.ndarray) -> np.ndarray:
    """Per action: activation units it adds to (+) or frees from (-) host memory. An offload adds at its
    copy start, a reload frees at its copy end. With the host copy kept (``host_copy_kept``) RELOAD
    frees only the part W does not need, OFFLOAD_W adds nothing, and RELOAD_W frees the rest."""
    amount = np.asarray(amounts, dtype=float)
    out = np.where(TO_HOST[c.kind], amount, np.where(LANE[c.kind] == COPY, -amount, 0.0))
    kept = c.host_copy_kept[c.stage, c.microbatch]
    if np.any(kept):
        fraction = np.array([costs.w_fraction_of(s) for s in range(c.num_stages)])[c.stage]
        out[kept & (c.kind == OFFLOAD_W)] = 0.0
        sel = kept & (c.kind == RELOAD)
        out[sel] = -amount[sel] * (1.0 - fraction[sel])
    return out


AT_END = np.zeros(len(KINDS), dtype=bool)
AT_END[[B, I, W]] = True  # compute kinds whose memory effect happens at their end (F, R: at their start)


def _memory_effects_in_order(c: CodedSchedule, costs: CostModel) -> np.ndarray | None:
    """``memory_effects`` without a loop when every activation's actions come in a valid order:
    F first; then an R, or an OFFLOAD and its RELOAD, before its one backward (B, or I then W); and
    for a split backward optionally OFFLOAD_W and RELOAD_W between I and W. Each backward then finds
    exactly the activation's size resident (a recomputed F stores nothing, R or RELOAD bring the size
    back), and W its ``w_fraction`` part. None when that order does not hold.

    Gathers are one-dimensional (an activation's ``stage * num_microbatches + microbatch``, offset
    by a kind's block of keys), and each kind's amount is computed on that kind's actions only."""
    kind, keys = c.kind, c.keys
    index = np.full(c.num_keys, -1, dtype=np.int64)
    flat = np.arange(len(keys), dtype=np.int64)
    index[keys] = flat
    if np.any(index[keys] != flat):  # a duplicate action
        return None
    per_kind = c.num_stages * c.num_microbatches  # keys of one kind: a block of this many
    lane = LANE[kind]
    touched = np.flatnonzero((kind != F) & (lane != SEND) & (lane != RECV) & (lane != HOLD))
    here, tk = flat[touched], kind[touched]
    activation = keys[touched] - tk * per_kind  # stage * num_microbatches + microbatch
    # where each kind of a touched action's activation is in the flat list (-1: absent)
    f, b, i, r, off, rel, w, off_w, rel_w = (index[code * per_kind + activation]
                                             for code in (F, B, I, R, OFFLOAD, RELOAD, W, OFFLOAD_W, RELOAD_W))
    back = np.maximum(b, i)  # the one backward (both present is refused below)
    ok = (f >= 0) & (f < here) & ~((b >= 0) & (i >= 0))
    ok &= (tk != W) | ((i >= 0) & (i < here))
    ok &= (r < 0) | ((f < r) & (r < back) & (off < 0))
    ok &= (off < 0) | ((f < off) & (off < rel) & (rel < back))
    ok &= (rel < 0) | (off >= 0)
    ok &= (off_w < 0) | ((i >= 0) & (i < off_w) & (off_w < rel_w) & (rel_w < w))
    ok &= (rel_w < 0) | (off_w >= 0)
    if not np.all(ok):
        return None
    size = np.array([costs.act(s) for s in range(c.num_stages)])
    fraction = np.array([costs.w_fraction_of(s) for s in range(c.num_stages)])
    recomputed = c.recomputed.ravel()
    stage = c.stage
    out = np.zeros(len(kind))
    for code in (F, B, I, W, R, OFFLOAD, RELOAD, OFFLOAD_W, RELOAD_W):
        sel = np.flatnonzero(kind == code)
        if not len(sel):
            continue
        held = size[stage[sel]]  # per action the same operations as on the whole arrays
        if code == F:
            out[sel] = np.where(recomputed[keys[sel] - F * per_kind], 0.0, held)
        elif code == B:
            out[sel] = -held
        elif code in (I, W, OFFLOAD_W, RELOAD_W):
            keep = held * fraction[stage[sel]]
            out[sel] = keep - held if code == I else -keep if code == W else keep
        else:  # R, OFFLOAD, RELOAD
            out[sel] = held
    return out


# ---- the same rules, one action at a time ----------------------------------------------------------
# For code that places, replays or runs actions one by one: the generators' replays (zero_bubble,
# v_shape), the comm pass and the runtime's dispatch. ``tests/unit/test_semantics_scalar.py`` checks
# them against the arrays above (``CodedSchedule.inputs``, ``memory_effects``) on every family.

_LANE_OF = {kind: int(LANE[CODE[kind]]) for kind in KINDS}  # LANE as plain ints, for scalar code
_LANE_NAMES = {COMPUTE: "compute", SEND: "send", RECV: "receive", COPY: "copy", HOLD: "wait"}
_COMPUTE_KINDS = tuple(k for k in KINDS if _LANE_OF[k] == COMPUTE)
_COMM_KINDS = frozenset(k for k in KINDS if _LANE_OF[k] in (SEND, RECV))

# A producer: (the kinds that can fill the role, the stage). The next stage's backward is (I, B): its
# I when that backward is split, else its B; code that keeps one end time per backward reads either.
Producer = tuple[tuple[ActionKind, ...], int]
_GRADIENT = (K.I, K.B)

# Compute kinds whose cross-stage input travels as (send posted by the producing stage after its
# action, receive posted by the consuming stage before its action), both named by their own stage.
_CARRIERS: dict[ActionKind, tuple[ActionKind, ActionKind]] = {
    K.F: (K.SEND_F, K.RECV_F), K.B: (K.SEND_B, K.RECV_B), K.I: (K.SEND_B, K.RECV_B),
}
# The RELOAD each compute kind waits for, when its window was offloaded (the wait is a stall).
RELOAD_BEFORE: dict[ActionKind, ActionKind] = {K.B: K.RELOAD, K.I: K.RELOAD, K.W: K.RELOAD_W}
# Each window's (offload, reload) kinds, and the compute kind that opens it (the copy waits for it).
WINDOWS: tuple[tuple[ActionKind, ActionKind, ActionKind], ...] = (
    (K.OFFLOAD, K.RELOAD, K.F), (K.OFFLOAD_W, K.RELOAD_W, K.I))

# The kinds after which nothing of a (stage, microbatch) activation is left on the device: B, and W
# (the part I kept). The runtime drops the activation's saved tensors after them.
ENDS_ACTIVATION = frozenset({K.B, K.W})


def unknown_kind(kind: object, who: str) -> ValueError:
    """The one error for a kind a consumer of these rules has no rule for."""
    known = ", ".join(k.value for k in KINDS)
    return ValueError(f"action kind {kind!s}: {who} has no rule for it (kinds with rules: {known}); "
                      "define it in pipeoffload/semantics.py and in every consumer before using it")


def lane_of(kind: ActionKind) -> int:
    """The lane code (COMPUTE, SEND, RECV, COPY, HOLD) of ``kind``."""
    lane = _LANE_OF.get(kind)
    if lane is None:
        raise unknown_kind(kind, "semantics.LANE")
    return lane


def lane_name(kind: ActionKind) -> str:
    return _LANE_NAMES[lane_of(kind)]


def producers(kind: ActionKind, stage: int, num_stages: int) -> tuple[Producer, ...]:
    """What an action of ``kind`` on ``stage`` waits for, same microbatch, in a compute-only schedule.

    In the order ``CodedSchedule.inputs`` lists them (first, second). A producer on another rank adds a
    transfer (``p2p_time``); in a lowered schedule the consumer's receive stands in for it
    (``receive_of``). The RELOAD a backward (or RELOAD_W a W) may stall on is not listed
    (``RELOAD_BEFORE``).
    """
    if kind is K.F:
        return (((K.F,), stage - 1),) if stage > 0 else ()
    if kind is K.B or kind is K.I:
        own: Producer = ((K.F,), stage)
        return (own, (_GRADIENT, stage + 1)) if stage < num_stages - 1 else (own,)
    if kind is K.W:
        return (((K.I,), stage),)
    if kind is K.R or kind is K.OFFLOAD:
        return (((K.F,), stage),)
    if kind is K.RELOAD:
        return (((K.OFFLOAD,), stage),)
    if kind is K.OFFLOAD_W:
        return (((K.I,), stage),)
    if kind is K.RELOAD_W:
        return (((K.OFFLOAD_W,), stage),)
    if kind is K.WAIT:
        return (((K.OFFLOAD,), stage),)
    if kind is K.SEND_F or kind is K.SEND_B:
        return ()
    if kind is K.RECV_F:
        return (((K.SEND_F,), stage - 1),)
    if kind is K.RECV_B:
        return (((K.SEND_B,), stage + 1),)
    raise unknown_kind(kind, "semantics.producers")


def _consumed_by() -> dict[ActionKind, list[tuple[ActionKind, int]]]:
    """Per kind, the compute kinds that can wait for it and their stage offset, read off ``producers``
    in the middle of a long pipeline (``consumers`` checks each against the real boundaries); ordered
    by offset, then kind."""
    middle = 2  # stage 2 of 5: every producer of it is a real stage
    out: dict[ActionKind, list[tuple[ActionKind, int]]] = {}
    for offset in (-1, 0, 1):
        for consumer in _COMPUTE_KINDS:
            for kinds, stage in producers(consumer, middle, 2 * middle + 1):
                for kind in kinds:
                    if middle - stage == offset:
                        out.setdefault(kind, []).append((consumer, offset))
    return out


_CONSUMED_BY = _consumed_by()


def consumers(kind: ActionKind, stage: int, num_stages: int) -> tuple[tuple[ActionKind, int], ...]:
    """The compute actions (kind, stage) that wait for ``kind`` on ``stage``: ``producers`` read backwards."""
    out = []
    for consumer, offset in _CONSUMED_BY.get(kind, ()):
        other = stage + offset
        if 0 <= other < num_stages and any(kind in kinds and s == stage
                                           for kinds, s in producers(consumer, other, num_stages)):
            out.append((consumer, other))
    return tuple(out)


def receive_of(kind: ActionKind) -> ActionKind | None:
    """The receive that carries ``kind``'s input from another rank (None: its inputs are all local)."""
    if lane_of(kind) != COMPUTE:
        raise ValueError(f"action kind {kind!s}: only compute kinds have a receive (lane {lane_name(kind)})")
    pair = _CARRIERS.get(kind)
    return None if pair is None else pair[1]


def transfers(kind: ActionKind, stage: int, stage_to_rank: tuple[int, ...]
              ) -> tuple[tuple[ActionKind, ...], tuple[ActionKind, ...]]:
    """(receives before, sends after) an action of ``kind`` on ``stage``, each at ``stage``, where a
    producer or consumer of it is on another rank: RECV_F before an F whose input is elsewhere, SEND_F
    after it when the next stage is elsewhere; RECV_B before a B/I whose output gradient comes from
    elsewhere, SEND_B after it when the previous stage is elsewhere. Other kinds: none."""
    if lane_of(kind) != COMPUTE:
        return (), ()
    n, here = len(stage_to_rank), stage_to_rank[stage]
    receives = tuple(dict.fromkeys(_CARRIERS[kind][1] for _, s in producers(kind, stage, n) if stage_to_rank[s] != here))
    sends = tuple(dict.fromkeys(_CARRIERS[k][0] for k, s in consumers(kind, stage, n) if stage_to_rank[s] != here))
    return receives, sends


def peer_stage(kind: ActionKind, stage: int, num_stages: int) -> int:
    """The stage at the other end of a transfer: a receive's sender (its producer), a send's
    receiver (the stage whose receive waits for it)."""
    lane = lane_of(kind)
    if lane == RECV:
        return producers(kind, stage, num_stages)[0][1]
    if lane == SEND:
        for receive in (k for k in KINDS if _LANE_OF[k] == RECV):
            for other in (stage - 1, stage + 1):
                if 0 <= other < num_stages and producers(receive, other, num_stages) == (((kind,), stage),):
                    return other
    raise ValueError(f"action kind {kind!s} on stage {stage}: not a transfer between stages 0..{num_stages - 1} "
                     f"(lane {_LANE_NAMES[lane]})")


def copy_moves(kind: ActionKind, size: float, w_fraction: float, host_copy_kept: bool = False) -> float:
    """Units a copy action moves over the host link (``copy_units`` one action at a time): OFFLOAD and
    RELOAD the activation, OFFLOAD_W and RELOAD_W the ``w_fraction`` part, OFFLOAD_W nothing when the
    host kept its copy; other kinds nothing."""
    if lane_of(kind) != COPY:
        return 0.0
    if kind is K.OFFLOAD or kind is K.RELOAD:
        return size
    return 0.0 if kind is K.OFFLOAD_W and host_copy_kept else size * w_fraction


def host_delta(kind: ActionKind, size: float, w_fraction: float, host_copy_kept: bool = False) -> float:
    """Units a copy adds to (+) or frees from (-) host memory (``host_effects`` one action at a time):
    offloads add what they move, reloads free it; with the host copy kept RELOAD frees only the part
    W does not need, OFFLOAD_W adds nothing and RELOAD_W frees W's part."""
    if lane_of(kind) != COPY:
        return 0.0
    if host_copy_kept and kind is K.RELOAD:
        return -(size * (1.0 - w_fraction))
    moved = size if kind is K.OFFLOAD or kind is K.RELOAD else size * w_fraction
    if kind is K.OFFLOAD_W:
        return 0.0 if host_copy_kept else moved
    return moved if kind is K.OFFLOAD else -moved


def memory_delta(kind: ActionKind, size: float, w_fraction: float, recomputed: bool = False) -> float:
    """Activation units an action of ``kind`` adds (+) to or frees (-) from its rank's device, for an
    activation of ``size`` units in a valid order; the instant is ``AT_END`` (else its start; a copy's
    at its copy end / start). F: + size (nothing when ``recomputed``: an R re-creates it); R: + size;
    B: - size; I: - (1 - w_fraction) of it; W: - the w_fraction part; OFFLOAD: - size; RELOAD: + size;
    OFFLOAD_W: - the w_fraction part; RELOAD_W: + it; SEND/RECV and WAIT: nothing. (``memory_effects`` computes I as ``size * w_fraction - size``: equal up to
    rounding; this form is the one the W-filling replay has always used.)"""
    if kind is K.F:
        return 0.0 if recomputed else size
    if kind is K.B:
        return -size
    if kind is K.I:
        return -(size * (1.0 - w_fraction))
    if kind is K.W:
        return -(size * w_fraction)
    if kind is K.R or kind is K.RELOAD:
        return size
    if kind is K.OFFLOAD:
        return -size
    if kind is K.OFFLOAD_W:
        return -(size * w_fraction)
    if kind is K.RELOAD_W:
        return size * w_fraction
    if kind in _COMM_KINDS or kind is K.WAIT:
        return 0.0
    raise unknown_kind(kind, "semantics.memory_delta")
