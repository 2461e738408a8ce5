"""The policy driver of the offload pass: which activations to offload on one group of ranks.

A group is one rank, or two ranks sharing a host link. Its plan is built from the placement
primitives of ``copy_plan``:

- everything worth offloading is *packed* (reloads latest-deadline first, offloads in forward order);
- if the copy lane is overloaded, a second plan picks candidates by value first (size x the time
  they could be off the device: the longest-lived stages win), packs that set and adds what still
  fits; the plan with the lower peak is kept;
- ``budget`` picks by value only offloads that lower a point above the budget;
- ``auto`` and ``budget`` finally drop offloads not needed for the reached peak and pack the rest
  again, so every start stays exact.
"""
from __future__ import annotations

import logging

import numpy as np

from pipeoffload.costs import CostModel
from pipeoffload.ir import Action
from pipeoffload.passes.copy_plan import EPS, Activation, CopyGroup, Placed, RankTimeline
from pipeoffload.policies import OffloadPolicy

log = logging.getLogger(__name__)
Key = tuple[int, int]


Pick = tuple[int, Activation]
_ByValue = tuple["_Plan", list[Pick], list[Pick]]  # picks placed by value on an empty plan: (plan, failed, picks)
Ident = tuple[int, int, int, int]  # (rank, stage, microbatch, window)


class RankState:
    """One rank's offloads in a plan, its planned memory curve and what could not be placed.

    The curve is brought up to date when read (``memory``): most plans the pass makes are only
    compared by their exact peaks (``exact_peak``, from ``placed``) and then dropped (or kept in
    a search's memo), so their curves are never worked out, nor the timeline's copied. Each
    placement is subtracted in the order it was added, as if it had been subtracted then, so a
    curve read is the one the eager updates gave."""

    __slots__ = ("timeline", "_memory", "_pending", "placed", "unhidden", "unhidden_w", "too_short", "until_i", "rows")

    def __init__(self, timeline: RankTimeline) -> None:
        self.timeline = timeline
        self._memory: np.ndarray | None = None  # a copy of the timeline's, once read
        self._pending: list[Placed] = []  # added to ``placed``, not yet subtracted from ``_memory``
        self.placed: list[Placed] = []
        self.unhidden: list[Key] = []  # window 0 (F -> backward)
        self.unhidden_w: list[Key] = []  # window 1 (I -> W)
        self.too_short = 0
        self.until_i = 0  # first windows left on the device until I because their I -> W window was offloaded
        self.rows: list[Action] | None = None  # the emitted list itself, where a repair moved copies and waits (``throttle.repair``)

    @property
    def memory(self) -> np.ndarray:
        """Resident units at each timeline point with the offloads placed so far."""
        if self._memory is None:
            self._memory = self.timeline.memory.copy()
        if self._pending:
            pending, self._pending = self._pending, []
            _subtract(self._memory, pending)
        return self._memory

    def peak(self) -> float:
        """Peak on the planning grid (conservative where a reload starts between grid points)."""
        memory = self.memory
        return float(memory.max()) if len(memory) else 0.0

    def exact_peak(self) -> float:
        """Peak with every copy at its planned time, as the simulator measures it."""
        tl = self.timeline
        steps = np.diff(np.concatenate(([0.0], tl.memory)))
        times = np.concatenate((tl.points, [p.d2h_end for p in self.placed], [p.h2d_start for p in self.placed]))
        sizes = [p.activation.size for p in self.placed]
        deltas = np.concatenate((steps, np.negative(sizes), sizes))
        order = np.lexsort((deltas, times))  # by time, frees before allocations
        levels = np.cumsum(deltas[order])
        return float(max(levels.max(initial=0.0), 0.0))

    def add(self, p: Placed) -> None:
        self.placed.append(p)
        self._pending.append(p)

    def add_all(self, placed: list[Placed]) -> None:
        """``add`` each of ``placed`` in turn."""
        self.placed.extend(placed)
        self._pending.extend(placed)


def _subtract(memory: np.ndarray, placed: list[Placed]) -> None:
    """Take each of ``placed`` off ``memory`` over its point range, in turn. Where every amount is a whole
    number (activation units of uniform stages, the usual case) every partial sum is exact, so the
    order of the subtractions cannot matter and one cumulative sum gives the same memory as the loop
    (worth its checks over the whole curve for a batch, not for the one placement a budget reads after)."""
    sizes = np.array([p.activation.size for p in placed]) if len(placed) >= _BATCH else None
    if sizes is not None and _whole(sizes) and _whole(memory) and float(
            np.abs(sizes).sum() + np.abs(memory).max(initial=0.0)) < _EXACT:
        lo = np.array([p.lo for p in placed], dtype=np.int64)
        hi = np.array([p.hi for p in placed], dtype=np.int64)
        used = lo < hi  # an empty range changes nothing
        steps = np.zeros(len(memory) + 1)
        np.add.at(steps, lo[used], sizes[used])
        np.subtract.at(steps, hi[used], sizes[used])
        memory -= np.cumsum(steps[:-1])
    else:
        for p in placed:
            memory[p.lo:p.hi] -= p.activation.size


