"""Schedule generators, registered by case-insensitive name.

A generator is a pure function ``(num_ranks, num_microbatches, stages_per_rank, **options) ->
Schedule`` returning compute-only actions (F, B, I, W, R). ``generate`` looks one up by name and
passes only the options it accepts, rejecting the others with a message that says which it takes.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeoffload.errors import ConfigError
from pipeoffload.ir import Schedule

Generator = Callable[..., Schedule]


@dataclass(frozen=True)
class ScheduleSpec:
    name: str
    generator: Generator
    summary: str
    aliases: tuple[str, ...] = ()

    def default_stages_per_rank(self) -> int:
        param = inspect.signature(self.generator).parameters.get("stages_per_rank")
        return 1 if param is None or param.default is inspect.Parameter.empty else int(param.default)

    def options(self) -> tuple[str, ...]:
        params = inspect.signature(self.generator).parameters
        return tuple(p for p in params if p not in ("num_ranks", "num_microbatches", "stages_per_rank"))


_REGISTRY: dict[str, ScheduleSpec] = {}


def register(name: str, summary: str, aliases: tuple[str, ...] = ()) -> Callable[[Generator], Generator]:
    """Decorator: make ``generator`` available under ``name`` (and ``aliases``), case-insensitively."""

    def wrap(generator: Generator) -> Generator:
        spec = ScheduleSpec(name, generator, summary, aliases)
        for key in (name, *aliases):
            if key.lower() in _REGISTRY:
                raise ValueError(f"schedule name {key!r} registered twice")
            _REGISTRY[key.lower()] = spec
        return generator

    return wrap


def schedule_specs() -> list[ScheduleSpec]:
    """Each registered family once, in registration order."""
    seen: dict[str, ScheduleSpec] = {}
    for spec in _REGISTRY.values():
        seen.setdefault(spec.name, spec)
    return list(seen.values())


def schedule_names() -> list[str]:
    return [spec.name for spec in schedule_specs()]


def get_spec(name: str) -> ScheduleSpec:
    spec = _REGISTRY.get(name.lower())
    if spec is None:
        raise ConfigError(f"unknown schedule {name!r}; valid names: {', '.join(schedule_names())}")
    return spec


def generate(
    name: str, num_ranks: int, num_microbatches: int, stages_per_rank: int | None = None, **options: Any
) -> Schedule:
    """Generate the compute-only schedule ``name`` for the given sizes and family options.

    ``stages_per_rank=None`` takes the family's own default (1 for 1f1b, 2 for interleaved and V shapes).
    """
    spec = get_spec(name)
    if stages_per_rank is None:
        stages_per_rank = spec.default_stages_per_rank()
    unknown = sorted(k for k, v in options.items() if v is not None and k not in spec.options())
    if unknown:
        accepted = ", ".join(spec.options()) or "none"
        raise ConfigError(f"schedule {spec.name!r} does not take option(s) {', '.join(unknown)}; it takes: {accepted}")
    for key, value in (("num_ranks", num_ranks), ("num_microbatches", num_microbatches),
                       ("stages_per_rank", stages_per_rank)):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"{key}={value!r}: must be an integer >= 1")
    given = {k: v for k, v in options.items() if v is not None}
    return spec.generator(num_ranks, num_microbatches, stages_per_rank, **given)


# Importing the family modules registers them.
from pipeoffload.schedules import (  # noqa: E402
    classic,  # noqa: E402,F401
    dualpipe,  # noqa: E402,F401
    v_shape,  # noqa: E402,F401
    zero_bubble,  # noqa: E402,F401
)

__all__ = ["ScheduleSpec", "register", "generate", "get_spec", "schedule_names", "schedule_specs"]
from pipeoffload.schedules import group_interleaved  # noqa: E402,F401
