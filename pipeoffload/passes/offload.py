"""The offload placement pass: insert OFFLOAD after chosen forwards and RELOAD before their backwards,
and for split backwards OFFLOAD_W after the I and RELOAD_W before the W (the second window).

Works on any compute-only schedule (any family, loop or V placement, B or I/W backwards, with or
without R):

1. simulate the schedule without copies: each activation has up to two windows, [end of F, start
   of its backward] for all of it and [end of I, start of W] for the ``w_fraction`` part W needs;
   each rank's memory curve is known at every compute start and end;
2. per rank (per pair of ranks sharing a host link) choose and place the copies
   (``offload_plan``, on the primitives of ``copy_plan``): every reload completes before its
   backward starts, and starts are ones the simulator reproduces exactly, so nothing stalls;
3. turn the planned times into list positions: each copy goes where the compute action before it
   ends at or before the copy's planned start.

On a shared host link the pass also tries a throttled warm-up (``passes.throttle``): WAIT actions hold
warm-up forwards until their rank's earlier offloads have drained, and the copies are planned against
that timing; kept only where the simulation shows a lower peak, no stall and no longer makespan.

The two windows of an activation are independent candidates: the pass picks, per activation, the
first, the second, both or neither, by the memory-time each saves (``Activation.value``) for the
copy-lane time it takes.

On own links, ``auto`` and an unmet budget also try the plans of other targets (``auto``'s, budgets
just below the peak reached): a greedy plan aimed out of reach can spend the lane below the peak
(step 13 of docs/offload.md, ``_lower_targets``).

What the copy lane cannot hide stays on the device and is reported (``OffloadReport.unhidden``).
With a shared host link a denser plan is also tried and checked by simulation (see
``_shared_link_plans``). The reference planner used fixed alternating D2H/H2D windows, a lifespan
filter of three windows and failed when its windows ran out; this pass uses any free engine time,
and on a shared host link tries that alternating pattern as one more candidate (``passes.slots``).
"""
from __future__ import annotations

import logging
import math
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import chain
from typing import Any

import numpy as np

from pipeoffload import semantics as sem
from pipeoffload._perf import Memo
from pipeoffload.costs import CostModel
from pipeoffload.ir import Action, ActionKind, Schedule
from pipeoffload.passes.copy_plan import EPS, Activation, RankTimeline, rank_timelines
from pipeoffload.passes.offload_plan import RankState, plan_group
from pipeoffload.passes.slots import SlotPattern, plan_pair, slot_length
from pipeoffload.passes.throttle import eager_warmup, latest_starts, repair, throttled_timeline, with_waits
from pipeoffload.policies import OffloadPolicy, RecomputePolicy
from pipeoffload.simulator import Figures, Timeline, figures_of, simulate, simulate_figures

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
    offloaded_after_i: int = 0  # second windows (I -> W) offloaded
    unhidden_after_i: tuple[Key, ...] = ()  # second windows wanted off the device, not hideable
    units: tuple[float, float] = (0.0, 0.0)  # activation units moved to host, per window
    until_i: int = 0  # first windows kept on the device until I, their I -> W window offloaded instead


@dataclass(frozen=True)
class OffloadReport:
    """What the offload pass did; planned numbers (the simulator gives the final ones).

    The policies are typed values, like ``ScheduleChoice``'s; text forms are accepted and parsed once
    here, and ``str()`` gives them back for outputs.
    """

    policy: OffloadPolicy = OffloadPolicy()
    per_rank: tuple[RankOffloadReport, ...] = ()
    budget: float | None = None  # per-rank target in activation units, for budget policies
    recompute: RecomputePolicy = RecomputePolicy()
    recomputed: tuple[Key, ...] = ()
    notes: tuple[str, ...] = field(default=())
    warnings: tuple[str, ...] = field(default=())  # what the passes could not do (e.g. a budget not met)
    throttle: int = 0  # warm-up forwards wait for their rank's throttle-th latest offload (WAIT); 0: no waits
    copy_time_factor: float = 1.0  # below 1: planned as if copies took this x their time (a stall budget's plan)

    def __post_init__(self) -> None:
        object.__setattr__(self, "policy", OffloadPolicy.parse(self.policy))
        object.__setattr__(self, "recompute", RecomputePolicy.parse(self.recompute))

    @property
    def offloaded(self) -> int:
        return sum(r.offloaded for r in self.per_rank)

    @property
    def unhidden(self) -> tuple[Key, ...]:
        return tuple(k for r in self.per_rank for k in r.unhidden)

    @property
    def offloaded_after_i(self) -> int:
        return sum(r.offloaded_after_i for r in self.per_rank)

    @property
    def unhidden_after_i(self) -> tuple[Key, ...]:
        return tuple(k for r in self.per_rank for k in r.unhidden_after_i)

    @property
    def kept_until_i(self) -> int:
        return sum(r.until_i for r in self.per_rank)

    @property
    def units_by_window(self) -> tuple[float, float]:
        """Activation units copied to host: (F -> backward window, I -> W window)."""
        return (sum(r.units[0] for r in self.per_rank), sum(r.units[1] for r in self.per_rank))

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
        if self.policy.kind != "none":
            at = "" if self.copy_time_factor == 1 else f" at the planned copy times ({self.copy_time_factor:g}x)"
            short = sum(r.too_short for r in self.per_rank)
            kept = [f"{len(self.unhidden)} that the copy lane could not hide{at}"] if self.unhidden else []
            kept += [f"{short} whose window is too short to leave the device"] if short else []
            kept += [f"{self.kept_until_i} until their I (offloaded from I to W instead)"] if self.kept_until_i else []
            parts.append(f"offload {self.policy}: {self.offloaded} activations offloaded"
                         + (f"; kept on the device: {', '.join(kept)}" if kept else ""))
            if self.offloaded_after_i or self.unhidden_after_i:
                first, second = self.units_by_window
                kept_w = f", {len(self.unhidden_after_i)} kept on the device there" if self.unhidden_after_i else ""
                parts.append(f"{self.offloaded_after_i} offloaded between I and W{kept_w}; units to host per window: "
                             f"F->I {first:g}, I->W {second:g}")
        if self.throttle:
            parts.append(f"warm-up forwards wait for copies (WAIT: each for its rank's offload {self.throttle} back)")
        if self.recompute != RecomputePolicy():
            parts.append(f"recompute {self.recompute}: {len(self.recomputed)} activations")
        if self.per_rank:  # without an offload plan there is no planned peak (never "0 -> 0")
            parts.append(f"planned peak {self.peak_before:g} -> {self.peak_after:g} activation units")
        if self.budget is not None:
            parts.append(f"budget {self.budget:g} {'met' if self.budget_met else 'NOT met'}")
        return "; ".join([*parts, *self.notes])


