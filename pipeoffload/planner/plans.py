"""What the planner is asked (``PlanRequest``) and what it answers (``Plan``, ``SearchResult``)."""
from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pipeoffload.errors import ConfigError, Naming, Worded
from pipeoffload.planner.evaluate import ScheduleChoice, SimSummary
from pipeoffload.planner.hardware import HardwareSpec, check_hardware
from pipeoffload.planner.measured import check_profile
from pipeoffload.planner.model import ModelSpec, check_model
from pipeoffload.planner.stagecosts import LayerCosts, Layout, TrainingSetup
from pipeoffload.policies import OffloadPolicy, RecomputePolicy, check_booleans
from pipeoffload.readonly import ReadOnlyDict
from pipeoffload.schedules import get_spec, schedule_names

GIB = 1024**3
DEFAULT_SCHEDULES = ("1f1b", "zb-h1", "interleaved-1f1b", "group-interleaved", "zb-v", "v-half", "v-min")
# group-interleaved with g = d has interleaved 1F1B's memory and a smaller bubble (split backward), so
# Megatron's interleaved 1F1B is searched by default only in builds without it.
SUPERSEDED = {"interleaved-1f1b": "group-interleaved"}


def capped_note(n: Naming, field: str, asked: float, hardware: HardwareSpec, cap: float, checked: str) -> str:
    """The warning that a memory budget of ``asked`` bytes (what ``field`` set) above ``hardware``'s memory is
    capped at ``cap`` bytes, in ``n``'s names; ``checked``: what is checked against the cap ("plans are")."""
    fix = "--hw memory_gib=..." if n.flags else "hardware=dataclasses.replace(hardware, memory_bytes=...)"
    return (f"{n.given(field, f'{asked / GIB:g} GiB')} is above the {hardware.name}'s {cap / GIB:.2f} GiB; "
            f"{checked} checked against {cap / GIB:.2f} GiB (raise it with {fix})")


def empty_schedules(n: Naming) -> str:
    """The refusal of an empty list of families, in ``n``'s names (``schedules`` or ``--schedules``)."""
    return (f"the list of schedule families ({n('schedules')}) is empty; name at least one, e.g. "
            f"{n.given('schedules', ('1f1b',))}, or leave it out to try the defaults")


