"""Offload and recompute policies: typed values with a short text form for the CLI.

Text forms (case-insensitive)::

    offload    none | all | first:K | auto | budget:X | budget:Xrank
    recompute  none | all | first:K | auto, optionally followed by ",partial" / ",lgd" / ",partial:S:T"

``budget:X`` is a per-rank memory target in activation units (``budget:Xrank`` in rank units, i.e.
X times stages_per_rank activation units). ``partial`` models the paper's recomputation of
LayerNorm, GeLU and dropout in the backward: a fraction S of each activation's bytes is not
stored, for T times the stage's forward time of extra backward work (``lgd`` = the paper's
34 -> 20 bytes*sbh per layer, S = 14/34, T = 0.05).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from pipeoffload.costs import CostModel
from pipeoffload.errors import ConfigError

OFFLOAD_FORMS = "none, all, first:K (K >= 1), auto, budget:X (activation units) or budget:Xrank (rank units)"
RECOMPUTE_FORMS = "none, all, first:K (K >= 1) or auto, optionally followed by ',partial', ',lgd' or ',partial:S:T'"

LGD_SAVING = 14.0 / 34.0  # 34 -> 20 bytes*sbh per layer when LayerNorm, GeLU and dropout are recomputed
LGD_TIME = 0.05  # extra backward time as a fraction of F; an estimate (elementwise ops only)


@dataclass(frozen=True)
class OffloadPolicy:
    """Which activations the offload pass should try to move to host memory.

    kind: 'none' | 'all' | 'first' (the ``count`` longest-lived local stages on every rank) |
    'auto' (lowest peak the copy lane can hide, with the fewest copies) | 'budget' (the fewest
    copies that bring every rank's peak to ``budget`` activation units, or ``budget`` rank units
    when ``rank_units``).

    ``max_stall``: how much longer, in percent of the step without copies, the plan may make the
    step for a lower peak (0: copies never make compute wait). Not part of the text form: the
    ``--max-stall`` option sets it. ``rank_offsets``: what each rank holds besides activations
    (weights, optimizer state), in activation units; a stall budget's plans are then compared by
    each rank's activations plus its offset, the worst rank's total memory (the planner sets it).
    """

    kind: str = "none"
    count: int = 0
    budget: float = 0.0
    rank_units: bool = False
    max_stall: float = 0.0
    rank_offsets: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ("none", "all", "first", "auto", "budget"):
            raise ConfigError(f"offload policy kind {self.kind!r} is unknown; valid forms: {OFFLOAD_FORMS}")
        if self.kind == "first" and self.count < 1:
            raise ConfigError(f"offload first:{self.count}: K must be >= 1; valid forms: {OFFLOAD_FORMS}")
        if self.kind == "budget" and not self.budget >= 0:
            raise ConfigError(f"offload budget:{self.budget}: the target must be >= 0 units")
        if not (math.isfinite(self.max_stall) and self.max_stall >= 0):
            raise ConfigError(f"max_stall {self.max_stall!r}: must be a finite percentage >= 0 (e.g. 2 for 2 %)")
        if not all(math.isfinite(x) and x >= 0 for x in self.rank_offsets):
            raise ConfigError(f"rank_offsets {self.rank_offsets!r}: each must be a finite number of units >= 0")
        if self.max_stall > 0 and self.kind == "none":
            raise ConfigError.named(lambda n: (
                f"{n.given('max_stall', f'{self.max_stall:g}')} lets offload copies stall, but "
                f"{n('offload')} is none: choose an offload policy (e.g. {n.given('offload', 'all')}) "
                f"or leave {n('max_stall')} out"))

    @classmethod
    def parse(cls, text: str | OffloadPolicy | None) -> OffloadPolicy:
        if isinstance(text, OffloadPolicy):
            return text
        raw = "none" if text is None else str(text).strip().lower()
        name, _, arg = raw.partition(":")
        if name in ("none", "all", "auto") and not arg:
            return cls(name)
        if name == "first" and arg:
            return cls("first", count=_int(arg, raw, "offload"))
        if name == "budget" and arg:
            rank_units = arg.endswith("rank")
            number = arg[: -len("rank")] if rank_units else arg
            return cls("budget", budget=_float(number, raw, "offload"), rank_units=rank_units)
        raise ConfigError.named(lambda n: f"{n.given('offload', repr(text))}: the policy is not understood; "
                                f"valid forms: {OFFLOAD_FORMS}")

    def budget_units(self, stages_per_rank: int) -> float:
        """The per-rank target in activation units."""
        return self.budget * stages_per_rank if self.rank_units else self.budget

    def __str__(self) -> str:
        if self.kind == "first":
            return f"first:{self.count}"
        if self.kind == "budget":
            return f"budget:{self.budget:g}" + ("rank" if self.rank_units else "")
        return self.kind


@dataclass(frozen=True)
class RecomputePolicy:
    """Which activations are dropped after F and recomputed (an R action) before their backward.

    kind: 'none' | 'all' (every activation that lives beyond its own forward) | 'first' (the
    ``count`` longest-lived local stages on every rank) | 'auto' (what the offload policy wanted off
    the device but the copy lane could not hide, or what stays above the offload budget). ``partial_saving``/``partial_time`` model partial recomputation,
    which needs no action: it changes the cost model (see ``apply_to``).
    """

    kind: str = "none"
    count: int = 0
    partial_saving: float = 0.0
    partial_time: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in ("none", "all", "first", "auto"):
            raise ConfigError(f"recompute policy kind {self.kind!r} is unknown; valid forms: {RECOMPUTE_FORMS}")
        if self.kind == "first" and self.count < 1:
            raise ConfigError(f"recompute first:{self.count}: K must be >= 1; valid forms: {RECOMPUTE_FORMS}")
        if not 0.0 <= self.partial_saving < 1.0:
            raise ConfigError(f"partial recompute saving {self.partial_saving!r}: must be in [0, 1)")
        if not self.partial_time >= 0.0:
            raise ConfigError(f"partial recompute time {self.partial_time!r}: must be >= 0")

    @property
    def partial(self) -> bool:
        return self.partial_saving > 0 or self.partial_time > 0

    @classmethod
    def parse(cls, text: str | RecomputePolicy | None) -> RecomputePolicy:
        if isinstance(text, RecomputePolicy):
            return text
        raw = "none" if text is None else str(text).strip().lower()
        parts = [p.strip() for p in raw.split(",")]
        if not all(parts):  # '' or 'all,,lgd': as the offload policy, an empty form is no policy at all
            raise ConfigError(f"recompute policy {raw!r} has an empty part; valid forms: {RECOMPUTE_FORMS}")
        kind, count, saving, time = "none", 0, 0.0, 0.0
        for part in parts:
            name, _, arg = part.partition(":")
            if name in ("partial", "lgd"):
                if name == "lgd" or not arg:
                    saving, time = LGD_SAVING, LGD_TIME
                else:
                    fields = arg.split(":")
                    if len(fields) != 2:
                        raise ConfigError(f"recompute {part!r}: write partial:S:T (saved fraction, extra F fraction)")
                    saving, time = (_float(f, raw, "recompute") for f in fields)
            elif name in ("none", "all", "auto") and not arg and kind == "none":
                kind = name
            elif name == "first" and arg and kind == "none":
                kind, count = "first", _int(arg, raw, "recompute")
            else:
                raise ConfigError.named(lambda n: f"{n.given('recompute', repr(text))}: the policy is not "
                                        f"understood; valid forms: {RECOMPUTE_FORMS}")
        return cls(kind, count, saving, time)

    def apply_to(self, costs: CostModel) -> CostModel:
        """The cost model with this policy's partial recomputation (idempotent; no-op without one)."""
        if not self.partial:
            return costs
        return replace(costs, partial_recompute_saving=self.partial_saving, partial_recompute_time=self.partial_time)

    def __str__(self) -> str:
        head = f"first:{self.count}" if self.kind == "first" else self.kind
        if not self.partial:
            return head
        tail = "lgd" if (self.partial_saving, self.partial_time) == (LGD_SAVING, LGD_TIME) else (
            f"partial:{self.partial_saving:g}:{self.partial_time:g}")
        return tail if head == "none" else f"{head},{tail}"



