"""The offload placement pass: insert OFFLOAD after chosen forwards and RELOAD before their backwards.

Works on any compute-only schedule (any family, loop or V placement, B or I/W backwards, with or
without R). Algorithm, per rank (per pair of ranks when they share a host link):

1. Simulate the schedule without copies: every activation's lifespan is [end of F, start of its
   backward]; the rank's memory curve is known at every compute start and end ("points").
2. Rank the candidates the policy allows by *value*, size x (lifespan - D2H - H2D): the memory-time
   an offload can save. Activations with no value (a copy round trip does not fit) are skipped.
3. In that order, place each copy on its copy engine (and shared link): D2H as early as possible
   after F, H2D as late as possible while it still completes before the backward starts. Copies are
   issued at list positions, so starts are grid points or back-to-back after the previous copy on the
   engine; the simulator then reproduces the plan exactly and no backward ever waits. A candidate
   that does not fit is *unhidden*: left on the device and reported, never a stall.
4. ``auto`` and ``budget`` prune: offloads whose removal keeps the peak at the target are dropped
   (fewest copies), and the rest are placed again so that the plan stays exact.

The reference implementation used fixed alternating D2H/H2D windows, a lifespan filter of three
windows and failed outright when its windows ran out; here the greedy fills any free engine time,
so more is hidden at a given offload ratio and the rest degrades gracefully.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from pipeoffload.costs import CostModel
from pipeoffload.ir import Action, ActionKind, Schedule
from pipeoffload.passes.copy_plan import EPS, Activation, CopyGroup, Placed, RankTimeline
from pipeoffload.policies import OffloadPolicy
from pipeoffload.simulate import Timeline, simulate

log = logging.getLogger(__name__)
K = ActionKind
Key = tuple[int, int]


@dataclass(frozen=True)
class RankOffloadReport:
    rank: int
    offloaded: int
    unhidden: tuple[Key, ...]  # (stage, microbatch) the policy wanted off the device, not hideable
    too_short: int  # candidates whose copies could not leave them off the device at all
    peak_before: float  # peak without the memory passes (activation units)
    peak_after: float  # planned peak with the offloads placed
    memory: tuple[float, ...] = field(default=(), repr=False, compare=False)  # planned, per timeline point


@dataclass(frozen=True)
class OffloadReport:
    """What the offload pass did; planned numbers (the simulator gives the final ones)."""

    policy: str
    per_rank: tuple[RankOffloadReport, ...] = ()
    budget: float | None = None  # per-rank target in activation units, for budget policies
    recompute: str = "none"
    recomputed: tuple[Key, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def offloaded(self) -> int:
        return sum(r.offloaded for r in self.per_rank)

    @property
    def unhidden(self) -> tuple[Key, ...]:
        return tuple(k for r in self.per_rank for k in r.unhidden)

    @property
    def peak_before(self) -> float:
        return max((r.peak_before for r in self.per_rank), default=0.0)

    @property
    def peak_after(self) -> float:
        return max((r.peak_after for r in self.per_rank), default=0.0)

    @property
    def budget_met(self) -> bool | None:
        return None if self.budget is None else bool(self.peak_after <= self.budget + EPS)

    def summary(self) -> str:
        parts = []
        if self.policy != "none":
            parts.append(f"offload {self.policy}: {self.offloaded} activations offloaded, {len(self.unhidden)} "
                         "could not be hidden by the copy lane")
        if self.recompute != "none":
            parts.append(f"recompute {self.recompute}: {len(self.recomputed)} activations")
        parts.append(f"planned peak {self.peak_before:g} -> {self.peak_after:g} activation units")
        if self.budget is not None:
            parts.append(f"budget {self.budget:g} {'met' if self.budget_met else 'NOT met'}")
        return "; ".join([*parts, *self.notes])


# ---- the policy driver ---------------------------------------------------------------------------
Pick = tuple[int, Activation]


@dataclass
class _RankState:
    timeline: RankTimeline
    memory: np.ndarray
    placed: list[Placed] = field(default_factory=list)
    unhidden: list[Key] = field(default_factory=list)
    too_short: int = 0

    def peak(self) -> float:
        """Peak on the planning grid (conservative where a reload starts between grid points)."""
        return float(self.memory.max()) if len(self.memory) else 0.0

    def exact_peak(self) -> float:
        """Peak with every copy at its planned time, as the simulator measures it."""
        tl = self.timeline
        steps = np.diff(np.concatenate(([0.0], tl.memory)))
        events = list(zip(tl.point_list, steps.tolist()))
        for p in self.placed:
            events.append((p.d2h_end, -p.activation.size))
            events.append((p.h2d_start, p.activation.size))
        level = peak = 0.0
        for _, delta in sorted(events):
            level += delta
            peak = max(peak, level)
        return float(peak)

    def add(self, p: Placed) -> None:
        self.memory[p.lo:p.hi] -= p.activation.size
        self.placed.append(p)


class _Plan:
    """One candidate plan for a group: its copy resources and each rank's state."""

    def __init__(self, timelines: list[RankTimeline], costs: CostModel, relaxed: bool) -> None:
        self.args = (timelines, costs, relaxed)
        self.group = CopyGroup(timelines, costs, relaxed)
        self.states = {tl.rank: _RankState(tl, tl.memory.copy()) for tl in timelines}

    def keys(self) -> set[tuple[int, int, int]]:
        return {(r, p.activation.stage, p.activation.microbatch) for r, s in self.states.items() for p in s.placed}

    def score(self) -> tuple[float, int]:
        """Lower is better: the group's peak, then (for equal peaks) fewer copies."""
        return (max(s.exact_peak() for s in self.states.values()), sum(len(s.placed) for s in self.states.values()))

    def pack(self, picks: list[Pick]) -> list[Pick]:
        """Pack ``picks`` into this (empty) plan; returns those that did not fit.

        A pick that fails after its reload was reserved frees that slot, and a reload packed right
        behind it would then start earlier than planned; so the set is packed again without the
        failures until a round places everything it tries (a few rounds when the lane is overloaded).
        """
        failed: list[Pick] = []
        for _ in range(_PACK_ROUNDS):
            placed, missed = self.group.pack(picks)
            if not missed:
                break
            failed += missed
            missing = {(r, x.stage, x.microbatch) for r, x in missed}
            picks = [(r, x) for r, x in picks if (r, x.stage, x.microbatch) not in missing]
            self.group = CopyGroup(*self.args)
        else:
            log.debug("packing did not settle in %d rounds; some starts may come earlier than planned", _PACK_ROUNDS)
        for rank, p in placed:
            self.states[rank].add(p)
        return failed

    def greedy(self, picks: list[Pick], budget: float | None) -> list[Pick]:
        """Place one at a time in the given order; with a budget, keep only offloads that lower an
        over-budget point. Returns the picks that did not fit."""
        failed = []
        for rank, x in picks:
            state = self.states[rank]
            if budget is not None and state.peak() <= budget + EPS:
                continue
            p = self.group.place(rank, x)
            if p is None:
                failed.append((rank, x))
            elif p.hi <= p.lo or (budget is not None and state.memory[p.lo:p.hi].max() <= budget + EPS):
                self.group.unplace(rank, p)
            else:
                state.add(p)
        return failed

    def prune(self, targets: dict[int, float]) -> None:
        """Drop offloads not needed to keep each rank at its target (least valuable first)."""
        for rank, state in self.states.items():
            keep = []
            for p in sorted(state.placed, key=lambda q: (q.activation.value, q.activation.stage,
                                                         q.activation.microbatch)):
                window = state.memory[p.lo:p.hi]
                if len(window) and window.max() + p.activation.size <= targets[rank] + EPS:
                    window += p.activation.size
                    self.group.unplace(rank, p)
                else:
                    keep.append(p)
            state.placed = keep