# ---- entry point -----------------------------------------------------------------------------------
def plan_offload(schedule: Schedule, costs: CostModel, policy: OffloadPolicy | str,
                 *, exclude: frozenset[Key] | set[Key] = frozenset(),
                 timeline: Timeline | None = None, memo: Memo | None = None,
                 faster_copies: bool = True) -> tuple[Schedule, OffloadReport]:
    """Insert OFFLOAD/RELOAD into a compute-only ``schedule`` (copies already in it are replaced).

    ``exclude`` lists (stage, microbatch) activations that must stay put (e.g. recomputed ones);
    ``timeline`` is the simulation of ``schedule`` under ``costs`` if the caller already has it;
    ``memo`` keeps the simulation and rank timelines for a caller that plans one schedule several times.
    ``faster_copies=False`` leaves out the plans made for faster copies (``best_with_faster_copies``):
    ``recompute auto`` reads what to recompute from a report whose counts and curves are the real
    copy times'.
    """
    policy = OffloadPolicy.parse(policy)
    base = schedule.compute_only()
    if policy.kind == "none" and timeline is None:
        return base, OffloadReport(policy)
    memo = memo if memo is not None else Memo()
    simulated = timeline if timeline is not None else memo(simulate, base, costs)
    timelines = memo.get((rank_timelines, base, costs), lambda: rank_timelines(base, simulated, costs))
    budget = policy.budget_units(base.stages_per_rank) if policy.kind == "budget" else None
    plan = _Planning(base, timelines, policy, set(exclude), budget, _groups(base.num_ranks, costs.shared_host_link),
                     memo=memo)
    # keyed without the stall budget, which only the step after reads: variants under one share it
    states, peaks = memo.get((_placed_lowest, base, costs, replace(policy, max_stall=0.0), frozenset(exclude),
                              faster_copies), lambda: _placed_lowest(plan, costs, memo, faster_copies, simulated.makespan))
    stalled: _Stalled | None = None
    notes: tuple[str, ...] = ()
    if policy.max_stall > 0:
        stalled, notes = _under_stall_budget(plan, costs, states, peaks, budget, simulated.makespan)
        if stalled is not None:
            states, peaks = stalled.states, stalled.peaks
    orders = [_copy_order(states[r]) for r in range(base.num_ranks)]
    rows = [_emit(states[r], orders[r]) for r in range(base.num_ranks)]
    report = OffloadReport(
        policy,
        tuple(RankOffloadReport(r, sum(1 for p in s.placed if p.activation.window == 0), tuple(s.unhidden),
                                s.too_short, float(timelines[r].memory.max()) if len(timelines[r].memory) else 0.0,
                                peaks[r], tuple(s.memory.tolist()),
                                sum(1 for p in s.placed if p.activation.window == 1), tuple(s.unhidden_w),
                                _units(s), s.until_i)
              for r, s in sorted(states.items())),
        budget,
        notes=notes,
        throttle=max((s.timeline.throttle for s in states.values()), default=0),
        copy_time_factor=1.0 if stalled is None else stalled.factor,
    )
    return _coded_like(base, base.with_actions(rows), states, orders), report


def _placed(plan: _Planning, costs: CostModel, memo: Memo, faster_copies: bool
            ) -> tuple[dict[int, RankState], dict[int, float], Callable[[], bool]]:
    """Steps 2-12 of docs/offload.md for ``plan``'s policy: its plan (with the plans for slower copies,
    and on a shared link the pair's own candidates) and, on own links where the lane left something on
    the device, the better plans for faster copies. Also a callable saying whether that plan is at the
    floor (``_Planning.at_floor``), worked out once, when first asked."""
    policy, budget = plan.policy, plan.budget
    # kept in the memo apart from the plans for faster copies: ``recompute auto`` plans once without them;
    # keyed without what it does not read (the stall budget, the ranks' offsets), so variants share it
    placing = replace(policy, max_stall=0.0, rank_offsets=())
    states, peaks = memo.get((_plan_at_and_above, plan.base, costs, placing, frozenset(plan.exclude)),
                             lambda: _plan_at_and_above(plan, costs))
    known: list[bool] = []

    def floor() -> bool:
        if not known:
            known.append(plan.at_floor(costs, peaks))
        return known[0]

    if (faster_copies and policy.kind != "none" and costs.d2h_time + costs.h2d_time > 0
            and not costs.shared_host_link and _left_on_device(states, peaks, budget) and not floor()):
        states, peaks = plan.best_with_faster_copies(costs, states, peaks)
        known.clear()  # a lower plan: its own floor question
    return states, peaks, floor


def _placed_lowest(plan: _Planning, costs: CostModel, memo: Memo, faster_copies: bool, step: float
                   ) -> tuple[dict[int, RankState], dict[int, float]]:
    """``_placed``, then on own links the plans of other targets where they are lower (step 13)."""
    states, peaks, floor = _placed(plan, costs, memo, faster_copies)
    if faster_copies and _aimed_elsewhere(plan, costs, peaks) and not floor():
        states, peaks = _lower_targets(plan, costs, states, peaks, step)
    return states, peaks


def _aimed_elsewhere(plan: _Planning, costs: CostModel, peaks: dict[int, float]) -> bool:
    """Whether step 13 may find a lower plan: own links, copies that take time, and ``auto`` or a budget
    the plan does not meet (a met budget needs nothing lower)."""
    if costs.shared_host_link or costs.d2h_time + costs.h2d_time <= 0 or plan.policy.kind not in ("auto", "budget"):
        return False
    return plan.budget is None or max(peaks.values(), default=0.0) > plan.budget + EPS


def _lower_targets(plan: _Planning, costs: CostModel, states: dict[int, RankState], peaks: dict[int, float],
                   step: float) -> tuple[dict[int, RankState], dict[int, float]]:
    """Own links: the plans of other targets where one is lower (step 13 of docs/offload.md).

    A greedy plan aimed too low (a budget out of reach, or ``auto``'s everything worth moving) can spend
    the copy lane on points below the peak, and pruning then drops the copies that did not help: a
    budget just below the peak reached puts the lane where the peak is (1F1B, d = 4, m = 8, k = 1.2:
    ``auto`` and ``budget:2`` held 4 units, ``budget:3`` 3). So, at most ``_TARGETS`` more plans
    (``_other_target``, each on the ranks at the top only): for an unmet budget ``auto``'s, again
    while it lowers the worst ranks, then budgets one activation below the peak reached so far, while
    each reaches its target. Each rank keeps the lowest (of its peak and the budget) among them; the
    result is kept only where its simulation shows no stall, no longer step than ``step`` (the
    schedule's without copies) and a lower worst-rank memory (activations plus ``rank_offsets``).
    One activation: the worst rank's largest (``_one_activation``)."""
    ranks = range(plan.base.num_ranks)
    offsets = plan.policy.rank_offsets or (0.0,) * plan.base.num_ranks
    line = plan.budget or 0.0  # at or below the budget every rank counts alike

    def worst(p: dict[int, float]) -> float:
        return max(offsets[r] + max(p[r], line) for r in ranks)

    best, chosen = dict(peaks), dict(states)
    reached = max(peaks.values(), default=0.0)
    one = _one_activation(plan, peaks)
    auto_next = plan.budget is not None  # target None: auto's plan
    for _ in range(_TARGETS):
        target = None if auto_next else reached - one
        if target is not None and (target <= line + EPS or target < one - EPS):
            break
        candidate, candidate_peaks = _other_target(plan, costs, target, reached - one, chosen, best)
        for r in ranks:
            if max(candidate_peaks[r], line) < max(best[r], line) - EPS:
                best[r], chosen[r] = candidate_peaks[r], candidate[r]
        top = max(candidate_peaks.values(), default=0.0)
        log.debug("target %s: peak %g (reached %g)", "auto" if target is None else f"{target:g}", top, reached)
        if target is None:
            auto_next = max(best.values()) < reached - EPS  # it lowered the worst ranks: the next ones may follow
        elif top > target + EPS:
            break  # aimed too low again: a still lower target would spend the lane further from the peak
        reached = max(best.values())
    if worst(best) >= worst(peaks) - EPS:
        return states, peaks
    t = plan.simulated(costs, chosen)
    final = {r: t.peak_activation_units[r] for r in ranks}
    if sum(t.stall) > EPS or t.makespan > step + EPS or worst(final) >= worst(peaks) - EPS:
        return states, peaks
    return chosen, final


def _one_activation(plan: _Planning, peaks: dict[int, float]) -> float:
    """The largest activation of the ranks at the worst peak, in units: how far below the peak step 13
    aims (1 with uniform stages; less with partial recomputation)."""
    top = max(peaks.values(), default=0.0)
    sizes = [x.size for r, p in peaks.items() if p >= top - EPS for x in plan.timelines[r].activations.values()]
    return max(sizes, default=1.0)


