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
from pipeoffload.passes.copy_plan import EPS, Activation, Lane, Placed, RankTimeline
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
    peak_before: float  # planned peak without offload (activation units)
    peak_after: float  # planned peak with the offloads placed


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
        return None if self.budget is None else self.peak_after <= self.budget + EPS

    def summary(self) -> str:
        text = (f"offload {self.policy}: {self.offloaded} activations offloaded, {len(self.unhidden)} could not "
                f"be hidden by the copy lane; planned peak {self.peak_before:g} -> {self.peak_after:g} units")
        if self.recomputed:
            text += f"; recompute {self.recompute}: {len(self.recomputed)} activations"
        if self.budget is not None:
            text += f"; budget {self.budget:g} {'met' if self.budget_met else 'NOT met'}"
        return "; ".join([text, *self.notes])


class _Group:
    """Ranks planned together because they share copy resources (one rank, or a host-link pair)."""

    def __init__(self, timelines: list[RankTimeline], costs: CostModel) -> None:
        self.timelines = {tl.rank: tl for tl in timelines}
        self.costs = costs
        links = {"d2h": Lane(), "h2d": Lane()}
        self._engine: dict[tuple[int, str], Lane] = {}
        self._lanes: dict[tuple[int, str], list[Lane]] = {}
        for rank in self.timelines:
            shared = Lane()
            for direction in ("d2h", "h2d"):
                engine = shared if costs.shared_copy_engine else Lane()
                self._engine[(rank, direction)] = engine
                self._lanes[(rank, direction)] = [engine, links[direction]] if costs.shared_host_link else [engine]

    def engine(self, rank: int, direction: str) -> Lane:
        """The copy engine a copy in ``direction`` uses (one for both directions by default)."""
        return self._engine[(rank, direction)]

    def lanes(self, rank: int, direction: str) -> list[Lane]:
        """Every resource such a copy occupies: its engine, and the pair's link when shared."""
        return self._lanes[(rank, direction)]

    # ---- searches over valid starts: grid points, or the end of the previous copy on the engine ----
    def earliest(self, rank: int, direction: str, t: float, duration: float, limit: float) -> float | None:
        tl, own, lanes = self.timelines[rank], self.engine(rank, direction), self.lanes(rank, direction)
        cursor: float | None = t
        while cursor is not None and cursor <= limit + EPS:
            blocked = [c[1] for c in (lane.conflict(cursor, duration) for lane in lanes) if c]
            if not blocked:
                return cursor
            past = max(blocked)
            options = [x for x in (tl.grid_ceil(past), own.end_at_or_after(past)) if x is not None]
            cursor = min(options) if options else None
        return None

    def latest(self, rank: int, direction: str, t: float, duration: float, lower: float) -> float | None:
        tl, own, lanes = self.timelines[rank], self.engine(rank, direction), self.lanes(rank, direction)
        cursor = _prev_start(tl, own, t)
        while cursor is not None and cursor >= lower - EPS:
            blocked = [c[0] for c in (lane.conflict(cursor, duration) for lane in lanes) if c]
            if not blocked:
                return cursor
            cursor = _prev_start(tl, own, min(blocked) - duration)
        return None

    def place(self, rank: int, x: Activation) -> Placed | None:
        """Reserve D2H (earliest) and H2D (latest) for ``x``; None if they do not fit."""
        d2h_start = self.earliest(rank, "d2h", x.f_end, x.d2h, x.deadline - x.h2d - x.d2h)
        if d2h_start is None:
            return None
        for lane in self.lanes(rank, "d2h"):
            lane.add(d2h_start, x.d2h)
        h2d_start = self.latest(rank, "h2d", x.deadline - x.h2d, x.h2d, d2h_start + x.d2h)
        if h2d_start is None:
            for lane in self.lanes(rank, "d2h"):
                lane.remove(d2h_start, x.d2h)
            return None
        for lane in self.lanes(rank, "h2d"):
            lane.add(h2d_start, x.h2d)
        lo, hi = self.timelines[rank].off_range(d2h_start + x.d2h, h2d_start)
        return Placed(x, d2h_start, h2d_start, lo, hi)

    def unplace(self, rank: int, p: Placed) -> None:
        for lane in self.lanes(rank, "d2h"):
            lane.remove(p.d2h_start, p.activation.d2h)
        for lane in self.lanes(rank, "h2d"):
            lane.remove(p.h2d_start, p.activation.h2d)


def _prev_start(tl: RankTimeline, own: Lane, t: float) -> float | None:
    options = [x for x in (tl.grid_floor(t), own.end_at_or_before(t)) if x is not None]
    return max(options) if options else None


# ---- the policy driver ---------------------------------------------------------------------------
@dataclass
class _RankState:
    timeline: RankTimeline
    memory: np.ndarray
    placed: list[Placed] = field(default_factory=list)
    unhidden: list[Key] = field(default_factory=list)
    too_short: int = 0

    def peak(self) -> float:
        return float(self.memory.max()) if len(self.memory) else 0.0


def _place_all(group: _Group, states: dict[int, _RankState], order: list[tuple[int, Activation]],
               budget: float | None) -> None:
    """Greedy in value order. With a budget, accept only offloads that cover an over-budget point."""
    for rank, x in order:
        state = states[rank]
        if x.value <= EPS:
            state.too_short += 1
            continue
        if budget is not None and state.peak() <= budget + EPS:
            continue
        p = group.place(rank, x)
        if p is None:
            state.unhidden.append((x.stage, x.microbatch))
            continue
        window = state.memory[p.lo:p.hi]
        if p.hi <= p.lo or (budget is not None and window.max() <= budget + EPS):
            group.unplace(rank, p)
            state.too_short += p.hi <= p.lo
            continue
        window -= x.size
        state.placed.append(p)


