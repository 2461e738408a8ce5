"""How a model's layers are split over pipeline stages: even (Megatron's rule) or balanced.

``even``: every stage gets ``layers / stages`` layers, the remainder to the earliest stages (the last
stage already carries the output head). ``balanced``: the split that minimises the busiest rank's work
when the head (output projection and loss) counts as what it costs, in layer-forward units; when it
helps, or when there are more stages than layers, the first stage may hold only the embedding and the
last only the head (PipeOffload's layouts give them stages of their own). Other stages always hold at
least one layer.
"""
from __future__ import annotations

import math

from pipeoffload.errors import ConfigError
from pipeoffload.placement import Placement

SPLITS = ("even", "balanced")


def most_stages(kind: str, layers: int) -> int:
    """The most stages ``layers`` fill with split ``kind`` (``plan`` and ``estimate`` both ask here): a
    layer on every stage (even), or an embedding-only first and a head-only last stage besides (balanced)."""
    return layers + (2 if kind == "balanced" else 0)


def even_split(layers: int, stages: int) -> tuple[int, ...]:
    """Layers per stage, as even as possible; the remainder goes to the earliest stages."""
    if stages > layers:
        raise ConfigError(f"{stages} stages for {layers} layers: every stage needs a layer; "
                          "use fewer ranks or stages per rank, or the balanced split")
    base, extra = divmod(layers, stages)
    return tuple(base + (1 if s < extra else 0) for s in range(stages))


def balanced_split(layers: int, placement: Placement, head_weight: float) -> tuple[int, ...]:
    """Layers per stage minimising the busiest rank's work (``head_weight``: the head's F+B in units of
    one layer's F+B). Water-filling over ranks, then each rank's layers spread over its stages."""
    stages = placement.num_stages
    last, ranks = stages - 1, placement.num_ranks
    if layers < stages - 2:
        raise ConfigError(f"{stages} stages for {layers} layers: even with an embedding-only first stage and a "
                          "head-only last stage every other stage needs a layer; use fewer ranks or stages per rank")
    extra = [head_weight if last in placement.stages_of(r) else 0.0 for r in range(ranks)]
    floor_of = [_floor_needed(placement, r, last) for r in range(ranks)]

    def fits(t: float) -> list[int]:
        return [max(f, math.floor(t - e + 1e-9)) for f, e in zip(floor_of, extra)]

    # the smallest busiest-rank load T (a layer count plus a rank's head weight) that holds every layer
    candidates = sorted({n + e for e in set(extra) for n in range(layers + 1)})
    target = next(t for t in candidates if sum(fits(t)) >= layers)
    counts = fits(target)
    ends = {r for r in range(ranks) if extra[r] > 0 or 0 in placement.stages_of(r)}
    for _ in range(sum(counts) - layers):  # take back from the busiest rank, end ranks first on ties
        r = max((r for r in range(ranks) if counts[r] > floor_of[r]),
                key=lambda r: (counts[r] + extra[r], r in ends, -r))
        counts[r] -= 1
    split = [0] * stages
    for r in range(ranks):
        split_rank(split, placement.stages_of(r), counts[r], last)
    return tuple(split)


def _floor_needed(placement: Placement, rank: int, last: int) -> int:
    """Layers a rank must hold: one per stage except an embedding-only first or head-only last stage."""
    return sum(1 for s in placement.stages_of(rank) if s not in (0, last))


def split_rank(split: list[int], stages: tuple[int, ...] | list[int], count: int, last: int) -> None:
    """Spread ``count`` layers over a rank's stages as evenly as possible; the end stages (embedding,
    head) are the ones left lighter or empty."""
    order = sorted(stages, key=lambda s: (s in (0, last), s))  # inner stages first
    if count < len(order):
        for s in order:
            split[s] = 0
        for s in order[:count]:
            split[s] = 1
        return
    base, rest = divmod(count, len(order))
    for i, s in enumerate(order):
        split[s] = base + (1 if i < rest else 0)


def layer_split(kind: str, layers: int, placement: Placement, head_weight: float) -> tuple[int, ...]:
    if kind == "even":
        return even_split(layers, placement.num_stages)
    if kind == "balanced":
        return balanced_split(layers, placement, head_weight)
    raise ConfigError(f"layer split {kind!r}: use one of {', '.join(SPLITS)}")