def _other_target(plan: _Planning, costs: CostModel, target: float | None, lower: float,
                  states: dict[int, RankState], peaks: dict[int, float]) -> tuple[dict[int, RankState], dict[int, float]]:
    """Step 13's plan of a budget of ``target`` units (None: ``auto``'s, for an unmet budget) on the
    ranks above it and above ``lower`` (one activation below the peak reached: the others keep
    ``states``, they cannot lower the worst rank): the plan for the real copy times and, where
    those ranks are still above the target, the better plans for faster copies
    (``best_with_faster_copies``), up to the first that reaches it. Not the plans for slower copies:
    in the planner (``benchmarks/plan_identity.py``'s budget-tight) they nearly tripled step 13's cost
    and lowered nothing more."""
    ranks = range(plan.base.num_ranks)
    line = plan.budget if target is None else target
    assert line is not None
    above = [r for r in ranks if peaks[r] > max(line, lower) + EPS]
    policy = (replace(plan.policy, kind="auto", budget=0.0, rank_units=False, max_stall=0.0) if target is None
              else replace(plan.policy, kind="budget", budget=target, rank_units=False, max_stall=0.0))
    other = replace(plan, policy=policy, budget=target, groups=[[r] for r in above],
                    fixed={r: (states[r], peaks[r]) for r in ranks if r not in above})
    candidate, candidate_peaks = other.states(costs)
    if any(candidate_peaks[r] > line + EPS for r in above) and not other.at_floor(costs, candidate_peaks):
        candidate, candidate_peaks = other.best_with_faster_copies(costs, candidate, candidate_peaks, enough=line)
    return candidate, candidate_peaks


_TARGETS = 4  # the most plans of other targets step 13 tries


@dataclass
class _Planning:
    """What the plans of one compute-only schedule share; ``states`` plans it for one cost model."""

    base: Schedule
    timelines: list[RankTimeline]  # of the simulation of ``base``, for the real copy times
    policy: OffloadPolicy
    exclude: set[Key]
    budget: float | None
    groups: list[list[int]]
    throttle: int = 0  # warm-up forwards wait for the throttle-th latest offload (``passes.throttle``)
    # ranks in no group, kept as planned (state, exact peak): step 13 plans only the ranks above its target
    fixed: dict[int, tuple[RankState, float]] = field(default_factory=dict)
    # the search's memo, which keeps the group plans (``_kept``) where ``timelines`` are its own
    memo: Memo | None = field(default=None, repr=False, compare=False)

    def states(self, costs: CostModel, slower: float = 1.0) -> tuple[dict[int, RankState], dict[int, float]]:
        """Each rank's planned copies and peak when the copies take ``slower`` x ``costs``' times
        (the ranks of ``fixed`` as they are)."""
        if self._keeps_plans(costs):
            return self._kept_states(costs, slower)
        timelines = self.timelines
        if self.throttle:  # copies, not the shared (memoised) timelines: _emit reads the throttle back
            timelines = [tl.with_throttle(self.throttle) for tl in timelines]
        if slower != 1.0:
            timelines = [tl if tl.rank in self.fixed else tl.with_copy_times(slower) for tl in timelines]
            costs = _copies_scaled(costs, slower)
        chosen = _candidates([tl for tl in timelines if tl.rank not in self.fixed], self.policy, self.exclude)

        def plan_all(relaxed: bool) -> tuple[dict[int, RankState], dict[int, float]]:
            """Every group's plan: each rank's state and planned (exact) peak."""
            states: dict[int, RankState] = {}
            peaks: dict[int, float] = {}
            for members in self.groups:
                tls = [timelines[r] for r in members]
                plan = plan_group(tls, costs, self.policy, {r: chosen[r] for r in members}, self.budget, relaxed)
                states.update(plan.states)
                peaks.update(plan.peaks())  # computed once per plan: one that was scored has them already
            return states, peaks

        states, peaks = plan_all(relaxed=False)
        if costs.shared_host_link and self.policy.kind != "none":
            states, peaks = _shared_link_plans(self.base, costs, states, peaks, plan_all(relaxed=True)[0], self.groups)
        for r, (state, peak) in self.fixed.items():
            states[r], peaks[r] = state, peak
        return states, peaks

    def _keeps_plans(self, costs: CostModel) -> bool:
        """Whether the memo may keep this planning's group plans: own links, no waits, and ``timelines``
        the memo's own rank timelines of ``base`` under ``costs`` (what a group plan's key stands for).
        On a shared link later steps change the states a plan returns, so none is kept there."""
        memo = self.memo
        if memo is None or self.throttle or costs.shared_host_link:
            return False
        return memo.peek(rank_timelines, self.base, costs) is self.timelines

    def _kept(self, what: Callable[..., object], costs: CostModel) -> dict[tuple[float, tuple[int, ...]], Any]:
        """The results of ``what`` (``plan_group``'s states and peaks, or ``_floor``'s peaks) made so far
        for ``base``'s rank timelines under ``costs``, with what ``_candidates`` and ``plan_group`` read
        of the policy, the excluded activations and the budget, by (copy-time factor, ranks): one entry
        per schedule and policy, in a memo of its own inside the search's that keeps the ``_KEPT``
        most recent (an entry per group plan in the search's memo would fall out of its most recent
        ones before it is asked for again)."""
        return self._own().get((what, self.base, costs, self.policy.kind, self.policy.count,
                                frozenset(self.exclude), self.budget), dict)

    def _own(self) -> Memo:
        assert self.memo is not None
        return self.memo.get((_Planning._own,), lambda: Memo(keep=_KEPT))

    def _scaled(self, costs: CostModel, factor: float, rank: int) -> RankTimeline:
        """``rank``'s timeline with copies ``factor`` x as long, made once per schedule (every policy
        planned at that factor reads the same; nothing changes a timeline or its activations)."""
        if factor == 1.0:
            return self.timelines[rank]
        scaled = self._own().get((RankTimeline.with_copy_times, self.base, costs), dict)
        key = (factor, rank)
        if key not in scaled:
            scaled[key] = self.timelines[rank].with_copy_times(factor)
        return scaled[key]  # type: ignore[no-any-return]

    def _kept_states(self, costs: CostModel, slower: float) -> tuple[dict[int, RankState], dict[int, float]]:
        """``states`` on own links, each group's plan kept in the memo: a search plans the same group
        at the same copy times for several policies and steps (a budget's plan is step 13's plan of
        that target; the ladder of faster copies of a policy planned with and without them). The
        states are shared between those results, and nothing changes them on own links."""
        assert self.memo is not None
        planned = _copies_scaled(costs, slower) if slower != 1.0 else costs
        states: dict[int, RankState] = {}
        peaks: dict[int, float] = {}
        kept = self._kept(plan_group, costs)
        for members in self.groups:
            key = (slower, tuple(members))
            if key not in kept:
                tls = [self._scaled(costs, slower, r) for r in members]
                group = plan_group(tls, planned, self.policy, _candidates(tls, self.policy, self.exclude),
                                   self.budget, False)
                kept[key] = (group.states, group.peaks())
            group_states, group_peaks = kept[key]
            states.update(group_states)
            peaks.update(group_peaks)
        for r, (state, peak) in self.fixed.items():
            states[r], peaks[r] = state, peak
        return states, peaks

    def best_with_slower_copies(self, costs: CostModel, states: dict[int, RankState], peaks: dict[int, float]
                                ) -> tuple[dict[int, RankState], dict[int, float]]:
        """Faster copies must never give a higher peak. Where the copy lane is overloaded the plan is
        a greedy choice that can land worse than the one made for slower copies, so the plans made
        as if copies took ``_SLOWER`` times longer are simulated with the real times too, and each
        group of ranks keeps the plan with the lowest simulated peak (then fewest copies) among those
        that never stall; at an equal peak the plan for the real times stays. The compute timeline does
        not change without stalls, so groups combine."""
        runs: dict[tuple, Figures] = {}  # what fixes the emitted lists -> their simulation

        def simulated(candidate: dict[int, RankState]) -> Figures:
            # plans for different copy times can emit the same lists: each distinct schedule is simulated once
            key = tuple(_emitted_key(candidate[r]) for r in range(self.base.num_ranks))
            if key not in runs:
                runs[key] = self.simulated(costs, candidate)
            return runs[key]

        def score(t: Figures, candidate: dict[int, RankState], members: list[int]) -> tuple[bool, float, int]:
            return (any(t.stall[r] > 0 for r in members),
                    max(t.peak_activation_units[r] for r in members),
                    sum(len(candidate[r].placed) for r in members))

        own = simulated(states)
        best = {tuple(m): (score(own, states, m), states) for m in self.groups}
        for factor in _SLOWER:
            candidate = self.states(costs, factor)[0]
            t = simulated(candidate)
            for members in self.groups:
                key = score(t, candidate, members)
                if key[:2] < best[tuple(members)][0][:2]:  # only a strictly lower peak (or no stall) switches
                    best[tuple(members)] = (key, candidate)
        mixed = {r: best[tuple(m)][1][r] for m in self.groups for r in m}
        final = simulated(mixed)
        if sum(final.stall) > 0 or max(final.peak_activation_units) > max(own.peak_activation_units):
            return states, peaks
        return mixed, {r: final.peak_activation_units[r] for r in mixed}

    def best_with_faster_copies(self, costs: CostModel, states: dict[int, RankState], peaks: dict[int, float],
                                enough: float = -math.inf) -> tuple[dict[int, RankState], dict[int, float]]:
        """Own links: a plan made as if copies took less time than they do (at the ladder points below
        k, ``_ladder_factors``) can leave less on the device and still never stall at the real
        times, where the windows it fills have slack (1F1B, d = 8, m = 32, k = 1: 6 units, and 4 with
        plans for faster copies). Such plans run the compute of the schedule without copies, exactly
        as ``states`` does, so ranks combine: each group of ranks keeps the lowest peak among them
        (only a strictly lower one replaces the plan it has).

        The points go from the largest down and the search stops at the first plan that stalls (a
        heuristic: a plan for still faster copies usually places still more copies the real lane
        cannot finish, though not always). ``peaks`` are the exact peaks of ``states`` (own links:
        planned = simulated). The caller skips it at the floor (``at_floor``). ``enough``: a peak that
        ends the search once every group has reached it (step 13's plans of a target)."""
        ranks = range(self.base.num_ranks)
        best = {tuple(m): (max(peaks[r] for r in m), states) for m in self.groups}
        for factor in _ladder_factors(costs):
            candidate = self.states(costs, factor)[0]
            t = self.simulated(costs, candidate)
            if sum(t.stall) > EPS:
                break
            for members in self.groups:
                peak = max(t.peak_activation_units[r] for r in members)
                if peak < best[tuple(members)][0] - EPS:
                    best[tuple(members)] = (peak, candidate)
            if all(best[tuple(m)][0] <= enough + EPS for m in self.groups):
                break
        if all(best[tuple(m)][1] is states for m in self.groups):
            return states, peaks
        mixed = dict(states)  # the ranks of ``fixed`` as they are
        mixed.update({r: best[tuple(m)][1][r] for m in self.groups for r in m})
        final = self.simulated(costs, mixed)
        if sum(final.stall) > EPS or any(final.peak_activation_units[r] > peaks[r] + EPS for r in ranks):
            return states, peaks
        return mixed, {r: final.peak_activation_units[r] for r in ranks}

    def simulated(self, costs: CostModel, states: dict[int, RankState]) -> Figures:
        """The figures of ``base`` with ``states``' copies emitted, simulated under ``costs``
        (``planned_figures``: once per search for the same lists)."""
        schedule = self.base.with_actions([_emit(states[r]) for r in range(self.base.num_ranks)])
        return planned_figures(schedule, costs, self.memo)

    def at_floor(self, costs: CostModel, peaks: dict[int, float]) -> bool:
        """Whether the worst rank's memory (activations plus ``rank_offsets``) is already that of some
        rank's plan for nearly instant copies. The floors are planned one group at a time, the worst
        ranks first, and only while a rank's current memory could still reach the worst (a floor is
        not above its plan's peak), so a plan at the floor costs one group's plan, not a whole one."""
        offsets = self.policy.rank_offsets or (0.0,) * self.base.num_ranks
        total = {r: offsets[r] + p for r, p in peaks.items()}
        worst = max(total.values(), default=0.0)
        instant = _copies_scaled(costs, _FLOOR_FACTOR)
        for members in sorted(self.groups, key=lambda m: -max(total[r] for r in m)):
            if max(total[r] for r in members) < worst - EPS:
                return False
            floor = self._floor(costs, instant, members)
            if max(offsets[r] + floor[r] for r in members) >= worst - EPS:
                return True
        return False

    def _floor(self, costs: CostModel, instant: CostModel, members: list[int]) -> dict[int, float]:
        """The peaks of ``members``' plan for nearly instant copies (kept in the memo where it may keep them)."""
        if not self._keeps_plans(costs):
            return self._floor_plan(instant, [self.timelines[r].with_copy_times(_FLOOR_FACTOR) for r in members])
        kept = self._kept(_Planning._floor, costs)
        key = (_FLOOR_FACTOR, tuple(members))
        if key not in kept:
            kept[key] = self._floor_plan(instant, [self._scaled(costs, _FLOOR_FACTOR, r) for r in members])
        return kept[key]  # type: ignore[no-any-return]

    def _floor_plan(self, instant: CostModel, tls: list[RankTimeline]) -> dict[int, float]:
        chosen = _candidates(tls, self.policy, self.exclude)
        return plan_group(tls, instant, self.policy, chosen, self.budget, False).peaks()