def _prune(group: _Group, states: dict[int, _RankState], targets: dict[int, float]) -> bool:
    """Drop offloads not needed to keep each rank at its target; True if any was dropped."""
    dropped = False
    for rank, state in states.items():
        keep = []
        for p in sorted(state.placed, key=lambda q: (q.activation.value, q.activation.stage, q.activation.microbatch)):
            window = state.memory[p.lo:p.hi]
            if len(window) and window.max() + p.activation.size <= targets[rank] + EPS:
                window += p.activation.size
                group.unplace(rank, p)
                dropped = True
            else:
                keep.append(p)
        state.placed = keep
    return dropped


def _plan_group(timelines: list[RankTimeline], costs: CostModel, policy: OffloadPolicy,
                candidates: dict[int, list[Activation]], budget: float | None) -> dict[int, _RankState]:
    group = _Group(timelines, costs)
    states = {tl.rank: _RankState(tl, tl.memory.copy()) for tl in timelines}
    order = sorted(((r, x) for r, xs in candidates.items() for x in xs),
                   key=lambda rx: (-rx[1].value, rx[1].stage, rx[1].microbatch, rx[0]))
    _place_all(group, states, order, budget)
    if policy.kind not in ("auto", "budget"):
        return states
    targets = {r: max(s.peak(), budget or 0.0) for r, s in states.items()}
    kept = {(r, p.activation.stage, p.activation.microbatch) for r, s in states.items() for p in s.placed}
    if not _prune(group, states, targets):
        return states
    # Re-place the kept offloads from scratch so every start is again exact (see copy_plan).
    survivors = {(r, p.activation.stage, p.activation.microbatch) for r, s in states.items() for p in s.placed}
    again = _Group(timelines, costs)
    fresh = {tl.rank: _RankState(tl, tl.memory.copy()) for tl in timelines}
    for rank, x in order:
        if (rank, x.stage, x.microbatch) in survivors:
            p = again.place(rank, x)
            if p is None or p.hi <= p.lo:
                log.debug("re-placing pruned plan failed for %s; keeping the unpruned plan", x)
                return _plan_unpruned(timelines, costs, order, budget, kept)
            fresh[rank].memory[p.lo:p.hi] -= x.size
            fresh[rank].placed.append(p)
    for rank, state in fresh.items():
        state.unhidden, state.too_short = states[rank].unhidden, states[rank].too_short
    return fresh


def _plan_unpruned(timelines, costs, order, budget, kept):  # type: ignore[no-untyped-def]
    group = _Group(timelines, costs)
    states = {tl.rank: _RankState(tl, tl.memory.copy()) for tl in timelines}
    _place_all(group, states, [(r, x) for r, x in order if (r, x.stage, x.microbatch) in kept], budget)
    return states


# ---- entry point -----------------------------------------------------------------------------------
def plan_offload(schedule: Schedule, costs: CostModel, policy: OffloadPolicy | str,
                 *, exclude: frozenset[Key] | set[Key] = frozenset(),
                 timeline: Timeline | None = None) -> tuple[Schedule, OffloadReport]:
    """Insert OFFLOAD/RELOAD into a compute-only ``schedule`` (copies already in it are replaced).

    ``exclude`` lists (stage, microbatch) activations that must stay put (e.g. recomputed ones).
    """
    policy = OffloadPolicy.parse(policy)
    base = schedule.compute_only()
    if policy.kind == "none":
        return base, OffloadReport(str(policy))
    timeline = timeline if timeline is not None else simulate(base, costs)
    recomputed = {(a.stage, a.microbatch) for row in base.actions for a in row if a.kind is K.R}
    timelines = [RankTimeline(r, base.actions[r], timeline.start[r], timeline.end[r], costs, recomputed)
                 for r in range(base.num_ranks)]
    budget = policy.budget_units(base.stages_per_rank) if policy.kind == "budget" else None
    chosen = _candidates(timelines, policy, set(exclude))
    states: dict[int, _RankState] = {}
    for members in _groups(base.num_ranks, costs.shared_host_link):
        tls = [timelines[r] for r in members]
        states.update(_plan_group(tls, costs, policy, {r: chosen[r] for r in members}, budget))
    rows = [_emit(states[r]) for r in range(base.num_ranks)]
    report = OffloadReport(
        str(policy),
        tuple(RankOffloadReport(r, len(s.placed), tuple(s.unhidden), s.too_short,
                                float(timelines[r].memory.max()) if len(timelines[r].memory) else 0.0, s.peak())
              for r, s in sorted(states.items())),
        budget,
    )
    if report.budget_met is False:
        log.warning("offload %s: the copy lane cannot bring every rank to %g units; best planned peak %g",
                    policy, budget, report.peak_after)
    return base.with_actions(rows), report


def _groups(num_ranks: int, shared_link: bool) -> list[list[int]]:
    if not shared_link:
        return [[r] for r in range(num_ranks)]
    return [list(range(p, min(p + 2, num_ranks))) for p in range(0, num_ranks, 2)]


def _candidates(timelines: list[RankTimeline], policy: OffloadPolicy, exclude: set[Key]) -> dict[int, list[Activation]]:
    out = {}
    for tl in timelines:
        acts = [x for key, x in tl.activations.items() if key not in exclude]
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