class InfeasibleError(ConfigError):
    """No candidate fits; carries the smallest memory any candidate needs and that candidate."""

    def __init__(self, message: str, min_memory: float | None = None, plan: Plan | None = None) -> None:
        super().__init__(message)
        self.min_memory = min_memory
        self.plan = plan


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """A planner search (``pipeoffload plan``): the fastest PP x TP x DP layouts, schedules and memory policies
    of ``model`` on ``gpus`` x ``hardware`` whose memory per GPU fits ``memory_budget``, in bytes (40 GiB is
    ``40 * planner.hardware.GIB``). Keyword arguments only; a search-space field left None searches what the
    comment beside it says. ``run`` gives a ``PlanResult``; none that fits raises ``InfeasibleError``."""

    model: ModelSpec
    hardware: HardwareSpec
    gpus: int
    global_batch: int  # sequences per optimizer step
    memory_budget: float  # bytes per GPU
    host_memory_budget: float | None = None  # pinned host bytes per GPU; None: unlimited
    activation_budget: float | None = None  # activation peak bytes on every rank; None: only the total
    setup: TrainingSetup = field(default_factory=TrainingSetup)
    schedules: tuple[str, ...] | None = None  # None: the DEFAULT_SCHEDULES this build registers
    tp_sizes: tuple[int, ...] | None = None  # None: divisors of gpus up to gpus_per_node
    pp_sizes: tuple[int, ...] | None = None  # None: every divisor that fits the layers
    stages_per_rank: tuple[int, ...] = (2, 4)  # for the multi-stage families
    # None: each family's own (ScheduleSpec.group_sizes); else only these (those in 1..pp), so only families with a g
    group_sizes: tuple[int, ...] | None = None
    offload: tuple[str, ...] | None = None  # None: "none", "first:K" and "all" where supported
    recompute: tuple[str, ...] | None = None
    measured: LayerCosts | None = None  # profiled per-layer costs (valid for tp == 1 only)
    top: int = 5  # how many best plans to guarantee exactly
    prune: bool = True  # skip candidates that provably cannot change the top plans or the frontier
    escalate: bool = True  # try offload, then recompute, only where nothing cheaper of a schedule fits
    exact_frontier: bool = False  # also simulate whatever could join the Pareto frontier (slower)
    workers: int = 1  # worker processes that simulate a batch of candidates in parallel
    best_per_tp: bool = False  # also find the best plan of every TP size exactly (slower)
    split: str = "even"  # layers over stages: "even" or "balanced" (head weighed; embedding/head-only stages)
    max_stall: float = 0.0  # percent an offload plan may lengthen its schedule's step for a lower peak
    # bytes per GPU the user asked for where that was above the device and memory_budget is the device's
    # capacity instead (plan --memory 80 on an 79.65 GiB H100); None: memory_budget is what was asked
    memory_asked: float | None = None

    def capped_note(self) -> Worded | None:
        """The warning that ``memory_asked`` was capped at the device's memory (``memory_budget``), else None;
        in both namings (``memory_asked=80 GiB``; the command line: ``--memory 80 GiB``)."""
        asked = self.memory_asked
        if asked is None:
            return None
        return Worded.named(lambda n: capped_note(n, "memory_asked", asked, self.hardware, self.memory_budget,
                                                  "plans are"))

    def notes(self) -> list[str]:
        """Warnings about the request itself: the model's notes and a capped ``memory_asked`` (``Worded``:
        the command line prints it with ``in_words(note, FLAGS)``)."""
        capped = self.capped_note()
        return [*([capped] if capped else []), *self.model.notes()]

    def __post_init__(self) -> None:
        check_model(self.model)
        check_hardware(self.hardware)
        if self.measured is not None:
            check_profile(self.measured, self.model)
        for key in ("gpus", "global_batch", "top", "workers"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{key}={value!r}: must be an integer >= 1")
        check_booleans(self, "prune", "escalate", "exact_frontier", "best_per_tp")
        for key in ("tp_sizes", "pp_sizes", "stages_per_rank", "group_sizes", "schedules", "offload", "recompute"):
            self._check_tuple(key)
        self._check_policies()
        for key in ("memory_budget", "host_memory_budget", "activation_budget"):
            value = getattr(self, key)
            if (value is not None or key == "memory_budget") and (
                    isinstance(value, bool) or not isinstance(value, numbers.Real)):
                raise ConfigError(f"{key}={value!r}: must be a number of bytes per GPU (40 GiB is 40 * 2**30)")
        if self.host_memory_budget is not None and not (math.isfinite(self.host_memory_budget)
                                                        and self.host_memory_budget > 0):  # as --host-memory
            raise ConfigError(f"host_memory_budget={self.host_memory_budget!r}: must be a finite number of bytes "
                              "> 0, or None for no limit")
        if not self.memory_budget > 0:
            raise ConfigError(f"memory budget {self.memory_budget / GIB:.2f} GiB: must be > 0")
        if self.memory_budget > self.hardware.memory_bytes * (1 + 1e-12):  # never show a plan the GPU cannot hold
            raise ConfigError(f"memory budget {self.memory_budget / GIB:.2f} GiB is above the "
                              f"{self.hardware.name}'s {self.hardware.memory_bytes / GIB:.2f} GiB; "
                              "use at most the device's memory")
        if self.schedules is not None and not self.schedules:  # searched nothing, and said only "no layout"
            raise ConfigError.named(empty_schedules)
        for name in self.schedules or ():
            get_spec(name)  # unknown names fail here with the list of valid ones
        if self.group_sizes is not None:
            self._check_group_sizes()
        if self.split not in ("even", "balanced"):
            raise ConfigError(f"layer split {self.split!r}: use even or balanced")
        if not (math.isfinite(self.max_stall) and self.max_stall >= 0):
            raise ConfigError.named(lambda n: f"{n.given('max_stall', repr(self.max_stall))}: must be a finite "
                                    "percentage >= 0 (e.g. 2 for 2 %)")
        if self.max_stall > 0 and self.offload is not None and all(o == "none" for o in self.offload):
            raise ConfigError.named(lambda n: f"{n.given('max_stall', f'{self.max_stall:g}')} lets offload plans "
                                    f"stall, but {n('offload')} is none: allow an offload policy (e.g. "
                                    f"{n.given('offload', ('none', 'auto'))}) or leave {n('max_stall')} out")

    def _check_policies(self) -> None:
        """Every offload and recompute entry parses (the policy's own line), here rather than after part of the
        search has run; "budget" is the planner's offload target (what the memory budget leaves)."""
        for text in self.offload or ():
            if text != "budget":
                OffloadPolicy.parse(text)
        for text in self.recompute or ():
            RecomputePolicy.parse(text)

    def _check_tuple(self, key: str) -> None:
        """A search-space field is a tuple (a list is kept as one: the request stays hashable), never one
        text (searched letter by letter); sizes are integers >= 1, as the CLI's comma lists."""
        value = getattr(self, key)
        if value is None and key != "stages_per_rank":
            return
        sizes = key.endswith("sizes") or key == "stages_per_rank"
        what = "integers" if sizes else "family names" if key == "schedules" else "policies"
        example = "(2, 4)" if sizes else f"({value!r},)" if isinstance(value, str) else "('1f1b', 'zb-v')"
        if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list, range)):
            raise ConfigError(f"{key}={value!r}: takes a tuple of {what}, e.g. {key}={example}")
        value = tuple(value)
        object.__setattr__(self, key, value)
        if sizes and any(isinstance(v, bool) or not isinstance(v, int) or (v < 1 and key != "group_sizes")
                         for v in value):  # a group size below 1 is refused with the --group-sizes line
            raise ConfigError(f"{key}={value!r}: every value must be an integer >= 1, e.g. {key}={example}")
        if key == "schedules" and not all(isinstance(v, str) for v in value):
            raise ConfigError(f"schedules={value!r}: every entry must be a family's name, e.g. schedules={example}")

    def _check_group_sizes(self) -> None:
        """Group sizes restrict the search to families that have one: with none of those it would search
        nothing and say only "no layout"."""
        shown = tuple(self.group_sizes or ())
        if not self.group_sizes or any(g < 1 for g in self.group_sizes):
            raise ConfigError.named(lambda n: f"{n.given('group_sizes', shown)}: give group sizes >= 1, e.g. "
                                    f"{'4,8' if n.flags else '(4, 8)'}, or leave it out")
        if not any("group_size" in get_spec(n).options for n in self.families()):
            grouped = ", ".join(n for n in schedule_names() if "group_size" in get_spec(n).options)
            raise ConfigError.named(lambda n: f"{n.given('group_sizes', shown)}: no family in "
                                    f"{n.given('schedules', self.families())} has a group size (only {grouped}); "
                                    f"add one to {n('schedules')} or leave {n('group_sizes')} out")

    def families(self) -> tuple[str, ...]:
        if self.schedules is not None:
            # a family named twice (any case, or by an alias) is one: twins would take two --top places
            return tuple(dict.fromkeys(get_spec(n).name for n in self.schedules))
        return default_families()