def _plan_group(timelines: list[RankTimeline], costs: CostModel, policy: OffloadPolicy,
                candidates: dict[int, list[Activation]], budget: float | None, relaxed: bool) -> _Plan:
    order = _priority(candidates)
    worth = [(r, x) for r, x in order if x.value > EPS]
    short = {r: sum(1 for x in xs if x.value <= EPS) for r, xs in candidates.items()}

    def fresh() -> _Plan:
        return _Plan(timelines, costs, relaxed)

    if budget is None:
        plan = fresh()
        failed = plan.pack(worth)
        if failed:  # the copy lane is overloaded: also try choosing by value, then packing that set
            failed = plan.greedy(failed, None)
            chooser = fresh()
            chooser.greedy(worth, None)
            alt = fresh()
            picked = chooser.keys()
            alt_failed = alt.pack([(r, x) for r, x in worth if (r, x.stage, x.microbatch) in picked])
            placed = alt.keys()
            alt_failed = alt.greedy([(r, x) for r, x in worth if (r, x.stage, x.microbatch) not in placed], None)
            if alt.score() < plan.score():
                plan, failed = alt, alt_failed
    else:
        chooser = fresh()
        tried_failed = chooser.greedy(worth, budget)
        picked = chooser.keys()
        plan = fresh()
        failed = plan.pack([(r, x) for r, x in worth if (r, x.stage, x.microbatch) in picked])
        failed = plan.greedy(failed, budget) + tried_failed
        if chooser.score() < plan.score():
            plan, failed = chooser, tried_failed
    if policy.kind in ("auto", "budget"):
        plan = _pruned(plan, timelines, costs, relaxed, worth, budget)
    placed = plan.keys()
    for rank, state in plan.states.items():
        state.unhidden = [(x.stage, x.microbatch) for r, x in failed
                          if r == rank and (r, x.stage, x.microbatch) not in placed]
        state.too_short = short.get(rank, 0)
    return plan