# schedules x policies whose group plans (and scaled timelines) a search keeps: in the headline, 16 make
# 4,561 group plans where keeping all would make 4,534 (4,992 keeping none), for 315 MB at its peak
# against 400 (243 keeping none); the plans and timelines of a whole schedule are large
_KEPT = 16


def planned_figures(schedule: Schedule, costs: CostModel, memo: Memo | None = None) -> Figures:
    """``simulate_figures(schedule, costs)`` of a planned schedule, simulated once per search: the plans
    a search weighs emit the same lists again (a candidate for faster copies that is the mixed plan
    checked after it, a plan for slower copies that another policy's ladder or step 13 makes again,
    a candidate that places no copy and is its compute-only schedule: 369 of the headline's 1,313
    simulations). The figures of a timeline ``memo`` keeps are read from it (``figures_of``, equal to
    ``simulate_figures``); others are kept in a memo of their own inside it, the ``_FIGURES`` most
    recent (a key holds its schedule's lists; repeats come within a few dozen simulations)."""
    if memo is None:
        return simulate_figures(schedule, costs)
    known = memo.peek(simulate, schedule, costs)
    if known is not None:
        return figures_of(known)
    own = memo.get((planned_figures,), lambda: Memo(keep=_FIGURES))
    return own(simulate_figures, schedule, costs)


_FIGURES = 64


def _ladder_factors(costs: CostModel) -> list[float]:
    """Copy-time factors (over k) of the points of one fixed ladder of k, 2 ** (j / _LADDER_STEPS) for
    every integer j, from just below k down to k / 2, largest first. Fixed points rather than fixed
    fractions of k: a smaller k then tries the plans a larger one tries, except those of the points
    between the two, so a plan for faster copies seldom makes the peak non-monotone in k (fractions
    of k did: 1F1B, d = 6, m = 24, offload auto, 19 inversions on a 0.05 grid of k, none now)."""
    k = costs.offload_ratio(0)
    if not 0.0 < k < math.inf:
        return []
    top = math.ceil(_LADDER_STEPS * math.log2(k) - 1e-9) - 1  # the highest point below k
    return [2 ** (j / _LADDER_STEPS) / k for j in range(top, top - _LADDER_STEPS, -1)]