def default_families() -> tuple[str, ...]:
    """The families a search tries without ``schedules``: ``DEFAULT_SCHEDULES`` this build registers, less
    those a registered family supersedes."""
    known = set(schedule_names())
    return tuple(n for n in DEFAULT_SCHEDULES if n in known and SUPERSEDED.get(n) not in known)


@dataclass(frozen=True)
class MemorySplit:
    """Bytes on the worst rank (the one with the highest total), and pinned host bytes per GPU."""

    parameters: float  # weights + gradients (+ bf16 autocast's weight-cast cache of train's blocks)
    optimizer: float
    activations: float
    host: float

    @property
    def total(self) -> float:
        return self.parameters + self.optimizer + self.activations


@dataclass(frozen=True)
class Plan:
    layout: Layout
    choice: ScheduleChoice
    microbatches: int
    step_time: float
    pipeline_time: float
    dp_sync_time: float
    tokens_per_second: float
    mfu: float
    memory: MemorySplit
    bubble_ratio: float
    stall_ratio: float  # worst rank's reload wait / step time
    fits: bool
    exact: bool  # False: memory estimated from small simulations; confirmed before it is shown
    sim: SimSummary = field(repr=False, compare=False, default=None)  # type: ignore[assignment]
    unit_bytes: float = field(repr=False, compare=False, default=0.0)  # bytes of one activation unit

    def sort_key(self) -> tuple:
        return (-round(self.tokens_per_second, 6), round(self.memory.total), str(self.layout), self.choice)

    @property
    def activation_peak(self) -> float:
        """The largest simulated activation peak of any rank, in bytes: ``memory.activations`` is that of the
        rank with the most memory in all, which with uneven weights (the head, the embedding) can be another."""
        if self.sim is None or not self.unit_bytes:
            return self.memory.activations
        return max(self.sim.peak_units) * self.unit_bytes

    def as_dict(self) -> dict:
        c = self.choice
        return {
            "layout": {"pp": self.layout.pp, "tp": self.layout.tp, "dp": self.layout.dp},
            "schedule": c.family, "stages_per_rank": c.stages_per_rank, "group_size": c.group_size,
            "offload": str(c.offload), "max_stall": c.offload.max_stall, "recompute": str(c.recompute), "microbatches": self.microbatches,
            "step_time_s": self.step_time, "pipeline_time_s": self.pipeline_time,
            "dp_sync_time_s": self.dp_sync_time, "tokens_per_s": self.tokens_per_second, "mfu": self.mfu,
            "memory_gib": {"parameters": self.memory.parameters / GIB, "optimizer": self.memory.optimizer / GIB,
                           "activations": self.memory.activations / GIB, "total": self.memory.total / GIB,
                           "host": self.memory.host / GIB},
            "bubble_ratio": self.bubble_ratio, "stall_ratio": self.stall_ratio, "fits": self.fits,
        }