def _pruned(plan: _Plan, timelines: list[RankTimeline], costs: CostModel, relaxed: bool,
            worth: list[Pick], budget: float | None) -> _Plan:
    """The plan with redundant offloads dropped, packed again so that every start stays exact."""
    targets = {r: max(s.exact_peak(), budget or 0.0) for r, s in plan.states.items()}
    before = plan.keys()
    plan.prune(targets)
    survivors = plan.keys()
    if survivors == before:
        return plan
    again = _Plan(timelines, costs, relaxed)
    if again.pack([(r, x) for r, x in worth if (r, x.stage, x.microbatch) in survivors]):
        log.debug("packing the pruned plan again failed; keeping its original starts (only ever earlier)")
        return plan
    return again


def _priority(candidates: dict[int, list[Activation]]) -> list[Pick]:
    """Candidates by value, most valuable first (ties: earlier forward, then stage, microbatch, rank)."""
    pairs = [(r, x) for r, xs in candidates.items() for x in xs]
    return sorted(pairs, key=lambda rx: (-rx[1].value, rx[1].f_end, rx[1].stage, rx[1].microbatch, rx[0]))


# ---- entry point -----------------------------------------------------------------------------------
def plan_offload(schedule: Schedule, costs: CostModel, policy: OffloadPolicy | str,
                 *, exclude: frozenset[Key] | set[Key] = frozenset(),
                 timeline: Timeline | None = None) -> tuple[Schedule, OffloadReport]:
    """Insert OFFLOAD/RELOAD into a compute-only ``schedule`` (copies already in it are replaced).

    ``exclude`` lists (stage, microbatch) activations that must stay put (e.g. recomputed ones);
    ``timeline`` is the simulation of ``schedule`` under ``costs`` if the caller already has it.
    """
    policy = OffloadPolicy.parse(policy)
    base = schedule.compute_only()
    if policy.kind == "none" and timeline is None:
        return base, OffloadReport(str(policy))
    timeline = timeline if timeline is not None else simulate(base, costs)
    recomputed = {(a.stage, a.microbatch) for row in base.actions for a in row if a.kind is K.R}
    timelines = [RankTimeline(r, base.actions[r], timeline.start[r], timeline.end[r], costs, recomputed)
                 for r in range(base.num_ranks)]
    budget = policy.budget_units(base.stages_per_rank) if policy.kind == "budget" else None
    chosen = _candidates(timelines, policy, set(exclude))
    groups = _groups(base.num_ranks, costs.shared_host_link)

    def plan_all(relaxed: bool) -> dict[int, _RankState]:
        states: dict[int, _RankState] = {}
        for members in groups:
            tls = [timelines[r] for r in members]
            states.update(_plan_group(tls, costs, policy, {r: chosen[r] for r in members}, budget, relaxed).states)
        return states

    states = plan_all(relaxed=False)
    peaks = {r: s.exact_peak() for r, s in states.items()}
    if costs.shared_host_link and policy.kind != "none":
        states, peaks = _shared_link_plans(base, costs, states, peaks, plan_all(relaxed=True), groups)
    rows = [_emit(states[r]) for r in range(base.num_ranks)]
    report = OffloadReport(
        str(policy),
        tuple(RankOffloadReport(r, len(s.placed), tuple(s.unhidden), s.too_short,
                                float(timelines[r].memory.max()) if len(timelines[r].memory) else 0.0,
                                peaks[r], tuple(s.memory.tolist()))
              for r, s in sorted(states.items())),
        budget,
    )
    return base.with_actions(rows), report