# Number text as a user types it, in a policy's form and on the command line (``service.checks``):
# plain ASCII digits, an optional sign, a decimal point and an exponent. ``int()``/``float()`` also take
# Python's literal extras (``1_0``, full-width and Arabic-Indic digits, surrounding spaces), which turn a
# typo into another value (``0_5`` read as 5): those are refused.
INT_TEXT = re.compile(r"[+-]?[0-9]+")
NUMBER_TEXT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|[+-]?(inf|infinity|nan)", re.IGNORECASE)


def boolean(value: object) -> bool:
    """``value`` if it is True or False: text such as ``"no"`` (true to Python) or a number is refused
    (``ValueError``; ``service.checks`` and the planner's dataclasses name the field)."""
    if not isinstance(value, bool):
        raise ValueError(f"{value!r} is not True or False")
    return value


def check_booleans(owner: object, *names: str, optional: tuple[str, ...] = ()) -> None:
    """Refuse (one ``ConfigError`` line) a True/False field of ``owner`` that holds anything else (``"no"``
    is true to Python and would silently switch the feature on); ``optional`` fields may also be None."""
    for name in names + optional:
        value = getattr(owner, name)
        if not isinstance(value, bool) and not (value is None and name in optional):
            extra = " or None" if name in optional else ""
            raise ConfigError(f"{name}={value!r}: must be True or False{extra} (not text or a number)")


def _int(text: str, whole: str, field: str) -> int:
    """K of ``field``'s policy ``whole`` (offload or recompute ``first:K``)."""
    if not INT_TEXT.fullmatch(text):
        raise _form_error(field, whole, f"{text!r} is not an integer")
    value = int(text)
    if value < 1:
        raise _form_error(field, whole, f"K={value} must be >= 1")
    return value


def _float(text: str, whole: str, field: str) -> float:
    """A number of ``field``'s policy ``whole`` (an offload budget, a partial recompute's fractions)."""
    if not NUMBER_TEXT.fullmatch(text):  # inf and nan are refused below
        raise _form_error(field, whole, f"{text!r} is not a number")
    value = float(text)
    if not 0 <= value < math.inf:  # typed: an infinite budget would print as Infinity in --json (the planner's
        # own "no budget" sentinel is inf, so only what is typed is refused)
        raise _form_error(field, whole, f"{value} must be a finite number >= 0")
    return value


def _form_error(field: str, whole: str, problem: str) -> ConfigError:
    """A policy's text that breaks its form, naming the field or flag it was given to."""
    forms = OFFLOAD_FORMS if field == "offload" else RECOMPUTE_FORMS
    return ConfigError.named(lambda n: f"{n.given(field, repr(whole))}: {problem}; valid forms: {forms}")
