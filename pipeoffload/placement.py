"""Stage -> rank maps: ``loop`` (Megatron interleave), ``v`` (zig-zag), or custom."""
from __future__ import annotations

import numbers
from collections.abc import Iterable
from dataclasses import dataclass, field

from pipeoffload.errors import ConfigError


@dataclass(frozen=True)
class Placement:
    """Which rank holds each global stage. ``kind`` is 'loop', 'v' or 'custom'."""

    stage_to_rank: tuple[int, ...]
    num_ranks: int
    kind: str = "custom"
    _stages_of: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.num_ranks, bool) or not isinstance(self.num_ranks, int) or self.num_ranks < 1:
            raise ConfigError(f"num_ranks={self.num_ranks!r}: must be an integer >= 1")
        # a list (or array) is kept as a tuple of ints: a frozen placement stays immutable and hashable
        object.__setattr__(self, "stage_to_rank", _rank_tuple(self.stage_to_rank))
        bad = [r for r in self.stage_to_rank if not 0 <= r < self.num_ranks]
        if bad:
            raise ConfigError(f"placement maps stages to ranks {bad} outside 0..{self.num_ranks - 1}")
        self._check_kind()
        # One pass over the stages (not one per rank): a million ranks must not cost ranks x stages.
        buckets: list[list[int]] = [[] for _ in range(self.num_ranks)]
        for stage, rank in enumerate(self.stage_to_rank):
            buckets[rank].append(stage)
        object.__setattr__(self, "_stages_of", tuple(map(tuple, buckets)))

    def _check_kind(self) -> None:
        """``kind`` names the map it labels: a 'loop' or 'v' that is not that map would be printed and
        saved (``Schedule.to_json``) as a shape the schedule does not have."""
        if self.kind not in KINDS:
            raise ConfigError(f"placement kind={self.kind!r}: use one of {', '.join(KINDS)} "
                              "(Placement.custom(stage_to_rank) recognises loop and v maps itself)")
        d, stages = self.num_ranks, len(self.stage_to_rank)
        maps = {"loop": _loop_map, "v": _v_map}
        if self.kind in maps and (stages % d or maps[self.kind](d, stages // d) != self.stage_to_rank):
            raise ConfigError(f"placement kind={self.kind!r} but stage_to_rank={self.stage_to_rank} is not the "
                              f"{self.kind} map of {d} ranks; use Placement.custom(stage_to_rank, {d}) or kind='custom'")

    @property
    def num_stages(self) -> int:
        return len(self.stage_to_rank)

    @property
    def stages_per_rank(self) -> int:
        """Stages on the busiest rank (all ranks hold the same number for loop and v)."""
        return max(len(s) for s in self._stages_of)

    def rank_of(self, stage: int) -> int:
        return self.stage_to_rank[stage]

    def stages_of(self, rank: int) -> tuple[int, ...]:
        return self._stages_of[rank]

    def local_index(self, stage: int) -> int:
        """Position of ``stage`` among its rank's stages (0 = the rank's first stage)."""
        return self._stages_of[self.stage_to_rank[stage]].index(stage)

    @classmethod
    def loop(cls, num_ranks: int, stages_per_rank: int = 1) -> Placement:
        """Stage s on rank s mod num_ranks (1F1B, Megatron interleaved)."""
        _check_positive(num_ranks=num_ranks, stages_per_rank=stages_per_rank)
        return cls(_loop_map(num_ranks, stages_per_rank), num_ranks, "loop")

    @classmethod
    def v(cls, num_ranks: int, stages_per_rank: int = 2) -> Placement:
        """Zig-zag: rank r holds stages r, 2d-1-r, 2d+r, 4d-1-r, ... (V-shape for 2 stages per rank)."""
        _check_positive(num_ranks=num_ranks, stages_per_rank=stages_per_rank)
        if stages_per_rank % 2:
            raise ConfigError(
                f"stages_per_rank={stages_per_rank}: V placement needs an even number of stages per rank; use 2"
            )
        return cls(_v_map(num_ranks, stages_per_rank), num_ranks, "v")

    @classmethod
    def custom(cls, stage_to_rank: list[int] | tuple[int, ...], num_ranks: int | None = None) -> Placement:
        """Any map; recognised as 'loop' or 'v' when it equals one."""
        mapping = tuple(int(r) for r in stage_to_rank)
        ranks = num_ranks if num_ranks is not None else 1 + max(mapping, default=0)
        if ranks >= 1 and mapping and len(mapping) % ranks == 0:
            per_rank = len(mapping) // ranks
            if mapping == cls.loop(ranks, per_rank).stage_to_rank:
                return cls.loop(ranks, per_rank)
            if per_rank % 2 == 0 and mapping == cls.v(ranks, per_rank).stage_to_rank:
                return cls.v(ranks, per_rank)
        return cls(mapping, ranks, "custom")


KINDS = ("loop", "v", "custom")


def _rank_tuple(mapping: object) -> tuple[int, ...]:
    """``stage_to_rank`` as a tuple of ints, or one line saying what it takes."""
    items = None if isinstance(mapping, (str, bytes)) or not isinstance(mapping, Iterable) else tuple(mapping)
    if items is None or any(isinstance(r, bool) or not isinstance(r, numbers.Integral) for r in items):
        raise ConfigError(f"stage_to_rank={mapping!r}: give a tuple of rank numbers, one per stage, e.g. (0, 1, 1, 0)")
    return tuple(int(r) for r in items)


def _loop_map(d: int, v: int) -> tuple[int, ...]:
    return tuple(s % d for s in range(d * v))


def _v_map(d: int, v: int) -> tuple[int, ...]:
    """Zig-zag; with an odd ``v`` (never a 'v' placement: ``Placement.v`` refuses it) it is not a V."""
    if v % 2:
        return ()
    return tuple(s % d if (s // d) % 2 == 0 else d - 1 - s % d for s in range(d * v))


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name}={value!r}: must be an integer >= 1")