def _shared_link_plans(base: Schedule, costs: CostModel, strict: dict[int, _RankState], strict_peaks: dict[int, float],
                       relaxed: dict[int, _RankState], groups: list[list[int]]
                       ) -> tuple[dict[int, _RankState], dict[int, float]]:
    """Per pair, the better of the exact plan and the denser relaxed plan, checked by simulation.

    A relaxed plan may start a copy when the partner's copy ends; the simulator resolves which goes
    first by its processing order, so a reload can come late. Offloads whose backward waited are
    dropped (and reported unhidden) until a simulation shows no stall; a pair keeps the relaxed plan
    only if it then has a lower simulated peak than its exact plan.
    """
    for _ in range(_REPAIR_ROUNDS):
        timeline = simulate(base.with_actions([_emit(relaxed[r]) for r in range(base.num_ranks)]), costs)
        late = {(a.stage, a.microbatch) for a in timeline.stalls}
        if not late:
            break
        for state in relaxed.values():
            drop = [p for p in state.placed if (p.activation.stage, p.activation.microbatch) in late]
            for p in drop:
                state.placed.remove(p)
                state.memory[p.lo:p.hi] += p.activation.size
                state.unhidden.append((p.activation.stage, p.activation.microbatch))
    else:
        return strict, strict_peaks
    states, peaks = dict(strict), dict(strict_peaks)
    for members in groups:
        simulated = {r: timeline.per_rank[r].peak_activation_units for r in members}
        if max(simulated.values()) < max(strict_peaks[r] for r in members) - EPS:
            states.update({r: relaxed[r] for r in members})
            peaks.update(simulated)
    return states, peaks


_REPAIR_ROUNDS = 8
_PACK_ROUNDS = 16


def _groups(num_ranks: int, shared_link: bool) -> list[list[int]]:
    if not shared_link:
        return [[r] for r in range(num_ranks)]
    return [list(range(p, min(p + 2, num_ranks))) for p in range(0, num_ranks, 2)]


def _candidates(timelines: list[RankTimeline], policy: OffloadPolicy, exclude: set[Key]) -> dict[int, list[Activation]]:
    out = {}
    for tl in timelines:
        acts = [x for key, x in tl.activations.items() if key not in exclude and policy.kind != "none"]
        if policy.kind == "first":
            stages = set(longest_lived_stages(tl.activations.values(), policy.count))
            acts = [x for x in acts if x.stage in stages]
        out[tl.rank] = acts
    return out


def longest_lived_stages(activations, count: int, skip: set[int] | frozenset[int] = frozenset()) -> list[int]:  # type: ignore[no-untyped-def]
    """The ``count`` local stages whose activations live longest on average (ties: lower stage)."""
    total: dict[int, list[float]] = {}
    for x in activations:
        total.setdefault(x.stage, []).append(x.lifespan)
    ranked = sorted((s for s in total if s not in skip), key=lambda s: (-sum(total[s]) / len(total[s]), s))
    return ranked[:count]


def _emit(state: _RankState) -> list[Action]:
    """The rank's compute list with each planned copy at the position that issues it on time."""
    tl = state.timeline
    copies: list[tuple[int, float, int, Action]] = []
    for p in state.placed:
        x = p.activation
        copies.append((tl.position(p.d2h_start), p.d2h_start, 0, Action(K.OFFLOAD, x.stage, x.microbatch)))
        copies.append((tl.position(p.h2d_start, x.back_index), p.h2d_start, 1, Action(K.RELOAD, x.stage, x.microbatch)))
    copies.sort(key=lambda c: (c[0], c[1], c[2], c[3].stage, c[3].microbatch))
    at: dict[int, list[Action]] = {}
    for position, _, _, action in copies:
        at.setdefault(position, []).append(action)
    row: list[Action] = []
    for index, a in enumerate(tl.actions):
        if index in at:
            row.extend(at[index])
        row.append(a)
    row.extend(at.get(len(tl.actions), ()))
    return row