_LADDER_STEPS = 8  # points per doubling of k on that ladder


def _copies_scaled(costs: CostModel, factor: float) -> CostModel:
    """``costs`` with both copy directions ``factor`` times as long (a plan made for other copy times)."""
    return replace(costs, d2h_time=costs.d2h_time * factor, h2d_time=costs.h2d_time * factor)


def _plan_at_and_above(plan: _Planning, costs: CostModel) -> tuple[dict[int, RankState], dict[int, float]]:
    """The plan for the real copy times and, where the lane is overloaded (always on a shared link),
    the better plans made for ``_SLOWER`` copy times, run at the real ones; on a shared link then the
    pair's own candidates (steps 8-12 of docs/offload.md): its plan may not be the one the simulator
    runs (``_shared_link_plans``), so they are always tried there."""
    states, peaks = plan.states(costs)
    if plan.policy.kind == "none" or costs.d2h_time + costs.h2d_time <= 0:
        return states, peaks
    if costs.shared_host_link:
        states, peaks = plan.best_with_slower_copies(costs, states, peaks)
        runs = _Runs(plan.base, frozenset(plan.exclude))  # what steps 9-12 would otherwise compute twice
        states, peaks = _throttled_plans(plan, costs, states, peaks, runs)
        states, peaks = _next_point_plans(plan, costs, states, peaks, runs)
        states, peaks = _slot_plans(plan, costs, states, peaks, runs)
        return _repaired_plans(plan, costs, states, peaks, runs)
    if _overloaded(states):
        states, peaks = plan.best_with_slower_copies(costs, states, peaks)
    return states, peaks


_SLOWER = (1.1, 1.15, 1.25, 1.35, 1.5, 1.75, 2.0)  # copy-time factors of the plans for slower copies


@dataclass(frozen=True)
class _Stalled:
    """A plan made for faster copies than the real ones, kept under a stall budget."""

    states: dict[int, RankState]
    peaks: dict[int, float]
    factor: float  # the copy-time factor it was planned for (< 1)
    makespan: float  # its simulated step at the real copy times

    def note(self, step: float, max_stall: float) -> str:
        longer = 100 * (self.makespan / step - 1) if step > 0 else 0.0
        return (f"copies planned as if they took {self.factor:g}x their time: the step is {longer:.2f} % longer "
                f"than without copies (stall budget {max_stall:g} %)")


def _left_on_device(states: dict[int, RankState], peaks: dict[int, float], budget: float | None) -> bool:
    """Whether a plan made for faster copies could lower the peak: the lane left something the policy
    wanted off the device, hideable or not in its window (``too_short``), and a budget, if any, is
    not met yet."""
    if budget is not None and max(peaks.values(), default=0.0) <= budget + EPS:
        return False
    return any(s.unhidden or s.unhidden_w or s.too_short for s in states.values())


def _under_stall_budget(plan: _Planning, costs: CostModel, states: dict[int, RankState], peaks: dict[int, float],
                        budget: float | None, step: float) -> tuple[_Stalled | None, tuple[str, ...]]:
    """The stall budget's plan (None: keep ``states``) and the report's note saying what it did."""
    max_stall = plan.policy.max_stall
    if costs.d2h_time + costs.h2d_time <= 0:
        return None, (f"stall budget {max_stall:g} %: not used, copies take no time",)
    if not _left_on_device(states, peaks, budget):
        return None, (f"stall budget {max_stall:g} %: not needed, the plan that never stalls leaves nothing "
                      "the policy wanted on the device",)
    stalled = _stalling_plan(plan, costs, states, step)
    if stalled is None:
        return None, (f"stall budget {max_stall:g} %: no plan made for faster copies "
                      f"({_FASTER[0]:g}-{_FASTER[-1]:g}x their time) lowers the peak within it",)
    return stalled, (stalled.note(step, max_stall),)


def _stalling_plan(plan: _Planning, costs: CostModel, states: dict[int, RankState], step: float) -> _Stalled | None:
    """The plan with the lowest peak, among those made as if copies took ``_FASTER`` x their time, that
    run at the real times within the policy's stall budget: a step at most ``max_stall`` % longer than
    ``step`` (the schedule's without copies). The peak is the worst rank's activations plus its
    ``rank_offsets`` (the planner's memory; without offsets the activation peak). Ties go to the
    shorter step; under a budget every peak at or below it counts alike, so the shortest step that
    meets it wins. None when none beats ``states`` (the plan that never stalls), simulated at the
    real times too.

    A slower copy than planned delays its reload, and the backward waits for it: the simulator
    charges that wait (``Timeline.stall``) and shifts everything after it, so each candidate is
    judged by its simulation, whole (the ranks' plans do not combine once compute moves)."""
    ranks = range(plan.base.num_ranks)
    limit = step * (1 + plan.policy.max_stall / 100) + EPS
    floor = plan.budget if plan.budget is not None else 0.0
    offsets = plan.policy.rank_offsets or (0.0,) * plan.base.num_ranks

    def key(t: Figures) -> tuple[float, float]:
        peak = max(offsets[r] + t.peak_activation_units[r] for r in ranks)  # the worst rank's total
        return (max(peak, floor + max(offsets)), t.makespan)

    own = plan.simulated(costs, states)
    best_key, best = key(own), None
    for factor in _FASTER:
        candidate = plan.states(costs, factor)[0]
        t = plan.simulated(costs, candidate)
        if t.makespan > limit:
            continue
        k = key(t)
        if k[0] < best_key[0] - EPS or (abs(k[0] - best_key[0]) <= EPS and k[1] < best_key[1] - EPS):
            best_key, best = k, _Stalled(candidate, {r: t.peak_activation_units[r] for r in ranks},
                                         factor, t.makespan)
    return best


_FASTER = (0.95, 0.9, 0.8, 0.7, 0.6, 0.5)  # copy-time factors of the plans a stall budget tries
_FLOOR_FACTOR = 1e-6  # the plan for copies this much faster: the floor of what faster copies give the pass


class _Runs:
    """What steps 9-12 of one shared-link lowering (``_throttled_plans`` to ``_repaired_plans``) ask for
    more than once with the same inputs, made once: a throttled compute timing and its rank timelines
    by (copy times, limit) (step 9 at k and at the next ladder point, then step 10's slot timings and
    step 12's for the same limits and copy times), and the simulation of a plan by its emitted lists (each
    step simulates the plan the step before returned; the step without copies twice). Every entry is
    what the computation returns for its key (``base`` and ``exclude`` are fixed), and it lives for one
    lowering only: nothing is kept across a search."""

    def __init__(self, base: Schedule, exclude: frozenset[Key]) -> None:
        self.base, self.exclude = base, exclude
        self._timings: dict[tuple[CostModel, int], tuple[Timeline, list[RankTimeline]]] = {}
        self._runs: dict[tuple[object, ...], Timeline] = {}

    def throttled(self, costs: CostModel, limit: int) -> tuple[Timeline, list[RankTimeline]]:
        """``throttled_timeline(base, costs, limit, exclude)`` and its ``rank_timelines`` under ``costs``
        (shared: a caller sets a throttle on copies, ``RankTimeline.with_throttle``, and changes nothing)."""
        key = (costs, limit)
        if key not in self._timings:
            timeline = throttled_timeline(self.base, costs, limit, self.exclude)
            self._timings[key] = timeline, rank_timelines(self.base, timeline, costs)
        return self._timings[key]

    def simulated(self, costs: CostModel, states: dict[int, RankState] | None = None) -> Timeline:
        """``simulate`` of ``base`` with ``states``' copies emitted (None: ``base`` itself), under ``costs``.
        A state's emitted list is fixed by its ``_emitted_key`` and its throttle (``_emit`` adds the waits);
        the compute actions are ``base``'s."""
        ranks = range(self.base.num_ranks)
        key = (costs, None if states is None else
               tuple((states[r].timeline.throttle, _emitted_key(states[r])) for r in ranks))
        if key not in self._runs:
            schedule = self.base if states is None else self.base.with_actions([_emit(states[r]) for r in ranks])
            self._runs[key] = simulate(schedule, costs)
        return self._runs[key]


