"""Split a list of layers into pipeline stages by layer counts, and pick one rank's stages."""
from __future__ import annotations

import copy
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from pipeoffload.errors import ConfigError
from pipeoffload.placement import Placement


class StageModule(nn.Sequential):
    """Layers run in order; a tuple returned by one layer is unpacked into the next one's arguments."""

    def forward(self, *args: Any) -> Any:  # type: ignore[override]
        out: Any = args
        for layer in self:
            out = layer(*args)
            args = out if isinstance(out, tuple) else (out,)
        return out


def even_counts(num_layers: int, num_stages: int) -> tuple[int, ...]:
    """Layer counts as even as possible, earlier stages taking the remainder."""
    if num_stages < 1 or num_layers < num_stages:
        raise ConfigError(
            f"cannot split {num_layers} layers into {num_stages} stages: every stage needs at least one layer; "
            "use fewer stages or more layers"
        )
    base, extra = divmod(num_layers, num_stages)
    return tuple(base + (1 if s < extra else 0) for s in range(num_stages))


def check_counts(counts: Sequence[int], num_layers: int, num_stages: int | None = None) -> None:
    """The rule for layer counts (``split_layers``, ``build_rank_stages``, ``train_model(counts=...)``):
    one whole number >= 1 per stage (``num_stages``, when given), summing to the ``num_layers`` layers."""
    if num_stages is not None and len(counts) != num_stages:
        raise ConfigError(f"{len(counts)} layer counts for {num_stages} stages: give one count per stage")
    if any(isinstance(c, bool) or not isinstance(c, numbers.Integral) or c < 1 for c in counts) or sum(counts) != num_layers:
        raise ConfigError(
            f"layer counts {tuple(counts)} must be >= 1 each and sum to the {num_layers} layers; "
            f"e.g. {even_counts(num_layers, max(1, min(len(counts), num_layers)))}"
        )


def split_layers(layers: Sequence[nn.Module], counts: Sequence[int], *, copy_layers: bool = False) -> list[StageModule]:
    """One ``StageModule`` per entry of ``counts`` (consecutive layers). ``copy_layers`` deep-copies,
    so that the original layers can serve as a single-process reference."""
    check_counts(counts, len(layers))
    stages, start = [], 0
    for count in counts:
        chunk = layers[start:start + count]
        stages.append(StageModule(*(copy.deepcopy(layer) if copy_layers else layer for layer in chunk)))
        start += count
    return stages


def build_rank_stages(
    layers: Sequence[nn.Module],
    counts: Sequence[int],
    placement: Placement,
    rank: int,
    *,
    copy_layers: bool = False,
) -> dict[int, StageModule]:
    """The stages ``placement`` puts on ``rank``, as ``{global stage index: module}``."""
    check_counts(counts, len(layers), placement.num_stages)
    mine = placement.stages_of(rank)
    start = [sum(counts[:s]) for s in range(len(counts))]
    return {
        s: split_layers(layers[start[s]:start[s] + counts[s]], [counts[s]], copy_layers=copy_layers)[0] for s in mine
    }


def stage_modules(modules: Mapping[int, nn.Module] | Sequence[nn.Module], placement: Placement, rank: int) -> dict[int, nn.Module]:
    """Normalise a user's stages argument to ``{stage: module}`` and check it matches the placement."""
    if isinstance(modules, Mapping):
        mapping = dict(modules)
    else:
        mapping = dict(zip(placement.stages_of(rank), modules))
        if len(modules) != len(placement.stages_of(rank)):
            raise ConfigError(
                f"rank {rank} got {len(modules)} stage modules but the placement gives it stages "
                f"{placement.stages_of(rank)}; pass one module per stage or a {{stage: module}} dict"
            )
    expected = set(placement.stages_of(rank))
    if set(mapping) != expected:
        raise ConfigError(
            f"rank {rank} got modules for stages {sorted(mapping)} but the placement gives it {sorted(expected)}"
        )
    return mapping
