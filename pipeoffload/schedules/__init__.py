"""Schedule families, registered explicitly by case-insensitive name, with the facts tools need.

A generator is a pure function ``(num_ranks, num_microbatches, stages_per_rank, **options) ->
Schedule`` returning compute-only actions (F, B, I, W, R). Its ``ScheduleSpec`` states what the
planner, the CLI and the tests would otherwise learn by generating or by reading signatures: the
placement, the default and allowed stages per rank, the options, the backward form, the period
after which the steady state repeats, and torch's class of the same algorithm.

The built-in families are listed in ``schedules/families.py`` and registered on first use;
``register(spec)`` adds another (``unregister`` removes it). Nothing is registered by importing a
family module.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeoffload._perf import gc_paused
from pipeoffload.costs import require_costs
from pipeoffload.errors import ConfigError
from pipeoffload.ir import Schedule
from pipeoffload.placement import Placement

Generator = Callable[..., Schedule]
Period = Callable[[int, int, "int | None"], "int | None"]  # (num_ranks, num_microbatches, group_size)


def no_period(num_ranks: int, num_microbatches: int, group_size: int | None) -> int | None:
    return None


@dataclass(frozen=True)
class ScheduleSpec:
    """One family and its facts.

    placement: 'loop' (stage s on rank s mod d) or 'v' (zig-zag, two stages per rank).
    stages_per_rank: the default; with ``fixed_stages_per_rank`` the only value the generator takes.
    interleaved: a loop family meant for several stages per rank (the planner tries v >= 2).
    backward: 'full' (B), 'split' (I and W), 'mixed' (both) or 'option' (chosen by an option).
    options: keyword options of the generator beyond the three sizes.
    period: microbatches after which the steady state repeats, or None when it does not (or is
    not known); ``warmup_periods``: periods before it does. The planner extrapolates with them.
    group_sizes: the group sizes worth searching for d ranks ((None,) when the family has none).
    torch_class: ``torch.distributed.pipelining``'s schedule class of the same algorithm, if any.
    """

    name: str
    generator: Generator
    summary: str
    aliases: tuple[str, ...] = ()
    placement: str = "loop"
    stages_per_rank: int = 1
    fixed_stages_per_rank: bool = False
    interleaved: bool = False
    backward: str = "full"
    options: tuple[str, ...] = ()
    period: Period = no_period
    warmup_periods: int = 1
    group_sizes: Callable[[int], tuple[int | None, ...]] = lambda num_ranks: (None,)
    torch_class: str | None = None

    def __post_init__(self) -> None:
        if self.placement not in ("loop", "v"):
            raise ValueError(f"{self.name}: placement={self.placement!r} must be 'loop' or 'v'")
        if self.backward not in ("full", "split", "mixed", "option"):
            raise ValueError(f"{self.name}: backward={self.backward!r} must be full, split, mixed or option")

    def default_stages_per_rank(self) -> int:
        return self.stages_per_rank

    @property
    def v_shape(self) -> bool:
        return self.placement == "v"

    def placement_for(self, num_ranks: int, stages_per_rank: int | None = None) -> Placement:
        """The stage -> rank map for ``num_ranks`` ranks, without generating a schedule."""
        v = self.stages_per_rank if stages_per_rank is None else stages_per_rank
        return Placement.v(num_ranks, v) if self.v_shape else Placement.loop(num_ranks, v)


_REGISTRY: dict[str, ScheduleSpec] = {}
_FILLING = threading.Lock()


def register(spec: ScheduleSpec) -> ScheduleSpec:
    """Make ``spec`` available under its name and aliases, case-insensitively."""
    _registry()
    _add(spec)
    return spec


def unregister(name: str) -> None:
    """Remove a family registered with ``register`` (by any of its names)."""
    spec = get_spec(name)
    for key in (spec.name, *spec.aliases):
        _REGISTRY.pop(key.lower(), None)


def _add(spec: ScheduleSpec) -> None:
    for key in (spec.name, *spec.aliases):
        if key.lower() in _REGISTRY:
            raise ValueError(f"schedule name {key!r} registered twice")
    for key in (spec.name, *spec.aliases):
        _REGISTRY[key.lower()] = spec


def _registry() -> dict[str, ScheduleSpec]:
    """The registry, with the built-in families added on first use. The lock makes the first use from
    many threads at once (the playground's server) fill it exactly once."""
    if not _REGISTRY:
        with _FILLING:
            if not _REGISTRY:
                from pipeoffload.schedules.families import BUILTIN

                for spec in BUILTIN:
                    _add(spec)
    return _REGISTRY


def schedule_specs() -> list[ScheduleSpec]:
    """Each registered family once, in registration order."""
    seen: dict[str, ScheduleSpec] = {}
    for spec in _registry().values():
        seen.setdefault(spec.name, spec)
    return list(seen.values())


def schedule_names() -> list[str]:
    """The names ``generate`` takes, one per registered family (aliases such as ``zbv`` are read too)."""
    return [spec.name for spec in schedule_specs()]


def get_spec(name: str) -> ScheduleSpec:
    if not isinstance(name, str):  # name.lower() would raise AttributeError from here
        raise ConfigError(f"schedule name {name!r} is a {type(name).__name__}; give a family's name as text, "
                          f"one of {', '.join(schedule_names())}")
    spec = _registry().get(name.lower())
    if spec is None:
        raise ConfigError(f"unknown schedule {name!r}; valid names: {', '.join(schedule_names())}")
    return spec


# Above this many compute actions ``generate`` refuses up front (pass max_actions=None to go ahead):
# generating, lowering and simulating take about _SECONDS_PER_ACTION each and _BYTES_PER_ACTION of memory.
MAX_ACTIONS = 2_000_000
_SECONDS_PER_ACTION = 2e-5  # measured: 1f1b, d = m = 512, generate + lower + simulate on 2 cores
_BYTES_PER_ACTION = 2000
# Work that grows with the stages whatever the microbatches (the communication plan, per-rank memory
# curves), in actions: measured 1f1b, d = 4096, m = 1 takes as long as about 50 actions per stage.
_ACTIONS_PER_STAGE = 50


def estimated_actions(spec: ScheduleSpec, num_ranks: int, num_microbatches: int, stages_per_rank: int) -> int:
    """Compute actions of the schedule: F plus B, or F plus I and W, per stage and microbatch."""
    passes = 2 if spec.backward == "full" else 3
    return passes * num_ranks * stages_per_rank * num_microbatches


def estimated_work(spec: ScheduleSpec, num_ranks: int, num_microbatches: int, stages_per_rank: int) -> int:
    """All the work generating, lowering and simulating the schedule implies, in actions: its compute
    actions plus the per-stage work (so a million ranks with one microbatch counts as big)."""
    return (estimated_actions(spec, num_ranks, num_microbatches, stages_per_rank)
            + _ACTIONS_PER_STAGE * num_ranks * stages_per_rank)


def check_options(spec: ScheduleSpec, options: dict[str, Any], settable: tuple[str, ...] | None = None) -> None:
    """Refuse a family option ``spec``'s generator does not take (None values are "not given"): what
    ``generate`` checks first, and a request checks when it is built. ``settable``: the options the
    caller's surface can set (``simulate``: group_size and backward), the only ones the refusal offers
    (None: every option, as the Python call takes them; ``costs`` is no flag)."""
    unknown = sorted(k for k, v in options.items() if v is not None and k not in spec.options)
    if not unknown:
        return
    takers = ", ".join(s.name for s in schedule_specs() if not set(unknown) - set(s.options))
    accepted = [o for o in spec.options if settable is None or o in settable]
    raise ConfigError.named(lambda n: (
        f"schedule {spec.name!r} does not take {' or '.join(map(n, unknown))}"
        + (f" ({takers} {'do' if ', ' in takers else 'does'})" if takers else "")
        + (f"; it takes {' and '.join(map(n, accepted))}" if accepted else
           f"; leave {'it' if len(unknown) == 1 else 'them'} out")))


def _not_a_size(key: str, value: object) -> ConfigError:
    return ConfigError.named(lambda n: f"{n.given(key, repr(value))}: must be an integer >= 1")


def generate(
    name: str, num_ranks: int, num_microbatches: int, stages_per_rank: int | None = None, **options: Any
) -> Schedule:
    """Generate the compute-only schedule ``name`` for the given sizes and family options.

    ``stages_per_rank=None`` takes the family's own default (1 for 1f1b, 2 for interleaved and V shapes).
    A schedule of more than ``max_actions`` compute actions is refused before any work, with its size
    and an estimate of the time and memory it would take (option ``max_actions``, default
    ``MAX_ACTIONS``; None: no limit).
    """
    max_actions = options.pop("max_actions", MAX_ACTIONS)
    spec = get_spec(name)
    if stages_per_rank is None:
        stages_per_rank = spec.default_stages_per_rank()
    check_options(spec, options)
    for key, value in (("num_ranks", num_ranks), ("num_microbatches", num_microbatches),
                       ("stages_per_rank", stages_per_rank)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:  # True is an int to Python
            raise _not_a_size(key, value)
    require_costs(options.get("costs"), "generate")
    size = estimated_work(spec, num_ranks, num_microbatches, stages_per_rank)
    if max_actions is not None and size > max_actions:
        raise ConfigError(
            f"{spec.name} with num_ranks={num_ranks}, num_microbatches={num_microbatches}, "
            f"stages_per_rank={stages_per_rank}: about {size:,} actions of work "
            f"({estimated_actions(spec, num_ranks, num_microbatches, stages_per_rank):,} actions and "
            f"{num_ranks * stages_per_rank:,} stages), above the limit of {max_actions:,} "
            f"(roughly {size * _SECONDS_PER_ACTION:,.0f} s and {size * _BYTES_PER_ACTION / 1e9:,.0f} GB to generate "
            "and simulate); use fewer ranks or microbatches (the bubble and peak memory follow closed forms), "
            "or pass max_actions=None to run it anyway")
    given = {k: v for k, v in options.items() if v is not None}
    with gc_paused():  # 10^5 new actions, none freed: a cyclic GC pass would only rescan them
        return spec.generator(num_ranks, num_microbatches, stages_per_rank, **given)


__all__ = ["MAX_ACTIONS", "ScheduleSpec", "check_options", "estimated_actions", "estimated_work", "generate", "get_spec", "register", "schedule_names", "schedule_specs", "unregister"]