def _throttled_plans(plan: _Planning, costs: CostModel, states: dict[int, RankState], peaks: dict[int, float],
                     runs: _Runs) -> tuple[dict[int, RankState], dict[int, float]]:
    """The plan with throttled warm-up forwards (``passes.throttle``) where it is better.

    For each limit L of ``_THROTTLES`` with L + 1 below the plan's peak, in turn (a throttled warm-up
    still holds the L activations its copies have not drained, or L - 1 and the one being computed,
    plus a reload before the first backward: L + 1 at best), the copies are planned against the
    compute timing the waits give (when that timing keeps the makespan) and the result is simulated;
    the first limit whose simulation has no stall, no longer makespan and a lower peak than the plan
    without waits wins.
    """
    ranks = range(plan.base.num_ranks)
    if _THROTTLES[0] + 1 >= max(peaks.values(), default=0.0) - EPS:  # nothing to gain (peaks: the plan's)
        return states, peaks
    plain = runs.simulated(costs, states)
    for limit in _THROTTLES:
        if limit + 1 >= plain.peak_activation_units - EPS:  # what a throttled warm-up holds, at best: see above
            break
        timeline, timelines = runs.throttled(costs, limit)
        if timeline.makespan > plain.makespan + EPS:
            continue
        throttled = replace(plan, timelines=timelines, throttle=limit)
        candidate, candidate_peaks = throttled.states(costs)
        # called on a shared link with copies that take time only: its slower-copy plans always apply
        candidate, candidate_peaks = throttled.best_with_slower_copies(costs, candidate, candidate_peaks)
        t = runs.simulated(costs, candidate)
        log.debug("throttle %d: peak %g, makespan %g, stall %g (without: %g, %g)", limit, t.peak_activation_units,
                  t.makespan, t.stall, plain.peak_activation_units, plain.makespan)
        if t.stall == 0 and t.makespan <= plain.makespan + EPS and t.peak_activation_units < plain.peak_activation_units - EPS:
            return candidate, {r: t.per_rank[r].peak_activation_units for r in ranks}
    return states, peaks


_THROTTLES = (1, 2, 3, 4)  # activations in flight per rank a throttled warm-up allows, tried in turn


def _next_point(costs: CostModel) -> float | None:
    """The next point above k (``costs.offload_ratio(0)``) of the ladder of k (multiples of
    ``_SLOT_LADDER``); None without a finite positive k."""
    k = costs.offload_ratio(0)
    if not 0.0 < k < math.inf:
        return None
    return (math.floor(k / _SLOT_LADDER + 1e-9) + 1) * _SLOT_LADDER


def _next_point_plans(plan: _Planning, costs: CostModel, states: dict[int, RankState], peaks: dict[int, float],
                      runs: _Runs) -> tuple[dict[int, RankState], dict[int, float]]:
    """The plan of the next larger k, replayed at k, where it is better than ``states`` (shared link).

    The plan steps 1-9 make at the next ladder point above k (copies ``factor`` x slower: the plan
    and its slower-copy and throttled variants, each chosen by simulation at that point) is
    simulated with the real copy times; it replaces ``states`` if it has no stall, no longer
    makespan and a lower peak. With ``_slot_factors`` this keeps, at k, what the next point finds
    (1F1B, d = 8, m = 24: 7 units at k = 1.25 and 6 at 1.3 by a throttled plan before). Not tried
    where the plan holds the floor of 2 units or meets a budget.
    """
    after = _next_point(costs)
    top = max(peaks.values(), default=0.0)
    if after is None or top <= _SLOT_FLOOR + EPS or (plan.budget is not None and top <= plan.budget + EPS):
        return states, peaks
    factor = after / costs.offload_ratio(0)
    slower = _copies_scaled(costs, factor)
    scaled = replace(plan, timelines=[tl.with_copy_times(factor) for tl in plan.timelines])
    candidate, candidate_peaks = scaled.states(slower)
    candidate, candidate_peaks = scaled.best_with_slower_copies(slower, candidate, candidate_peaks)
    candidate, _ = _throttled_plans(scaled, slower, candidate, candidate_peaks, runs)
    ranks = range(plan.base.num_ranks)
    current = runs.simulated(costs, states)
    t = runs.simulated(costs, candidate)
    log.debug("next point %g (x%g): peak %g, makespan %g, stall %g (now: %g, %g)", after, factor,
              t.peak_activation_units, t.makespan, t.stall, current.peak_activation_units, current.makespan)
    if t.stall > 0 or t.makespan > current.makespan + EPS or t.peak_activation_units >= current.peak_activation_units - EPS:
        return states, peaks
    return candidate, {r: t.per_rank[r].peak_activation_units for r in ranks}


def _slot_plans(plan: _Planning, costs: CostModel, states: dict[int, RankState], peaks: dict[int, float],
                runs: _Runs) -> tuple[dict[int, RankState], dict[int, float]]:
    """The alternating-slot plan (``passes.slots``) where it is better than ``states``.

    Each pattern of ``_SLOT_KEEP`` x ``_SLOT_MARGIN`` is planned, for the real copy times and for the
    slower ones of ``_SLOT_SLOWER``, on the compute timing without waits and on each throttled timing
    (``_SLOT_THROTTLES``) that could give a lower peak, and simulated with the real times (each
    distinct emitted schedule once); the variant with the lowest simulated peak, no stall and no
    longer makespan than the step without copies replaces ``states`` if its peak is lower.
    """
    ranks = range(plan.base.num_ranks)
    if max(peaks.values(), default=0.0) <= _SLOT_FLOOR + EPS or (plan.budget is not None and
                                                                 max(peaks.values()) <= plan.budget + EPS):
        return states, peaks  # a computed activation and a reload: nothing lower to reach; or the budget is met
    current = runs.simulated(costs, states)
    makespan = runs.simulated(costs).makespan  # the step without copies: a plan must not lengthen it
    best: tuple[float, int, dict[int, RankState], Figures] | None = None
    seen: set[tuple] = set()
    for factor in _slot_factors(costs):  # as if copies took factor x longer (a faster link must not do worse)
        slower = _copies_scaled(costs, factor)
        for limit in (0, *_SLOT_THROTTLES):
            if limit + 1 >= min(current.peak_activation_units, best[0] if best else math.inf) - EPS:
                break  # a throttled warm-up holds L + 1 at best (see ``_throttled_plans``): no lower peak
            if limit:  # even a timing that lengthens the step may not once the slots' copies are in: simulated
                timelines = [tl.with_throttle(limit) for tl in runs.throttled(slower, limit)[1]]
            else:  # the timing without copies does not depend on their times
                timelines = [tl.with_copy_times(factor) for tl in plan.timelines] if factor != 1.0 else plan.timelines
            chosen = _candidates(timelines, plan.policy, plan.exclude)
            for pattern in _slot_patterns(slot_length(chosen)):
                candidate: dict[int, RankState] = {}
                for members in plan.groups:
                    candidate.update(plan_pair([timelines[r] for r in members], {r: chosen[r] for r in members},
                                               pattern))
                orders = [_copy_order(candidate[r]) for r in ranks]  # each list's key, then the list itself
                key = (limit, *(_order_key(order) for order in orders))
                if key in seen:
                    continue
                seen.add(key)
                # figures, not a timeline: the peaks, stalls and makespan are the same numbers (``figures_of``)
                t = simulate_figures(plan.base.with_actions([_emit(candidate[r], orders[r]) for r in ranks]), costs)
                peak = max(t.peak_activation_units)  # as ``Timeline.peak_activation_units`` and ``.stall`` read them
                log.debug("slots x%g L=%d %s: peak %g, makespan %g, stall %g", factor, limit, pattern,
                          peak, t.makespan, sum(t.stall))
                if sum(t.stall) == 0 and t.makespan <= makespan + EPS and (best is None or peak < best[0] - EPS):
                    best = (peak, limit, candidate, t)
    if best is None or best[0] >= current.peak_activation_units - EPS:
        return states, peaks
    _, _, candidate, figures = best
    for state in candidate.values():
        _report_unplaced(state, _candidates([state.timeline], plan.policy, plan.exclude)[state.timeline.rank])
    return candidate, {r: figures.peak_activation_units[r] for r in ranks}