@dataclass(frozen=True)
class SearchResult:
    """A search's answer, read-only like the ``PlanResult`` that holds it: ``plans`` is kept as a tuple and
    ``skipped`` as a ``ReadOnlyDict`` (a copy of what was given)."""

    request: PlanRequest
    plans: Sequence[Plan]  # every simulated candidate, best first
    candidates: int  # enumerated
    evaluated: int  # simulated
    seconds: float
    skipped: Mapping[str, int] = field(default_factory=dict)  # reason -> count

    def __post_init__(self) -> None:
        object.__setattr__(self, "plans", tuple(self.plans))
        if not isinstance(self.skipped, ReadOnlyDict):
            object.__setattr__(self, "skipped", ReadOnlyDict(self.skipped))

    @property
    def fitting(self) -> list[Plan]:
        return [p for p in self.plans if p.fits]

    def best(self, n: int = 5) -> list[Plan]:
        return self.fitting[:n]

    def pareto(self) -> list[Plan]:
        return pareto_front(self.fitting)

    def warnings(self, n: int = 5) -> list[str]:
        """What the memory passes could not do for the plans shown (the best ``n`` and the Pareto
        frontier), each once with its plan: a search collects them instead of logging them."""
        out: dict[str, None] = {}
        for plan in self.best(n) + self.pareto():
            for warning in plan.sim.warnings if plan.sim is not None else ():
                out[f"{plan.layout} {plan.choice.label()}: {warning}"] = None
        return list(out)

    def best_by_tp(self) -> dict[int, Plan]:
        out: dict[int, Plan] = {}
        for plan in self.fitting:
            out.setdefault(plan.layout.tp, plan)
        return dict(sorted(out.items()))


def pareto_front(plans: list[Plan]) -> list[Plan]:
    """Plans that no other plan beats in both throughput and memory, by increasing memory."""
    front: list[Plan] = []
    for plan in sorted(plans, key=lambda p: (p.memory.total, p.sort_key())):
        if not front or plan.tokens_per_second > front[-1].tokens_per_second * (1 + 1e-9):
            front.append(plan)
    return front
