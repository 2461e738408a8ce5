"""Simulate one schedule choice cheaply: generate, lower, simulate, and extrapolate over microbatches.

A pipeline schedule with uniform-per-microbatch costs is periodic once warmed up: adding one period of
P microbatches (at least pp: the family's period rounded up) adds a constant time and leaves the
memory peaks unchanged. So a step of m microbatches is simulated at small sizes m1, m1+P, m1+2P, ... with the
same remainder mod P until two periods add the same time and the peaks settle, and its makespan is
extrapolated linearly; if that would cost more than m itself, m is simulated. The offload pass places
copies greedily over the whole step, so schedules with offload are estimates until a full simulation
confirms them (``SimSummary.exact``). Tests check all of this against full simulations.

Vocabulary: ``pp`` is the layout's pipeline-parallel size, which is the schedule's number of ranks
(``num_ranks`` in the core; the paper's d); ``m`` is the number of microbatches per step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from pipeoffload._perf import Memo
from pipeoffload.costs import CostModel
from pipeoffload.ir import ActionKind, Schedule
from pipeoffload.passes.lower import POLICIES, lower_with_report
from pipeoffload.passes.offload import planned_figures
from pipeoffload.placement import Placement
from pipeoffload.policies import OffloadPolicy, RecomputePolicy
from pipeoffload.schedules import generate, get_spec
from pipeoffload.simulator import Timeline, figures_of, simulate

_TOL = 1e-6


_NO_OFFLOAD, _NO_RECOMPUTE = OffloadPolicy(), RecomputePolicy()


@dataclass(frozen=True)
class ScheduleChoice:
    """Everything about the pipeline schedule except the layout: family, v, g, offload, recompute.

    The policies are typed values; their text forms (``"auto"``, ``"budget:3.5"``, ``"first:1"``)
    are accepted and parsed once here. Choices order by their text forms, as they always have (the
    search's tie-breaks depend on it).
    """

    family: str
    stages_per_rank: int = 1
    group_size: int | None = None
    offload: OffloadPolicy = OffloadPolicy()
    recompute: RecomputePolicy = RecomputePolicy()

    def __post_init__(self) -> None:
        object.__setattr__(self, "offload", OffloadPolicy.parse(self.offload))
        object.__setattr__(self, "recompute", RecomputePolicy.parse(self.recompute))

    def _order(self) -> tuple:
        return (self.family, self.stages_per_rank, self.group_size, str(self.offload), self.offload.max_stall,
                str(self.recompute))

    def __lt__(self, other: ScheduleChoice) -> bool:
        return self._order() < other._order()

    def __le__(self, other: ScheduleChoice) -> bool:
        return self._order() <= other._order()

    def __gt__(self, other: ScheduleChoice) -> bool:
        return self._order() > other._order()

    def __ge__(self, other: ScheduleChoice) -> bool:
        return self._order() >= other._order()

    def plain(self) -> ScheduleChoice:
        """The same schedule without memory policies."""
        return self if self.is_plain() else replace(self, offload=OffloadPolicy(), recompute=RecomputePolicy())

    def is_plain(self) -> bool:
        """No offload and no recompute."""
        return self.offload == _NO_OFFLOAD and self.recompute == _NO_RECOMPUTE

    def periodic(self) -> bool:
        """Whether the lowered schedule repeats like the compute schedule (tests check the
        extrapolation for these): no offload and no cost-driven recompute. The offload pass places
        copies greedily over the whole step, so its choices can differ with the microbatch count."""
        return self.offload.kind == "none" and (self.recompute == RecomputePolicy() or self.recompute.kind == "first")

    def label(self) -> str:
        parts = [self.family, f"v={self.stages_per_rank}"]
        if self.group_size is not None:
            parts.append(f"g={self.group_size}")
        parts.append(f"offload={self.offload}")
        if self.offload.max_stall > 0:
            parts.append(f"max_stall={self.offload.max_stall:g}%")
        parts.append(f"recompute={self.recompute}")
        return " ".join(parts)


@dataclass(frozen=True)
class SimSummary:
    """What the planner needs from a simulation, for the full microbatch count."""

    makespan: float
    busy: tuple[float, ...]  # compute time per rank
    peak_units: tuple[float, ...]  # resident activation units per rank
    host_units: tuple[float, ...]  # activation units on the host per rank
    stall: tuple[float, ...]  # time per rank its backward waited for a reload
    extrapolated: bool
    exact: bool = True  # False: an estimate from small sizes, to be confirmed by a full simulation
    changed: bool = False  # the lowering added OFFLOAD or R actions (else the plain schedule's twin)
    recomputed: bool = False  # the lowering added R actions (``recompute auto`` adds none where they buy nothing)
    missed_budget: bool = False  # an ``offload budget:X`` the memory passes could not bring every rank to
    warnings: tuple[str, ...] = ()  # what the memory passes could not do (collected, not logged)

    @property
    def bubble_ratio(self) -> float:
        n = len(self.busy)
        return 1.0 - sum(self.busy) / (n * self.makespan) if self.makespan > 0 else 0.0


def lowering_options() -> tuple[str, ...]:
    """The memory policies ``lower`` accepts (declared by ``passes.lower.POLICIES``)."""
    return POLICIES


def build(choice: ScheduleChoice, pp: int, m: int, costs: CostModel, memo: Memo | None = None) -> Schedule:
    """The schedule of ``choice`` for pp ranks and m microbatches, memory passes applied, without SEND/RECV:
    the simulator models a schedule's transfers implicitly with the same result (tests check it).
    ``memo``: the caller's, when it builds or simulates related choices (see ``simulate_choice``)."""
    return _build(choice, pp, m, costs, memo if memo is not None else Memo()).schedule


@dataclass(frozen=True)
class _Built:
    """A lowered schedule and what the search reads from its memory passes."""

    schedule: Schedule
    warnings: tuple[str, ...] = ()  # what the passes could not do (collected, not logged)
    changed: bool = False  # they added OFFLOAD or R actions (under a stall budget: the budget changed the plan)
    missed_budget: bool = False  # an offload budget not met (``OffloadReport.budget_met``)


def _build(choice: ScheduleChoice, pp: int, m: int, costs: CostModel, memo: Memo) -> _Built:
    """``build`` plus the warnings of the memory passes (a policy that cannot meet its target is
    expected while exploring: the search reports it with the plan instead of logging it), whether
    they added OFFLOAD or R actions (under a stall budget: whether the budget changed the plan) and
    whether an offload budget was missed."""
    schedule = _generate(choice, pp, m, costs, memo)
    policies = {k: getattr(choice, k) for k in POLICIES if getattr(choice, k).kind != "none"}
    if not policies:
        return _Built(schedule)
    lowered, report = lower_with_report(schedule, costs, check=False, comms=False, log_warnings=False,
                                        memo=memo, **policies)
    changed = bool(report.offloaded or report.recomputed)
    if choice.offload.max_stall > 0:  # the same plan as without the budget is that variant's twin
        changed = changed and report.copy_time_factor < 1
    return _Built(lowered, report.warnings, changed, report.budget_met is False)


def time_lower_bound(choice: ScheduleChoice, pp: int, m: int, costs: CostModel) -> float:
    """A makespan no simulation of ``choice`` can beat: the busiest rank's compute plus the forward
    time of the stages before its first stage (it cannot start earlier). Used to prune the search.
    Recomputation is not counted: which activations a policy recomputes depends on the schedule."""
    placement = placement_of(choice, pp)
    best = 0.0
    for rank in range(pp):
        stages = placement.stages_of(rank)
        fill = sum(costs.f(s) for s in range(min(stages)))
        busy = m * sum(costs.f(s) + costs.b(s) for s in stages)
        best = max(best, fill + busy)
    return best


def period(choice: ScheduleChoice, pp: int, m: int) -> int | None:
    """Microbatches after which the steady state repeats (the registry's fact), or None."""
    return get_spec(choice.family).period(pp, m, choice.group_size)


def _generate(choice: ScheduleChoice, pp: int, m: int, costs: CostModel | None, memo: Memo) -> Schedule:
    cost_aware = costs is not None and "costs" in get_spec(choice.family).options
    return memo(_generated, choice.family, choice.stages_per_rank, choice.group_size, pp, m,
                costs if cost_aware else None)


def _generated(family: str, v: int, group_size: int | None, pp: int, m: int, costs: CostModel | None) -> Schedule:
    """A family's compute-only schedule (kept in the search's memo: a schedule's memory-policy variants
    and its small-size estimates lower the same schedule; generators are pure)."""
    options: dict[str, object] = {"group_size": group_size} if group_size is not None else {}
    if costs is not None:
        options["costs"] = costs  # cost-aware families place W by the real stage times
    return generate(family, pp, m, v, **options)


def placement_of(choice: ScheduleChoice, pp: int) -> Placement:
    """The family's stage -> rank map for pp ranks (loop or V), from the registry."""
    return get_spec(choice.family).placement_for(pp, choice.stages_per_rank)


def _summary(timeline: Timeline, extrapolated: bool = False, warnings: tuple[str, ...] = ()) -> SimSummary:
    ranks = timeline.per_rank
    added = (ActionKind.OFFLOAD, ActionKind.R)
    return SimSummary(
        changed=any(a.kind in added for row in timeline.schedule.actions for a in row),
        recomputed=ActionKind.R in timeline.schedule.kinds(),
        makespan=timeline.makespan,
        busy=tuple(r.busy for r in ranks),
        peak_units=tuple(r.peak_activation_units for r in ranks),
        host_units=tuple(r.peak_host_units for r in ranks),
        stall=tuple(r.stall for r in ranks),
        extrapolated=extrapolated,
        warnings=warnings,
    )


def _simulated(choice: ScheduleChoice, pp: int, m: int, costs: CostModel, memo: Memo) -> SimSummary:
    """Simulate the built schedule for its figures. A plain schedule's timeline is kept in ``memo``: the
    lowering of its memory-policy variants starts from that same simulation; a lowered schedule's
    figures are those its memory passes may have simulated already (``planned_figures``)."""
    built = _build(choice, pp, m, costs, memo)
    schedule = built.schedule
    figures = planned_figures(schedule, costs, memo) if built.changed else figures_of(memo(simulate, schedule, costs))
    return SimSummary(
        changed=built.changed,
        recomputed=ActionKind.R in schedule.kinds(),
        missed_budget=built.missed_budget,
        makespan=figures.makespan,
        busy=figures.busy,
        peak_units=figures.peak_activation_units,
        host_units=figures.peak_host_units,
        stall=figures.stall,
        extrapolated=False,
        warnings=built.warnings,
    )


def simulate_choice(choice: ScheduleChoice, pp: int, m: int, costs: CostModel, *,
                    extrapolate: bool = True, fallback: bool = True, base: SimSummary | None = None,
                    memo: Memo | None = None) -> SimSummary:
    """Simulate ``choice`` with m microbatches, through small sizes where the schedule repeats.

    Sizes m1, m1+P, m1+2P, ... are simulated until two consecutive steps of P microbatches add the
    same time and the last two sizes have the same memory peaks; the step time is then extrapolated.
    If that costs more than simulating m itself, m is simulated. When the window never settles,
    ``fallback`` simulates m; without it the result is an estimate (``exact`` False) that the caller
    must confirm with ``extrapolate=False`` before reporting it. ``base``, the extrapolated summary of
    the same schedule without offload, lets an offload-only choice be estimated from one small size:
    the offload pass never lengthens the step by design (its copies never delay compute; the WAITs
    of a throttled warm-up are kept only where the step is no longer), so its step time is the base's
    plus any difference seen at that size; under a stall budget (``max_stall``) that difference is
    the stall, scaled to m like a recomputation's time. ``memo`` keeps the schedules, simulations and offload plans that
    related calls share (a search passes its own; without one this call keeps them for itself).
    """
    memo = memo if memo is not None else Memo()
    p = period(choice, pp, m)
    if p:
        p = p * math.ceil(pp / p)  # latency-bound pipelines can alternate with a cycle of up to pp microbatches
    m1 = _small_size(m, pp, p, get_spec(choice.family).warmup_periods) if p else None
    if not extrapolate or m1 is None:
        return _full(choice, pp, m, costs, memo)
    assert p is not None
    if base is not None and base.extrapolated and not choice.periodic():
        return _policy_estimate(choice, pp, m, costs, base, min(m1, p * math.ceil((pp + 4) / p)), memo)
    sims = [_simulated(choice, pp, size, costs, memo) for size in (m1, m1 + p, m1 + 2 * p)]
    spent = 3 * m1 + 3 * p
    while not _steady(*sims[-3:]):
        size = m1 + len(sims) * p
        if fallback and (spent + size >= m or size + p > m):
            return _full(choice, pp, m, costs, memo)
        if spent + size >= m or size + p > m:
            break  # an estimate from the last window; the caller confirms it before showing it
        sims.append(_simulated(choice, pp, size, costs, memo))
        spent += size
    a, b = sims[-2], sims[-1]
    size_b = m1 + (len(sims) - 1) * p
    steps = (m - size_b) // p
    steady = _steady(*sims[-3:])
    return SimSummary(
        makespan=b.makespan + steps * (b.makespan - a.makespan),
        busy=tuple(y + steps * (y - x) for x, y in zip(a.busy, b.busy)),
        peak_units=tuple(map(max, a.peak_units, b.peak_units)),
        host_units=tuple(map(max, a.host_units, b.host_units)),
        stall=tuple(y + steps * max(0.0, y - x) for x, y in zip(a.stall, b.stall)),
        extrapolated=True,
        exact=steady and choice.periodic(),
        changed=b.changed,
        recomputed=b.recomputed,
        missed_budget=b.missed_budget,
        warnings=b.warnings,
    )


def _full(choice: ScheduleChoice, pp: int, m: int, costs: CostModel, memo: Memo) -> SimSummary:
    return _simulated(choice, pp, m, costs, memo)


def _steady(a: SimSummary, b: SimSummary, c: SimSummary) -> bool:
    """Two equal steps of time and equal memory peaks at the last two sizes."""
    step1, step2 = b.makespan - a.makespan, c.makespan - b.makespan
    return (abs(step1 - step2) <= _TOL * max(1.0, abs(step2)) and _same(b.peak_units, c.peak_units)
            and _same(b.host_units, c.host_units))


def _policy_estimate(choice: ScheduleChoice, pp: int, m: int, costs: CostModel, base: SimSummary,
                     size: int, memo: Memo) -> SimSummary:
    """One small lowering of a choice with offload or cost-driven recompute: its memory, and the time it
    adds to the plain schedule at that size, scaled to m. An estimate, confirmed before it is shown."""
    one = _simulated(choice, pp, size, costs, memo)
    plain = _simulated(choice.plain(), pp, size, costs, memo)
    scale = m / size
    return SimSummary(
        makespan=base.makespan + max(0.0, one.makespan - plain.makespan) * scale,
        busy=tuple(b + max(0.0, x - y) * scale for b, x, y in zip(base.busy, one.busy, plain.busy)),
        peak_units=one.peak_units,
        host_units=one.host_units,
        stall=tuple(x * scale for x in one.stall),
        extrapolated=True,
        exact=False,
        changed=one.changed,
        recomputed=one.recomputed,
        missed_budget=one.missed_budget,
        warnings=one.warnings,
    )


def _small_size(m: int, pp: int, p: int, warmup: int = 1) -> int | None:
    """Smallest m1 >= ``warmup`` periods with m1 = m mod p, or None when simulating m itself is about
    as cheap as three small sizes."""
    floor = max(warmup * p, 2 * pp + 8)  # short pipelines can settle only after ~10 microbatches
    m1 = m - ((m - floor) // p) * p if m > floor else m
    return m1 if 3 * m1 + 3 * p < m else None


def _same(x: tuple[float, ...], y: tuple[float, ...]) -> bool:
    return all(abs(a - b) <= _TOL * max(1.0, abs(a)) for a, b in zip(x, y))