def _slot_factors(costs: CostModel) -> list[float]:
    """The copy-time factors the slot plans are made for: ``_SLOT_SLOWER``, then the same factors at
    the next point above k of the ladder of k (multiples of ``_SLOT_LADDER``).

    So the slot plans at k include every slot plan the pass makes at that next point (the plan for
    the next larger k, which the simulation at the real copy times then checks): where that point
    found a lower peak, k keeps it (issue #17: d = 16, g = 16 held 18 units at k = 0.7 and 17 at 0.8,
    whose winner, made for 1.25 x 0.8, replays at 0.7 with 17 and no stall). Each group of ranks
    plans ``len(_SLOT_SLOWER)`` more slot variants; factors already in the list are not repeated.
    """
    factors = list(_SLOT_SLOWER)
    after = _next_point(costs)
    if after is None:
        return factors
    for factor in _SLOT_SLOWER:
        scaled = after * factor / costs.offload_ratio(0)
        if all(abs(scaled - f) > 1e-9 for f in factors):
            factors.append(scaled)
    return factors


_SLOT_FLOOR = 2.0  # the lowest peak a shared-link plan reaches: the activation computed and one reload
_SLOT_THROTTLES = (1, 2, 3, 4, 6, 8)  # warm-up limits the slot plans are tried with (g = d needs the larger)
_SLOT_SLOWER = (1.0, 1.1, 1.15, 1.25)  # copy-time factors the slot plans are made for (see ``best_with_slower_copies``)
_SLOT_LADDER = 0.1  # the step of the ladder of k whose next point's slot plans are also tried (the k grid of the benchmarks)
_SLOT_KEEP = (0, 3)  # lifespan filters (slot periods) of the slot patterns tried: none, the reference's
_SLOT_MARGIN = ((0.0, False), (1.0, False), (0.0, True))  # reload margins tried: (slots, + the backward's time)


def _repaired_plans(plan: _Planning, costs: CostModel, states: dict[int, RankState], peaks: dict[int, float],
                    runs: _Runs) -> tuple[dict[int, RankState], dict[int, float]]:
    """One unit below the plan's peak by a repaired throttled warm-up (``throttle.repair``), where it
    gets there (shared host link; step 12 of docs/offload.md).

    With the target P = peak - 1 and the limit L = P: the copies are planned against the compute
    timing of a warm-up throttled to L (as in ``_throttled_plans``, whatever that timing's makespan),
    each warm-up offload is issued right after its forward with the waits of L (so the warm-up holds
    at most L units), and the repair moves single copies and waits until no compute action starts
    after its latest start in the step without copies and no rank holds more than P. Tried with the
    real copy times, then, for a k off the ladder of k (``_off_ladder_factor``), with those of the
    ladder point above k, the result repaired again at the real times: so where that point's repair
    reaches P, k keeps it (d = 8, g = 8: 3 units at k = 0.4 but 4 at 0.39 with the first alone). Kept only where the simulation
    shows no stall, no longer makespan than the step without copies and the lower peak. Not tried at
    the floor of 2 units or where a budget is met.
    """
    ranks = range(plan.base.num_ranks)
    top = max(peaks.values(), default=0.0)
    if top <= _SLOT_FLOOR + EPS or (plan.budget is not None and top <= plan.budget + EPS):
        return states, peaks
    current = runs.simulated(costs, states)
    target = current.peak_activation_units - 1.0
    limit = math.floor(target + EPS)
    if target < _SLOT_FLOOR - EPS or limit < 1:
        return states, peaks
    bare = runs.simulated(costs)  # the step without copies: its makespan and latest starts
    latest = latest_starts(plan.base, costs, bare)
    for factor in (1.0, *_off_ladder_factor(costs)):
        slower = _copies_scaled(costs, factor)
        # (the throttled timing's own timelines at ``slower``: the plan's scaled ones would be replaced at once)
        throttled = replace(plan, timelines=runs.throttled(slower, limit)[1], throttle=limit)
        candidate, _ = throttled.states(slower)
        rows = repair(plan.base, [eager_warmup(_emit(candidate[r]), limit) for r in ranks], slower, target, latest)
        if rows is not None and factor != 1.0:  # the next point's plan, replayed (and mended) at k
            log.debug("repair to %g (x%g): found, mended at k", target, factor)
            rows = repair(plan.base, rows, costs, target, latest)
        if rows is None:
            log.debug("repair to %g (x%g): not found", target, factor)
            continue
        t = simulate(plan.base.with_actions(rows), costs)
        log.debug("repair to %g (x%g): peak %g, makespan %g, stall %g", target, factor, t.peak_activation_units,
                  t.makespan, t.stall)
        if t.stall == 0 and t.makespan <= bare.makespan + EPS and t.peak_activation_units < current.peak_activation_units - EPS:
            for r in ranks:
                candidate[r].rows = rows[r]
            return candidate, {r: t.per_rank[r].peak_activation_units for r in ranks}
    return states, peaks


def _off_ladder_factor(costs: CostModel) -> tuple[float, ...]:
    """(next ladder point / k,) for a k off the ladder of k (``_SLOT_LADDER``), () on it or without a
    finite positive k: step 12 repairs the next point's plan only off the ladder. On the ladder that
    point's own winner may be a repair of the point after it (group-interleaved d = 8, g = 8: 12 units
    at k = 1.5 from the plan of 1.6, which 1.4 would not see), so it would turn the cost into a
    chain up the ladder; off the ladder it makes k keep what the point above found."""
    after = _next_point(costs)
    k = costs.offload_ratio(0)
    if after is None or abs(k / _SLOT_LADDER - round(k / _SLOT_LADDER)) < 1e-9:
        return ()
    return (after / k,)


def _slot_patterns(slot: float) -> list[SlotPattern]:
    return [SlotPattern(slot, keep, margin * slot, back_margin) for keep in _SLOT_KEEP
            for margin, back_margin in _SLOT_MARGIN]


def _report_unplaced(state: RankState, candidates: list[Activation]) -> None:
    """What a slot plan left on the device, reported like the packing's: the windows worth moving that
    it did not place, and the first windows too short to be worth anything."""
    placed = {p.activation.ident for p in state.placed}
    missing = [x for x in candidates if x.ident not in placed and x.value > EPS]
    state.unhidden = [(x.stage, x.microbatch) for x in missing if x.window == 0]
    state.unhidden_w = [(x.stage, x.microbatch) for x in missing if x.window == 1]
    state.too_short = sum(1 for x in candidates if x.window == 0 and x.value <= EPS)


def _overloaded(states: dict[int, RankState]) -> bool:
    """The copy lane left at least one wanted window per rank on the device (a few stragglers, as
    group-interleaved's one in 480 at k = 0.5, do not make the greedy plan worth second-guessing)."""
    return sum(len(s.unhidden) + len(s.unhidden_w) for s in states.values()) >= len(states)


