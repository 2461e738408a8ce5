"""Alternating copy slots for two ranks sharing a host link (the reference planner's pattern, planned here).

The pair plan of ``offload_plan`` packs copies greedily into any free link time. Where the link is
loaded in the steady state (two ranks at k >= 0.7 on group-interleaved), that greedy choice strands
reloads in the cool-down and lands far above what a fixed pattern reaches. The pattern: with a slot
of T (the longest one-way copy), each rank of the pair owns every other T on each direction of the
link, the two ranks in opposite phase, so the pair's D2H and H2D links are both busy all the time
and one rank's engine alternates D2H, H2D:

    rank 2p:    D2H | H2D | D2H | H2D ...        slot j of rank r: D2H at o + (2j + r) T,
    rank 2p+1:  H2D | D2H | H2D | D2H ...                          H2D at o + (2j + 1 - r) T

Offloads take the first free D2H slot at or after their forward ends, in forward order; reloads the
last free H2D slot that ends ``margin`` (and, with ``back_margin``, the backward's own duration, as
the reference does) before their backward starts, latest backward first. The margins buy slack:
the simulator runs a copy when its engine and the link are free, which is not always in its slot. An
activation that lives less than ``keep`` slot periods (2 T) is not offloaded (it would take two slots
for little), and one whose reload slot would come before its offload slot ends is dropped.

The slots are planned times; the simulator runs each copy from its issue point (the compute action
before the slot's start) when its engine and the link are free, so a plan is only a candidate: the
offload pass simulates it and keeps it where it beats the other plans (``offload._slot_plans``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from pipeoffload.passes.copy_plan import EPS, Activation, Placed, RankTimeline
from pipeoffload.passes.offload_plan import RankState


@dataclass(frozen=True)
class SlotPattern:
    """One variant of the pattern: slot length, lifespan filter (in slot periods) and reload margins."""

    slot: float  # T: one copy's slot (>= the longest one-way copy of the pair's candidates)
    keep: float  # an activation is offloaded only if it lives more than keep x 2 T
    margin: float  # a reload's slot ends at least this long before its backward starts
    back_margin: bool = False  # ... and at least the backward's own duration before it


def slot_length(candidates: dict[int, list[Activation]]) -> float:
    """The longest one-way copy among the pair's first windows (0.0 when there are none)."""
    return max((max(x.d2h, x.h2d) for xs in candidates.values() for x in xs if x.window == 0), default=0.0)


def plan_pair(timelines: list[RankTimeline], candidates: dict[int, list[Activation]],
              pattern: SlotPattern) -> dict[int, RankState]:
    """Each rank's offloads of one pair (or a lone last rank) in alternating slots (see the module)."""
    first = {r: sorted((x for x in xs if x.window == 0), key=lambda x: (x.f_end, x.stage, x.microbatch))
             for r, xs in candidates.items()}
    starts = [x.f_end for xs in first.values() for x in xs]
    states = {tl.rank: RankState(tl) for tl in timelines}
    if not starts or pattern.slot <= EPS:
        return states
    origin = min(starts)
    for phase, tl in enumerate(timelines):
        for x, d2h, h2d in _assign(tl, first.get(tl.rank, []), origin + phase * pattern.slot,
                                   origin + (1 - phase) * pattern.slot, pattern):
            lo, hi = tl.off_range(d2h + x.d2h, h2d)
            if hi > lo:
                states[tl.rank].add(Placed(x, d2h, h2d, lo, hi))
    return states


def _assign(tl: RankTimeline, acts: list[Activation], d2h_origin: float, h2d_origin: float, pattern: SlotPattern
            ) -> list[tuple[Activation, float, float]]:
    """(activation, D2H start, H2D start) for one rank: slot j of a direction starts at origin + 2 j T."""
    period = 2 * pattern.slot
    target = {(x.stage, x.microbatch): x.deadline - pattern.margin
              - (tl.clocks[x.back_index + 1] - x.deadline if pattern.back_margin else 0.0) for x in acts}
    chosen = [x for x in acts if target[(x.stage, x.microbatch)] - x.f_end > pattern.keep * period + EPS]
    send: dict[tuple[int, int], int] = {}
    nxt = 0
    for x in chosen:  # forward order: the first free slot at or after the forward's end
        j = max(nxt, math.ceil((x.f_end - d2h_origin) / period - EPS))
        send[(x.stage, x.microbatch)] = j
        nxt = j + 1
    out = []
    top: int | None = None
    for x in sorted(chosen, key=lambda x: (-x.deadline, x.stage, x.microbatch)):  # latest backward first
        j = math.floor((target[(x.stage, x.microbatch)] - pattern.slot - h2d_origin) / period + EPS)
        j = j if top is None else min(j, top)
        d2h = d2h_origin + send[(x.stage, x.microbatch)] * period
        h2d = h2d_origin + j * period
        if h2d + EPS < d2h + x.d2h:  # the reload would start before the offload ends: not offloaded
            continue
        top = j - 1
        out.append((x, d2h, h2d))
    return out