class _Plan:
    """One candidate plan for a group: its copy resources and each rank's state."""

    def __init__(self, timelines: list[RankTimeline], costs: CostModel, relaxed: bool) -> None:
        self.args = (timelines, costs, relaxed)
        self.group = CopyGroup(timelines, costs, relaxed)
        self.states = {tl.rank: RankState(tl) for tl in timelines}
        self._peaks: dict[int, float] | None = None  # ``peaks()`` until the plan changes
        self.no_effect: set[Ident] = set()  # picks whose copies fit but leave no timeline point off the device

    def keys(self) -> set[Ident]:
        return {(r, *p.activation.ident) for r, s in self.states.items() for p in s.placed}

    def peaks(self) -> dict[int, float]:
        """Each rank's exact peak, kept until ``pack`` or ``greedy`` changes the plan: the pass compares
        the same plan's score several times (first windows, second windows, pruning, the caller)."""
        if self._peaks is None:
            self._peaks = {r: s.exact_peak() for r, s in self.states.items()}
        return self._peaks

    def score(self) -> tuple[float, int]:
        """Lower is better: the group's peak, then (for equal peaks) fewer copies."""
        return (max(self.peaks().values()), sum(len(s.placed) for s in self.states.values()))

    def pack(self, picks: list[Pick]) -> list[Pick]:
        """Pack ``picks`` into this (empty) plan; returns those that did not fit.

        A pick that fails after its reload was reserved frees that slot, and a reload packed right
        behind it would then start earlier than planned; so the set is packed again without the
        failures until a round places everything it tries (a few rounds when the lane is overloaded),
        or until the group shows that such a round would place the same (``CopyGroup.settled``).
        """
        self._peaks = None
        failed: list[Pick] = []
        for _ in range(_PACK_ROUNDS):
            placed, missed = self.group.pack(picks)
            if not missed:
                break
            failed += missed
            if self.group.settled:  # packed again without ``missed``, the same placements and lanes
                break
            missing = {(r, *x.ident) for r, x in missed}
            picks = [(r, x) for r, x in picks if (r, *x.ident) not in missing]
            self.group = CopyGroup(*self.args)
        else:
            log.debug("packing did not settle in %d rounds; some starts may come earlier than planned", _PACK_ROUNDS)
        by_rank: dict[int, list[Placed]] = {rank: [] for rank in self.states}
        for rank, p in placed:
            by_rank[rank].append(p)
        for rank, ps in by_rank.items():  # each rank's in the order placed
            self.states[rank].add_all(ps)
        return failed

    def greedy(self, picks: list[Pick], budget: float | None) -> list[Pick]:
        """Place one at a time in the given order; with a budget, keep only offloads that lower an
        over-budget point. Returns the picks that did not fit."""
        self._peaks = None
        failed = []
        over: dict[int, bool] = {}  # with a budget: rank -> its peak is above it (until the rank changes)
        for rank, x in picks:
            state = self.states[rank]
            if budget is not None:
                if rank not in over:
                    over[rank] = not state.peak() <= budget + EPS
                if not over[rank]:
                    continue
            p = self.group.place(rank, x)
            if p is None:
                failed.append((rank, x))
            elif p.hi <= p.lo or (budget is not None and state.memory[p.lo:p.hi].max() <= budget + EPS):
                self.group.unplace(rank, p)
                if p.hi <= p.lo:
                    self.no_effect.add((rank, *x.ident))
            else:
                state.add(p)
                over.pop(rank, None)
        return failed

    def needed(self, targets: dict[int, float]) -> set[Ident]:
        """The offloads needed to keep each rank at its target: drop the least valuable first while
        the peak stays at the target. The plan itself is left as it is."""
        keep = set()
        for rank, state in self.states.items():
            memory = state.memory.copy()
            for p in sorted(state.placed, key=lambda q: (q.activation.value, q.activation.stage,
                                                         q.activation.microbatch, q.activation.window)):
                window = memory[p.lo:p.hi]
                if len(window) and window.max() + p.activation.size <= targets[rank] + EPS:
                    window += p.activation.size
                else:
                    keep.add((rank, *p.activation.ident))
        return keep


