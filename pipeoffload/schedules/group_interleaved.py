"""PipeOffload's group-interleaved 1F1B: g microbatches pass each stage back to back.

Closed form of the per-rank order (re-derived from the reference scheduler's slot layout; see
docs/offload.md). Rank i, microbatch ``mb = q g + j`` (group q, 0 <= j < g), local stage c:

    slotF(c, mb) = 3 g v q + 3 k g c + 3 j + i + 3 g floor(c / Q)
    slotB(c, mb) = 3 g v q + lastF_i + 3 (d-1-i) + 1 + 3 k g c' + 3 j + 3 g floor(c' / Q)
    slotW(c, mb) = slotB(c, mb) + 1,    c' = v-1-c,   lastF_i = slotF(v-1, 0) for q = 0

with ``k = ceil(ceil(d/2) / g)`` (1 whenever g >= d/2) and ``Q = v / gcd(v, k)``. A rank runs its
actions sorted by slot; the simulator then times them as early as dependencies allow. F slots are
i (mod 3), backward slots i+1 (mod 3) and W slots i+2 (mod 3), so every rank repeats the pattern
"g forwards of one stage, interleaved with the backward and weight passes of an earlier group".

With g = d this is an interleaved 1F1B whose peak memory equals 1F1B's (v d activation units on
rank 0); smaller g lowers the peak to g (v-1) + d units at the cost of (d-g)(v-1) more idle slots.
"""
from __future__ import annotations

from math import gcd

from pipeoffload.errors import ConfigError
from pipeoffload.ir import Action, ActionKind, Schedule
from pipeoffload.placement import Placement

F, B, I, W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W  # noqa: E741

_BACKWARD_MODES = ("split", "full")


def default_group_size(num_ranks: int) -> int:
    """⌈d/2⌉: the smallest group that needs no spacing between stages (lowest memory, more bubble)."""
    return (num_ranks + 1) // 2


def _check(num_ranks: int, group_size: int, backward: str) -> None:
    if isinstance(group_size, bool) or not isinstance(group_size, int) or not 1 <= group_size <= num_ranks:
        raise ConfigError.named(lambda n: (
            f"{n.given('group_size', repr(group_size))}: must be an integer in 1..{num_ranks} "
            f"({n.given('num_ranks', num_ranks)}); use {default_group_size(num_ranks)} (lowest memory) up to "
            f"{num_ranks} (lowest bubble)"))
    if backward not in _BACKWARD_MODES:
        raise ConfigError.named(lambda n: f"{n.given('backward', repr(backward))}: must be 'split' (I and W) or "
                                "'full' (B)")


def rank_order(rank: int, num_ranks: int, num_microbatches: int, stages_per_rank: int,
               group_size: int) -> list[tuple[int, ActionKind, int, int]]:
    """(slot, kind, local stage, microbatch) for every pass of one rank, sorted by slot.

    ``kind`` is F, I (the input-gradient backward; a B with ``backward="full"``) or W.
    """
    d, v, g, i = num_ranks, stages_per_rank, group_size, rank
    spacing = -(-default_group_size(d) // g)  # k: groups of one stage are spaced k*3g slots apart
    period = v // gcd(v, spacing)  # Q

    def offset(c: int) -> int:
        return 3 * spacing * g * c + 3 * g * (c // period)

    last_f = offset(v - 1) + i
    slots = []
    for mb in range(num_microbatches):
        q, j = divmod(mb, g)
        base = 3 * g * v * q + 3 * j
        for c in range(v):
            slots.append((base + offset(c) + i, F, c, mb))
            back = base + last_f + 3 * (d - 1 - i) + 1 + offset(v - 1 - c)
            slots.append((back, I, c, mb))
            slots.append((back + 1, W, c, mb))
    slots.sort()
    return slots


def group_interleaved(num_ranks: int, num_microbatches: int, stages_per_rank: int = 2, *,
                      group_size: int | None = None, backward: str = "split") -> Schedule:
    """Group-interleaved 1F1B on loop placement (stage c d + i on rank i).

    d=4, v=2, g=2, m=8, rank 0 (stage 4 is rank 0's second stage):
      0F0 0F1 4F0 4F1 0F2 0F3 4I0 4W0 4F2 4I1 4W1 4F3 0I0 0W0 0F4 0I1 0W1 0F5 ...
    ``backward="full"`` emits one B where the split form has I then W.
    """
    d, m, v = num_ranks, num_microbatches, stages_per_rank
    g = default_group_size(d) if group_size is None else group_size
    _check(d, g, backward)
    placement = Placement.loop(d, v)
    full = backward == "full"
    rows = []
    for rank in range(d):
        stages = placement.stages_of(rank)
        row = []
        for _, kind, c, mb in rank_order(rank, d, m, v, g):
            if kind is F:
                row.append(Action(F, stages[c], mb))
            elif kind is I:
                row.append(Action(B if full else I, stages[c], mb))
            elif not full:
                row.append(Action(W, stages[c], mb))
        rows.append(tuple(row))
    return Schedule(tuple(rows), placement, m, "group-interleaved")