def _shared_link_plans(base: Schedule, costs: CostModel, strict: dict[int, RankState], strict_peaks: dict[int, float],
                       relaxed: dict[int, RankState], groups: list[list[int]]
                       ) -> tuple[dict[int, RankState], dict[int, float]]:
    """Per pair, the better of the exact plan and the denser relaxed plan, checked by simulation.

    A relaxed plan may start a copy when the partner's copy ends; the simulator's link serves copies
    in the order they reach it, and the copy can reach it before the partner's (it is issued at an
    earlier grid point), so a reload can come late. Offloads whose backward waited are
    dropped (and reported unhidden) until a simulation shows no stall; a pair keeps the relaxed plan
    only if it then has a lower simulated peak than its exact plan.
    """
    for _ in range(_REPAIR_ROUNDS):
        timeline = simulate(base.with_actions([_emit(relaxed[r]) for r in range(base.num_ranks)]), costs)
        late = {(a.stage, a.microbatch, 1 if a.kind is K.W else 0) for a in timeline.stalls}
        if not late:
            break
        for state in relaxed.values():
            gone = {p.activation.ident[:2] for p in state.placed if p.activation.ident in late and not p.activation.window}
            # a second window that copies nothing needs its first window's host copy: it goes too
            drop = [p for p in state.placed if p.activation.ident in late
                    or (p.activation.window and p.activation.d2h == 0.0 and p.activation.ident[:2] in gone)]
            for p in drop:
                state.placed.remove(p)
                state.memory[p.lo:p.hi] += p.activation.size
                (state.unhidden_w if p.activation.window else state.unhidden).append(
                    (p.activation.stage, p.activation.microbatch))
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


def _groups(num_ranks: int, shared_link: bool) -> list[list[int]]:
    if not shared_link:
        return [[r] for r in range(num_ranks)]
    return [list(range(p, min(p + 2, num_ranks))) for p in range(0, num_ranks, 2)]


def _candidates(timelines: list[RankTimeline], policy: OffloadPolicy, exclude: set[Key]) -> dict[int, list[Activation]]:
    """Per rank, the windows the policy lets the pass move: the first window of every activation not
    in ``exclude`` (recomputed ones), and the second window (I -> W) of every split backward."""
    out = {}
    for tl in timelines:
        acts = [x for key, x in tl.activations.items() if key not in exclude and policy.kind != "none"]
        if policy.kind != "none":
            acts += tl.w_activations.values()
        if policy.kind == "first":
            stages = set(longest_lived_stages(tl.activations.values(), policy.count))
            acts = [x for x in acts if x.stage in stages]
        out[tl.rank] = acts
    return out


def _units(state: RankState) -> tuple[float, float]:
    """Activation units the rank's plan copies to host, per window."""
    moved = [0.0, 0.0]
    for p in state.placed:
        moved[p.activation.window] += p.activation.size
    return moved[0], moved[1]


def longest_lived_stages(activations, count: int, skip: set[int] | frozenset[int] = frozenset()) -> list[int]:  # type: ignore[no-untyped-def]
    """The ``count`` local stages whose activations live longest on average (ties: lower stage)."""
    total: dict[int, list[float]] = {}
    for x in activations:
        total.setdefault(x.stage, []).append(x.lifespan)
    ranked = sorted((s for s in total if s not in skip), key=lambda s: (-sum(total[s]) / len(total[s]), s))
    return ranked[:count]


_WINDOW_KINDS = tuple((offload, reload) for offload, reload, _ in sem.WINDOWS)


def _copy_order(state: RankState) -> list[tuple[int, float, int, int, int, int]]:
    """The rank's planned copies as (list position, planned start, direction, stage, microbatch,
    window), in the order ``_emit`` inserts them: this order alone fixes the emitted list."""
    clocks = state.timeline.clocks  # ``RankTimeline.position``, written out: two per planned copy
    offloads, reloads = [], []
    for p in state.placed:
        x = p.activation
        d2h, h2d, limit = p.d2h_start, p.h2d_start, x.back_index
        at = bisect_right(clocks, h2d + EPS) - 1
        offloads.append((bisect_right(clocks, d2h + EPS) - 1, d2h, 0, x.stage, x.microbatch, x.window))
        reloads.append((at if at < limit else limit, h2d, 1, x.stage, x.microbatch, x.window))
    # each direction is mostly in order already (copies are placed by forward, reloads follow their
    # backwards): one list after the other is sorted as a few long runs, not interleaved pairs
    copies = offloads + reloads
    copies.sort()
    return copies


def _emitted_key(state: RankState) -> tuple[object, ...]:
    """What decides the rank's emitted list (equal keys, equal lists), cheaper to compare than the list."""
    if state.rows is not None:
        return tuple(state.rows)
    return _order_key(_copy_order(state))


def _order_key(order: list[tuple[int, float, int, int, int, int]]) -> tuple[object, ...]:
    """``_emitted_key`` of a state without its own list, from its ``_copy_order`` (the planned starts left out)."""
    return tuple((position, direction, stage, microbatch, window)
                 for position, _, direction, stage, microbatch, window in order)


def _emit(state: RankState, order: list[tuple[int, float, int, int, int, int]] | None = None) -> list[Action]:
    """The rank's compute list with each planned copy at the position that issues it on time
    (``order``: its ``_copy_order`` when the caller has it); a repaired plan's own list."""
    if state.rows is not None:
        return list(state.rows)
    actions = state.timeline.actions
    row: list[Action] = []
    done = 0
    new_action = tuple.__new__  # ``Action(...)`` in C (``ir.make_actions``), one per planned copy
    for position, _, direction, stage, microbatch, window in order if order is not None else _copy_order(state):
        if position > done:
            row.extend(actions[done:position])
            done = position
        row.append(new_action(Action, (_WINDOW_KINDS[window][direction], stage, microbatch)))
    row.extend(actions[done:])
    return with_waits(row, state.timeline.throttle) if state.timeline.throttle else row


_COPY_CODES = np.array([[sem.CODE[kind] for kind in pair] for pair in _WINDOW_KINDS])  # [window, direction]


def _coded_like(base: Schedule, planned: Schedule, states: dict[int, RankState],
                orders: list[list[tuple[int, float, int, int, int, int]]]) -> Schedule:
    """``planned`` (``base`` with its ranks' copies ``orders`` emitted) carrying its coded form, made
    from ``base``'s by inserting the copies' codes where ``_emit`` put them: ``add_comms`` then codes
    no schedule. ``planned`` as it is when ``base`` carries no form or a rank has waits (``with_waits``)."""
    form = base.coded
    if form is None or form.rows is not base.actions or any(s.timeline.throttle or s.rows is not None
                                                             for s in states.values()):
        return planned
    counts = [len(order) for order in orders]
    if sum(counts):  # the columns of every copy, rank after rank, each rank's in its emitted order
        position, _, direction, stage, microbatch, window = zip(*chain.from_iterable(orders))
        rank = np.repeat(np.arange(len(orders)), counts)
        # before the action at its position (an equal index keeps the given order: np.insert is stable)
        at = form.offsets[rank] + np.array(position, dtype=np.int64)
        kind = np.insert(form.kind, at, _COPY_CODES[np.array(window), np.array(direction)])
        stages = np.insert(form.stage, at, np.array(stage, dtype=np.int64))
        microbatches = np.insert(form.microbatch, at, np.array(microbatch, dtype=np.int64))
    else:
        kind, stages, microbatches = form.kind, form.stage, form.microbatch
    lengths = form.lengths + np.array(counts, dtype=np.int64)
    return sem.with_coded(planned, sem.CodedSchedule.of_arrays(planned, lengths, kind, stages, microbatches))