def plan_group(timelines: list[RankTimeline], costs: CostModel, policy: OffloadPolicy,
                candidates: dict[int, list[Activation]], budget: float | None, relaxed: bool) -> _Plan:
    """The group's plan: the first windows (F -> backward) as ever, then the second windows (I -> W)
    in the copy-lane time left (or, where that peaks lower, the second windows first: the better of
    the two per group), then (``auto``, ``budget``) without what the peak does not need."""
    first = {r: [x for x in xs if x.window == 0] for r, xs in candidates.items()}
    split = any(x.window == 1 for xs in candidates.values() for x in xs)
    # a second window worth nothing even when it copies nothing on the way out is never placed: drop
    # it before building picks (group-interleaved's W follows its I at once: thousands of them)
    second = {r: [x for x in xs if x.window == 1 and x.size * (x.deadline - x.f_end - x.h2d) > EPS]
              for r, xs in candidates.items()}
    plan, failed, worth, by_value = _first_windows(timelines, costs, first, budget, relaxed)
    if split:  # a split backward: add its second windows, or plan them first if better
        if any(second.values()):
            more, missed = _second_windows(plan, second, budget)
            worth, failed = worth + more, failed + missed
            if by_value is not None and by_value[0] is plan:
                by_value = None  # no longer the first windows alone
        alt, alt_worth, alt_failed = _second_first(timelines, costs, first, second, budget, relaxed, by_value)
        if alt.score() < plan.score():
            plan, worth, failed = alt, alt_worth, alt_failed
    if policy.kind in ("auto", "budget"):
        plan = _pruned(plan, timelines, costs, relaxed, worth, budget)
    placed = plan.keys()
    for rank, state in plan.states.items():
        missing = [x for r, x in failed if r == rank and (r, *x.ident) not in placed]
        state.unhidden = [(x.stage, x.microbatch) for x in missing if x.window == 0]
        state.unhidden_w = [(x.stage, x.microbatch) for x in missing if x.window == 1]
        # too short: worth nothing, or copies that fit but leave the activation on the device at every point
        state.too_short = sum(1 for x in first.get(rank, ())
                              if x.value <= EPS or ((rank, *x.ident) in plan.no_effect and (rank, *x.ident) not in placed))
        state.until_i = len(_kept_until_i(rank, first.get(rank, []), placed, missing, plan.no_effect))
    return plan


def _kept_until_i(rank: int, first: list[Activation], placed: set[Ident], missing: list[Activation],
                  no_effect: set[Ident]) -> list[Activation]:
    """The first windows worth moving that were neither placed nor tried and failed because their
    second window took the lane (``_second_first``): on the device from F to I, on the host from I to W."""
    moved_w = {(s, m) for r, s, m, w in placed if r == rank and w == 1}
    if not moved_w:
        return []
    tried = {x.ident for x in missing}
    return [x for x in first if x.value > EPS and (x.stage, x.microbatch) in moved_w
            and (rank, *x.ident) not in placed and x.ident not in tried and (rank, *x.ident) not in no_effect]


def _second_windows(plan: _Plan, second: dict[int, list[Activation]], budget: float | None
                    ) -> tuple[list[Pick], list[Pick]]:
    """Add the I -> W windows to ``plan`` where the copy lane has room, most valuable per lane
    second first. Where the first window was offloaded too, its host copy is still there (kept from
    RELOAD to W), so the second window's offload copies nothing (``d2h = 0``). Returns (the picks
    tried, those that did not fit)."""
    picks = []
    for rank, xs in second.items():
        chained = {p.activation.ident[:2] for p in plan.states[rank].placed if p.activation.window == 0}
        for x in xs:
            picks.append((rank, _without_d2h(x) if (x.stage, x.microbatch) in chained else x))
    worth = _by_density([(r, x) for r, x in picks if x.value > EPS])
    return worth, plan.greedy(worth, budget)


def _without_d2h(x: Activation) -> Activation:
    """``x`` copying nothing on the way out (``dataclasses.replace`` is the pass's slowest call here)."""
    return Activation(x.stage, x.microbatch, x.size, x.f_end, x.deadline, x.back_index, 0.0, x.h2d, x.window)


