"""The classic families: GPipe, 1F1B and Megatron's interleaved 1F1B (loop placement, full B)."""
from __future__ import annotations

import numpy as np

from pipeoffload.errors import ConfigError
from pipeoffload.ir import Action, ActionKind, Schedule, make_actions
from pipeoffload.placement import Placement

F, B = ActionKind.F, ActionKind.B


def gpipe(num_ranks: int, num_microbatches: int, stages_per_rank: int = 1) -> Schedule:
    """GPipe (and looped BFS when stages_per_rank > 1).

    rank r:  F0 F1 .. F(m-1) | B0 B1 .. B(m-1)      for each local stage, ascending then descending
    warm-up = m forwards per local stage, no steady state, cool-down = m backwards per local stage.
    """
    placement = Placement.loop(num_ranks, stages_per_rank)
    m = num_microbatches
    rows = []
    for rank in range(num_ranks):
        stages = placement.stages_of(rank)
        forwards = [Action(F, s, mb) for s in stages for mb in range(m)]
        backwards = [Action(B, s, mb) for s in reversed(stages) for mb in range(m)]
        rows.append(tuple(forwards + backwards))
    return Schedule(tuple(rows), placement, m, "gpipe")


def one_f_one_b(num_ranks: int, num_microbatches: int, stages_per_rank: int = 1) -> Schedule:
    """1F1B.

    rank r:  F F F (warm-up: min(d-r-1, m)) | F B F B ... (steady) | B B B (cool-down)
    e.g. d=4, m=6, rank 0:  F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5
    """
    if stages_per_rank != 1:
        raise ConfigError.named(lambda n: f"{n.given('stages_per_rank', stages_per_rank)}: 1f1b places one stage "
                                "per rank; use interleaved-1f1b or group-interleaved for more")
    placement = Placement.loop(num_ranks, 1)
    m, d = num_microbatches, num_ranks
    rows = []
    for rank in range(d):
        warmup = min(d - rank - 1, m)
        order = [Action(F, rank, mb) for mb in range(warmup)]
        for k in range(m - warmup):
            order += [Action(F, rank, warmup + k), Action(B, rank, k)]
        order += [Action(B, rank, mb) for mb in range(m - warmup, m)]
        rows.append(tuple(order))
    return Schedule(tuple(rows), placement, m, "1f1b")


def equal_rounds(family: str, d: int, m: int, v: int | None = None) -> int:
    """How many rounds of microbatches an interleaved order over ``d`` ranks runs (``max(1, m // d)``), where
    ``m`` splits into equal ones; else the refusal (``v``: named as the reason, for a family that needs the
    rounds only with more than one stage per rank)."""
    rounds = max(1, m // d)
    if m % rounds:
        raise ConfigError.named(lambda n: (
            f"{n.given('num_microbatches', m)}: {family}{'' if v is None else ' with ' + n.given('stages_per_rank', v)}"
            f" needs microbatches to split into equal rounds (m < d, or m divisible by m // d = {rounds}); use a "
            f"multiple of {n.given('num_ranks', d)}, e.g. {n.given('num_microbatches', rounds * d)}"))
    return rounds


def interleaved_1f1b(num_ranks: int, num_microbatches: int, stages_per_rank: int = 2) -> Schedule:
    """Megatron-style interleaved 1F1B on loop placement.

    Microbatches go in rounds of ``p = m / max(1, m // d)`` (p = d when d divides m). Forward
    number k on a rank runs local stage (k // p) % v of microbatch (k // (p v)) p + k % p; backwards
    visit local stages in reverse. rank r: warm-up = (v-1) p + 2 (d-1-r) forwards (capped at v m),
    then F/B pairs, then the remaining B.

    d=2, v=2, m=2, rank 0:  0F0 0F1 2F0 2F1 | 2B0 2B1 0B0 0B1        (stage 2 is rank 0's second stage)
    """
    d, m, v = num_ranks, num_microbatches, stages_per_rank
    per_round = m // equal_rounds("interleaved-1f1b", d, m)
    placement = Placement.loop(d, v)
    total = v * m
    # forward and backward number k of a rank: its local stage and its microbatch (the same for both)
    k = np.arange(total)
    local = (k // per_round) % v
    microbatch = (k // (per_round * v)) * per_round + k % per_round
    rows = []
    for rank in range(d):
        stages = np.asarray(placement.stages_of(rank))
        # With one stage per rank this is plain 1F1B (Megatron runs its non-interleaved code path then).
        extra = 2 * (d - 1 - rank) if v > 1 else d - 1 - rank
        warmup = min((v - 1) * per_round + extra, total)
        # the list: forwards 0 .. warmup-1, then (forward warmup + j, backward j) pairs, then the
        # remaining backwards; as (is a backward, its number k)
        steady = total - warmup
        is_b = np.concatenate((np.zeros(warmup, dtype=bool), np.tile([False, True], steady),
                               np.ones(warmup, dtype=bool)))
        number = np.concatenate((k[:warmup], np.stack((k[warmup:], k[:steady]), axis=1).ravel(), k[steady:]))
        stage = np.where(is_b, stages[v - 1 - local[number]], stages[local[number]])
        kinds = [F] * warmup + [F, B] * steady + [B] * warmup
        rows.append(tuple(make_actions(kinds, stage.tolist(), microbatch[number].tolist())))
    return Schedule(tuple(rows), placement, m, "interleaved-1f1b")
