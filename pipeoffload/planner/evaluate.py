"""Simulate one schedule choice cheaply: generate, lower, simulate, and extrapolate over microbatches.

A pipeline schedule with uniform-per-microbatch costs is periodic once warmed up: adding one period of
P microbatches (1 for 1F1B, d for interleaved 1F1B, g for group-interleaved) adds a constant time and
leaves the memory peaks unchanged. So a step of m microbatches is simulated at two small sizes m1 and
m1+P with the same remainder mod P, and its makespan is extrapolated linearly. If the two peaks differ
(e.g. offload copies fall behind and pile up), the full size is simulated instead. Tests check the
extrapolation against full simulations.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

from pipeoffload.costs import CostModel
from pipeoffload.errors import ConfigError
from pipeoffload.passes.lower import lower
from pipeoffload.schedules import generate
from pipeoffload.simulate import Timeline, simulate

_TOL = 1e-6


@dataclass(frozen=True, order=True)
class ScheduleChoice:
    """Everything about the pipeline schedule except the layout: family, v, g, offload, recompute."""

    family: str
    stages_per_rank: int = 1
    group_size: int | None = None
    offload: str = "none"
    recompute: str = "none"

    def label(self) -> str:
        parts = [self.family, f"v={self.stages_per_rank}"]
        if self.group_size is not None:
            parts.append(f"g={self.group_size}")
        parts.append(f"offload={self.offload}")
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

    @property
    def bubble_ratio(self) -> float:
        n = len(self.busy)
        return 1.0 - sum(self.busy) / (n * self.makespan) if self.makespan > 0 else 0.0


def lowering_options() -> tuple[str, ...]:
    """The memory policies ``lower`` accepts in this build (offload/recompute land separately)."""
    params = inspect.signature(lower).parameters
    return tuple(p for p in ("offload", "recompute") if p in params)


def build(choice: ScheduleChoice, d: int, m: int, costs: CostModel):  # type: ignore[no-untyped-def]
    """The lowered schedule of ``choice`` for d ranks and m microbatches."""
    options = {"group_size": choice.group_size} if choice.group_size is not None else {}
    schedule = generate(choice.family, d, m, choice.stages_per_rank, **options)
    policies = {k: getattr(choice, k) for k in ("offload", "recompute") if getattr(choice, k) != "none"}
    if not policies:
        return schedule  # the simulator models transfers of a compute-only schedule identically, 2x faster
    missing = sorted(set(policies) - set(lowering_options()))
    if missing:
        raise ConfigError(f"{', '.join(missing)} policies are not available in this build of lower(); "
                          "use offload/recompute 'none'")
    return lower(schedule, costs, check=False, **policies)


def time_lower_bound(choice: ScheduleChoice, d: int, m: int, costs: CostModel) -> float:
    """A makespan no simulation of ``choice`` can beat: the busiest rank's compute plus the forward
    time of the stages before its first stage (it cannot start earlier). Used to prune the search."""
    placement = generate(choice.family, d, 1, choice.stages_per_rank,
                         **({"group_size": choice.group_size} if choice.group_size is not None else {})).placement
    best = 0.0
    for rank in range(d):
        stages = placement.stages_of(rank)
        fill = sum(costs.f(s) for s in range(min(stages)))
        busy = m * sum(costs.f(s) + costs.b(s) for s in stages)
        best = max(best, fill + busy)
    return best


def period(choice: ScheduleChoice, d: int, m: int) -> int | None:
    """Microbatches after which the steady state repeats, or None when not known for this family."""
    if choice.family == "1f1b":
        return 1
    if choice.family == "interleaved-1f1b":
        return d if m % d == 0 else None  # otherwise its rounds change shape with m
    if choice.family == "group-interleaved" and choice.group_size:
        return choice.group_size
    return None


def _summary(timeline: Timeline, extrapolated: bool = False) -> SimSummary:
    ranks = timeline.per_rank
    return SimSummary(
        makespan=timeline.makespan,
        busy=tuple(r.busy for r in ranks),
        peak_units=tuple(r.peak_activation_units for r in ranks),
        host_units=tuple(r.peak_host_units for r in ranks),
        stall=tuple(r.stall for r in ranks),
        extrapolated=extrapolated,
    )


def simulate_choice(choice: ScheduleChoice, d: int, m: int, costs: CostModel, *,
                    extrapolate: bool = True) -> SimSummary:
    """Simulate ``choice`` with m microbatches, through two small sizes when that is exact enough."""
    p = period(choice, d, m)
    if p:
        p = p * math.ceil(d / p)  # latency-bound pipelines can alternate with a cycle of up to d microbatches
    m1 = _small_size(m, d, p) if p else None
    if not extrapolate or m1 is None:
        return _summary(simulate(build(choice, d, m, costs), costs))
    a = _summary(simulate(build(choice, d, m1, costs), costs))
    b = _summary(simulate(build(choice, d, m1 + p, costs), costs))
    if not (_same(a.peak_units, b.peak_units) and _same(a.host_units, b.host_units)):
        return _summary(simulate(build(choice, d, m, costs), costs))
    assert p is not None
    steps = (m - m1) // p
    return SimSummary(
        makespan=a.makespan + steps * (b.makespan - a.makespan),
        busy=tuple(x + steps * (y - x) for x, y in zip(a.busy, b.busy)),
        peak_units=b.peak_units,
        host_units=b.host_units,
        stall=tuple(x + steps * max(0.0, y - x) for x, y in zip(a.stall, b.stall)),
        extrapolated=True,
    )


def _small_size(m: int, d: int, p: int) -> int | None:
    """Smallest m1 >= p with m1 = m mod p (p is at least d, so warm-up is over by the second size),
    or None when simulating m itself is about as cheap."""
    floor = p
    m1 = m - ((m - floor) // p) * p if m > floor else m
    return m1 if 2 * m1 + p < m else None  # only when two small simulations cost less than one full one


def _same(x: tuple[float, ...], y: tuple[float, ...]) -> bool:
    return all(abs(a - b) <= _TOL * max(1.0, abs(a)) for a, b in zip(x, y))