def _second_first(timelines: list[RankTimeline], costs: CostModel, first: dict[int, list[Activation]],
                  second: dict[int, list[Activation]], budget: float | None, relaxed: bool,
                  by_value: _ByValue | None = None) -> tuple[_Plan, list[Pick], list[Pick]]:
    """The other order: the I -> W windows first (their own copies), then the first windows of the
    activations whose second window did not fit. Wins where the first windows are short (warm-up of
    zero-bubble schedules) and their copies would take the lane from the long I -> W waits.
    Returns (plan, picks tried, picks that did not fit).

    With no second window worth anything that plan is the first windows placed by value alone:
    ``by_value``, where ``_first_windows`` made it (the same picks in the same order on an empty plan,
    so the same placements and failures), is returned instead of being made again."""
    picks = _by_density([(r, x) for r, xs in second.items() for x in xs if x.value > EPS])
    if not picks and by_value is not None:
        plan, failed, worth = by_value
        return plan, worth, failed
    plan = _Plan(timelines, costs, relaxed)
    failed = plan.greedy(picks, budget)
    taken = {(r, stage, mb) for r, stage, mb, _ in plan.keys()}  # placed (a pick that fit but freed nothing was not)
    more = [(r, x) for r, x in _priority(first) if x.value > EPS and (r, x.stage, x.microbatch) not in taken]
    return plan, picks + more, failed + plan.greedy(more, budget)


def _by_density(picks: list[Pick]) -> list[Pick]:
    """Most memory-time saved per second of copy lane first (ties: earlier window, stage, microbatch, rank)."""
    return sorted(picks, key=lambda rx: (-rx[1].value / max(rx[1].d2h + rx[1].h2d, EPS), rx[1].f_end,
                                         rx[1].stage, rx[1].microbatch, rx[0]))


def _first_windows(timelines: list[RankTimeline], costs: CostModel, candidates: dict[int, list[Activation]],
                   budget: float | None, relaxed: bool
                   ) -> tuple[_Plan, list[Pick], list[Pick], _ByValue | None]:
    """The plan of the F -> backward windows: (plan, picks that did not fit, picks tried, and where it
    was made, the plan of those picks placed by value alone with its failures, which ``_second_first``
    may need again: the plan itself where it was kept, else a plan nothing changes after)."""
    order = _priority(candidates)
    worth = [(r, x) for r, x in order if x.value > EPS]

    def fresh() -> _Plan:
        return _Plan(timelines, costs, relaxed)

    by_value = None
    if budget is None:
        plan = fresh()
        failed = plan.pack(worth)
        if failed:  # the copy lane is overloaded: also try choosing by value, then packing that set
            failed = plan.greedy(failed, None)
            chooser = fresh()
            by_value = (chooser, chooser.greedy(worth, None), worth)
            alt = fresh()
            picked = chooser.keys()
            alt_failed = alt.pack([(r, x) for r, x in worth if (r, *x.ident) in picked])
            placed = alt.keys()
            alt_failed = alt.greedy([(r, x) for r, x in worth if (r, *x.ident) not in placed], None)
            if alt.score() < plan.score():
                plan, failed = alt, alt_failed
    else:
        chooser = fresh()
        tried_failed = chooser.greedy(worth, budget)
        picked = chooser.keys()
        plan = fresh()
        failed = plan.pack([(r, x) for r, x in worth if (r, *x.ident) in picked])
        failed = plan.greedy(failed, budget) + tried_failed
        by_value = (chooser, tried_failed, worth)
        if chooser.score() < plan.score():
            plan, failed = chooser, tried_failed
    return plan, failed, worth, by_value


def _pruned(plan: _Plan, timelines: list[RankTimeline], costs: CostModel, relaxed: bool,
            worth: list[Pick], budget: float | None) -> _Plan:
    """The plan without redundant offloads, packed again so that every start stays exact; the
    original plan if that packing fails or peaks higher."""
    targets = {r: max(peak, budget or 0.0) for r, peak in plan.peaks().items()}
    survivors = plan.needed(targets)
    # a second window that copies nothing relies on its first window's host copy: keep that too
    chained = {(r, *x.ident) for r, x in worth if x.window == 1 and x.d2h == 0.0 < x.h2d}
    survivors |= {(r, stage, mb, 0) for r, stage, mb, window in survivors & chained}
    if survivors == plan.keys():
        return plan
    again = _Plan(timelines, costs, relaxed)
    if again.pack([(r, x) for r, x in worth if (r, *x.ident) in survivors]):
        return plan
    peak = max(targets.values())
    return again if max(again.peaks().values()) <= peak + EPS else plan


def _priority(candidates: dict[int, list[Activation]]) -> list[Pick]:
    """Candidates by value, most valuable first (ties: earlier forward, then stage, microbatch, rank)."""
    pairs = [(r, x) for r, xs in candidates.items() for x in xs]
    return sorted(pairs, key=lambda rx: (-rx[1].value, rx[1].f_end, rx[1].stage, rx[1].microbatch, rx[0]))


_PACK_ROUNDS = 16
_BATCH = 8  # placements from which ``_subtract`` tries one cumulative sum
_EXACT = 2.0 ** 52  # whole numbers below this, and their sums, are exact in floating point


def _whole(values: np.ndarray) -> bool:
    return bool(np.all(np.isfinite(values)) and np.all(values == np.floor(values)))
