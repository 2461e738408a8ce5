"""The planner's search: simulate candidates in order of a step-time bound, keep the best that fit.

Candidates (``candidates.py``) whose weights and optimizer state alone exceed the budget are not
simulated; the rest are queued by a lower bound on their step time, memory policies escalate only
where needed, and what is shown is confirmed by full simulations. Everything is enumerated and
processed in sorted order, so plans are deterministic.
"""
from __future__ import annotations

import heapq
import logging
import math
import multiprocessing
import time
from collections.abc import Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from pipeoffload._perf import Memo, gc_paused
from pipeoffload.errors import ConfigError, Naming
from pipeoffload.planner.candidates import (
    MAX_LEVEL,
    Candidate,
    count,
    enumerate_candidates,
    evaluate,
    layouts,
    level,
    max_stages,
    tp_divides,
    tp_sizes,
    why_no_choice,
)
from pipeoffload.planner.evaluate import SimSummary, lowering_options, simulate_choice
from pipeoffload.planner.hardware import gib
from pipeoffload.planner.plans import GIB, InfeasibleError, Plan, PlanRequest, SearchResult, pareto_front
from pipeoffload.policies import OffloadPolicy, RecomputePolicy

log = logging.getLogger(__name__)
progress_log = logging.getLogger("pipeoffload.planner.progress")  # the CLI shows it on stderr
PROGRESS_AFTER, PROGRESS_EVERY = 3.0, 5.0  # seconds before the first progress line, and between lines
_AUTO = RecomputePolicy("auto")
BATCH = 2  # candidates taken from the queue at a time; fixed, so results do not depend on ``workers``
_SAME_STEP = 1e-9  # relative: a fitting plan's step within this of its plain schedule's is that step
NOT_NEEDED = "not needed: a plan without it fits"
SLOWER = "not faster than a plan of a cheaper policy that fits (tried past the escalation)"

def find_plans(req: PlanRequest) -> SearchResult:
    """Find the fastest plans that fit ``req.memory_budget``; raise ``InfeasibleError`` if none does.

    Candidates are simulated in order of a lower bound on their step time. Offload and recompute only
    add waits and work to a schedule, so a schedule's offload/recompute variants are queued after the
    plain schedule, bounded by its step time; with ``req.escalate`` only when nothing cheaper of the
    same schedule fits: first the offload variants, then the recompute ones; past the first level that
    fits, the later ones only for a faster best plan (``_Search._bar``), so a larger budget, where a
    cheaper level starts to fit, does not lose a faster plan of a later one. A candidate is skipped
    when its bound is slower than the top ``req.top`` (and, with ``req.best_per_tp``, than the best
    plan of its TP size), so the Pareto frontier is that of the simulated plans; with
    ``req.exact_frontier`` a candidate is also
    kept while it could join the frontier (no fitting plan that is at least as fast needs no more
    memory than the candidate's weights and optimizer state alone). A variant whose ``least_memory``
    breaks the budget is counted as "cannot fit" without a simulation.

    The cyclic garbage collector is paused meanwhile (and restored): the search allocates many small
    acyclic objects and keeps its schedules, and each full collection would rescan them all.
    """
    with gc_paused():
        return _find_plans(req)


def _no_candidate_message(req: PlanRequest, skipped: dict[str, int], n: Naming) -> str:
    """The one line for a search with nothing to try, naming the real cause: a pipeline size (``n``:
    the request's field or its flag) that does not divide the GPUs (or is more stages than the layers
    fill), then the skipped layouts' own reasons (a batch not divisible by DP x microbatch size)."""
    what = f"no layout for {req.gpus} GPUs and global batch {req.global_batch}"
    tps = [t for t in tp_sizes(req) if tp_divides(req, t)]
    stages = max_stages(req)
    if req.pp_sizes and tps:
        dividing = [pp for pp in req.pp_sizes if any((req.gpus // t) % pp == 0 for t in tps)]
        if not dividing:
            return (f"{what}: {_sizes(n, 'pp_sizes', req.pp_sizes)} does not divide the GPUs left per pipeline "
                    f"({req.gpus} / TP for TP in {', '.join(map(str, tps))}); use a {n('pp_sizes')} that divides "
                    f"{req.gpus} / TP")
        if all(pp > stages for pp in dividing):
            return (f"{what}: {_sizes(n, 'pp_sizes', tuple(dividing))} is more stages than the {req.model.layers} "
                    f"layers fill; use {_sizes(n, 'pp_sizes', (stages,))} or fewer")
    reasons = "; ".join(f"{k} ({c}x)" for k, c in skipped.items())
    if "global batch not divisible by DP x microbatch size" in skipped:
        return (f"{what}: {reasons}; pick a global batch divisible by the data-parallel size x microbatch size")
    if reasons:
        return f"{what}: {reasons}"
    why: list[str] = []
    for layout in layouts(req, {}):
        m = req.global_batch // (layout.dp * req.model.microbatch)
        why += [r for r in why_no_choice(req, layout.pp, m, n) if r not in why]
    shown = "; ".join(why[:3]) + (f"; and {len(why) - 3} more" if len(why) > 3 else "")
    allow = "the flags allow" if n.flags else "the request allows"
    return (f"{what}: no schedule of {', '.join(req.families())} runs on the layouts {allow} ({shown}); "
            f"widen {n('pp_sizes')}, {n('tp_sizes')} or {n('schedules')}")


def _sizes(n: Naming, field: str, values: tuple[int, ...]) -> str:
    """Sizes as the message has always shown them on the command line (``--pp 3, 5``), or the field."""
    return f"{n(field)} {', '.join(map(str, values))}" if n.flags else f"{field}={values!r}"


def _find_plans(req: PlanRequest) -> SearchResult:
    start = time.perf_counter()
    skipped: dict[str, int] = {}
    cands = enumerate_candidates(req, skipped)
    if not cands:
        raise ConfigError.named(lambda n: _no_candidate_message(req, skipped, n))
    search = _Search(req, skipped)
    for cand in cands:
        search.add(cand)
    search.release_orphans()
    by_key = {c.key(): c for c in cands}
    with _pool(req.workers) as pool:
        search.run(pool, batch=BATCH)
        _confirm(req, by_key, search.plans, pool, search.memo)
    if not any(p.fits for p in search.plans.values()):
        _raise_infeasible(req, cands, search.plans, search.memo)
    ordered = sorted(search.plans.values(), key=Plan.sort_key)
    elapsed = time.perf_counter() - start
    log.info("planner: %d candidates, %d simulated in %.1fs", len(cands), len(search.plans), elapsed)
    return SearchResult(req, ordered, len(cands), len(search.plans), elapsed, skipped)


@dataclass
class _Fit:
    """A schedule's fitting plans without a stall budget: the escalation level of the first, the fastest step."""

    level: int
    step: float = float("inf")
    plans: list[Plan] = field(default_factory=list)


class _Search:
    """The priority queue of candidates, the escalation of memory policies, and the pruning state; and
    the search's memo (schedules, simulations and offload plans its candidates share, see ``_perf.Memo``),
    which lives as long as the search."""

    def __init__(self, req: PlanRequest, skipped: dict[str, int]) -> None:
        self.req, self.skipped = req, skipped
        self.memo = Memo()
        self.queue: list[tuple[float, tuple, int, Candidate]] = []
        self.levels: dict[tuple, list[list[Candidate]]] = {}  # base key -> variants by escalation level
        self.plans: dict[tuple, Plan] = {}
        self.top: list[float] = []  # step times of the fastest fitting plans, at most req.top
        self.best_tp: dict[int, float] = {}  # fastest fitting step time per TP size
        self.front: list[tuple[float, float]] = []  # (memory, step time) of fitting plans
        self.base_time: dict[tuple, float] = {}
        self.base_sim: dict[tuple, SimSummary] = {}
        self.fits: dict[tuple, _Fit] = {}  # base key -> its fitting plans (without a stall budget)
        self.pushed = 0
        self.keys: set[tuple] = set()  # every candidate's key
        self.started = time.perf_counter()
        self.next_report = self.started + PROGRESS_AFTER

    def add(self, cand: Candidate) -> None:
        self.keys.add(cand.key())
        if cand.is_base():
            self._push(cand, cand.time_bound)
        else:
            levels = self.levels.setdefault(cand.base_key(), [[] for _ in range(MAX_LEVEL)])
            levels[level(cand.choice) - 1].append(cand)

    def release_orphans(self) -> None:
        """Queue the first variants of schedules whose plain form was not asked for (e.g. --offload auto)."""
        bases = {key for _, key, _, _ in self.queue}
        for base in sorted(set(self.levels) - bases):
            self._release(base)

    def _push(self, cand: Candidate, bound: float) -> None:
        self.pushed += 1
        heapq.heappush(self.queue, (bound, cand.key(), self.pushed, cand))

    def _release(self, base: tuple) -> None:
        """Queue the next level of memory policies of ``base`` (all of them without escalation). Past a
        fitting level, the variants ``_not_worth_trying`` are left out."""
        levels = self.levels.get(base)
        while levels:
            level = [cand for cand in levels.pop(0) if not self._not_worth_trying(cand)]
            for cand in level:
                self._push(cand, max(cand.time_bound, self.base_time.get(base, 0.0)))
            if self.req.escalate and level:
                break

    def _not_worth_trying(self, cand: Candidate) -> bool:
        """Past a fitting level of its schedule: ``recompute first:K'`` without offload where
        ``first:K`` (K < K') fits, since the same R actions and more can only lengthen the step; and,
        a rule for cost (level 4's offload passes are the search's most expensive step), level 4
        (``offload auto``, ``recompute auto``) where a level-3 plan fits and met its budget X: it
        recomputed what stays above X of the two offload plans level 3 reads, one of them level 4's
        (``passes.lower._auto_keys``). A level-3 plan that missed X fits only by the other ranks'
        memory, and level 4 is tried after it (the case of the 70B search, docs/planner.md)."""
        fit = self.fits.get(cand.base_key())
        if fit is None:
            return False
        choice = cand.choice
        if choice.recompute.kind == "first" and choice.offload == OffloadPolicy():
            skip = any(p.choice.offload == choice.offload and p.choice.recompute.kind == "first"
                       and p.choice.recompute.count < choice.recompute.count
                       and replace(p.choice.recompute, count=choice.recompute.count) == choice.recompute
                       for p in fit.plans)
        else:
            skip = level(choice) == 4 and any(level(p.choice) == 3 and not p.sim.missed_budget for p in fit.plans)
        if skip:
            count(self.skipped, NOT_NEEDED)
        return skip

    def _beyond_fit(self, cand: Candidate) -> bool:
        """Whether ``cand`` is of a later escalation level than its schedule's first fitting plan: it is
        tried only for a faster plan than that one (``_may_be_faster``, ``_bar``)."""
        fit = self.fits.get(cand.base_key())
        return self.req.escalate and fit is not None and level(cand.choice) > fit.level

    def _bar(self, cand: Candidate) -> float:
        """The step a variant tried past its schedule's fitting level must beat to matter: that fitting
        plan's, and the fastest fitting plan's so far (of its TP size with ``req.best_per_tp``). So the
        best plan (per TP size) is that of every level, and the other shown plans those of the first
        fitting level of their schedule, as before."""
        best = self.best_tp.get(cand.layout.tp, float("inf")) if self.req.best_per_tp else (
            self.top[0] if self.top else float("inf"))
        return min(self.fits[cand.base_key()].step, best)

    def _may_be_faster(self, base: tuple) -> bool:
        """Whether a later escalation level of ``base`` could give a faster plan than its fitting one:
        every variant runs the plain schedule's compute and adds copies or recomputation, so nothing is
        faster than a fitting plan at the plain schedule's step (no offload, or offload hidden)."""
        fit = self.fits.get(base)
        if not self.req.escalate or fit is None:
            return True
        return fit.step > self.base_time.get(base, 0.0) * (1 + _SAME_STEP)

    def _prunable(self, cand: Candidate, bound: float) -> bool:
        req = self.req
        if not req.prune or len(self.top) < req.top or bound <= self.top[-1]:
            return False
        if req.best_per_tp and bound <= self.best_tp.get(cand.layout.tp, float("inf")):
            return False
        if not req.exact_frontier:
            return True
        static = max(cand.static_bytes)
        return any(mem <= static and t <= bound for mem, t in self.front)

    def run(self, pool: Executor | None = None, batch: int = 1) -> None:
        """Simulate until the queue is empty, ``batch`` candidates at a time (in ``pool`` if given).
        Batches are formed in queue order, so the result does not depend on the timing of workers."""
        while self.queue:
            todo: list[Candidate] = []
            while self.queue and len(todo) < batch:
                bound, _, _, cand = heapq.heappop(self.queue)
                if max(cand.static_bytes) > self.req.memory_budget:
                    count(self.skipped, "weights + optimizer state alone exceed the budget")
                    self._drop(cand.base_key())
                elif self._beyond_fit(cand) and bound >= self._bar(cand):
                    count(self.skipped, NOT_NEEDED)  # its bound: it cannot give a faster best plan
                    if not self._pending(cand.base_key()):
                        self._release(cand.base_key())  # a later level's bound is its own
                elif self._prunable(cand, bound):
                    count(self.skipped, "pruned: its step-time bound cannot make the shown plans")
                    self._drop(cand.base_key())
                else:
                    todo.append(cand)
            # a variant that cannot fit is not simulated; its base is (its step time bounds the variants)
            run = [cand for cand in todo if cand.is_base() or not cand.cannot_fit(self.req)]
            jobs = [(self.req, cand, False, self.base_sim.get(cand.base_key())) for cand in run]
            results = list(pool.map(_run_job, jobs)) if pool is not None and len(jobs) > 1 else [
                _run(*job, memo=self.memo) for job in jobs]
            plans = dict(zip((cand.key() for cand in run), results))
            for cand in todo:
                self._done(cand, plans.get(cand.key()))
            self._progress()
        for base in list(self.levels):
            self._drop(base, reason=NOT_NEEDED)

    def _progress(self) -> None:
        now = time.perf_counter()
        if now >= self.next_report:
            self.next_report = now + PROGRESS_EVERY
            best = f", fastest fitting step {self.top[0]:.3g} s" if self.top else ""
            progress_log.info("searching: %.0f s, %d candidates simulated, %d queued%s", now - self.started,
                              len(self.plans), len(self.queue), best)

    def _done(self, cand: Candidate, plan: Plan | None) -> None:
        """Record a simulated candidate (``plan``), or one skipped because it cannot fit (None). A
        policy that changed nothing is skipped as its plain schedule, if that was asked for too; else
        (``--offload budget`` alone, its target met without copies) it is the plan of that layout."""
        base = cand.base_key()
        if plan is None:
            count(self.skipped, "cannot fit: weights + optimizer state + the activation its backward needs "
                                "exceed the budget")
        elif not cand.is_base() and not plan.sim.changed and (cand.choice.offload.max_stall > 0
                                                               or base in self.keys):
            count(self.skipped, "stall budget changed nothing (same as the plan without it)"
                  if cand.choice.offload.max_stall > 0 else "policy changed nothing (same as the plain schedule)")
        elif self._recomputes_nothing(cand, plan):
            count(self.skipped, "recompute auto recomputed nothing (same as its offload policy alone)")
        elif self._beyond_fit(cand) and not (plan.fits and plan.step_time < self.fits[base].step):
            count(self.skipped, SLOWER)
        else:
            self.plans[cand.key()] = plan
        if plan is not None and cand.is_base():
            self.base_time[base] = plan.step_time
            self.base_sim[base] = plan.sim
        if plan is not None and plan.fits and cand.key() in self.plans:
            self._record(plan, cand, base)
        if self._may_be_faster(base) and not self._pending(base):
            self._release(base)

    def _recomputes_nothing(self, cand: Candidate, plan: Plan) -> bool:
        """A ``recompute auto`` variant that recomputed nothing (none would lower the peak) is the plan
        of its offload policy alone, when that is a candidate too."""
        choice = cand.choice
        if choice.recompute != _AUTO or plan.sim.recomputed:
            return False
        # the twin's offload policy carries the ranks' offsets only under a stall budget (``candidates``)
        offload = choice.offload if choice.offload.max_stall > 0 else replace(choice.offload, rank_offsets=())
        return (str(cand.layout), replace(choice, recompute=RecomputePolicy(), offload=offload)) in self.keys

    def _record(self, plan: Plan, cand: Candidate, base: tuple) -> None:
        # a stall budget's plan is an extra: the policies without it escalate as they would without it
        if plan.choice.offload.max_stall == 0:
            fit = self.fits.setdefault(base, _Fit(level(cand.choice)))
            fit.step = min(fit.step, plan.step_time)
            fit.plans.append(plan)
        self.top = sorted(self.top + [plan.step_time])[: self.req.top]
        tp = plan.layout.tp
        self.best_tp[tp] = min(self.best_tp.get(tp, float("inf")), plan.step_time)
        self.front.append((plan.memory.total, plan.step_time))

    def _pending(self, base: tuple) -> bool:
        """Whether variants of ``base`` released earlier are still queued."""
        return any(c.base_key() == base for _, _, _, c in self.queue)

    def _drop(self, base: tuple, reason: str | None = None) -> None:
        """Forget the unreleased variants of ``base`` (a pruned or too-big base prunes them too)."""
        dropped = sum(len(level) for level in self.levels.pop(base, []))
        if dropped:
            count(self.skipped, reason or "pruned with the schedule they vary", dropped)


@contextmanager
def _pool(workers: int) -> Iterator[Executor | None]:
    """A process pool for ``workers`` > 1 (forked where the platform allows), else None."""
    if workers <= 1:
        yield None
        return
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else None)
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        yield pool


def _run_job(job: tuple) -> Plan:
    """One candidate in a worker process, with a memo of its own (a memo does not cross processes)."""
    return _run(*job)


def _run(req: PlanRequest, cand: Candidate, exact: bool = False, base: SimSummary | None = None,
         memo: Memo | None = None) -> Plan:
    sim = simulate_choice(cand.choice, cand.layout.pp, cand.microbatches, cand.stage.costs,
                          extrapolate=not exact, fallback=cand.choice.periodic(), base=base, memo=memo)
    return evaluate(req, cand, sim)


def _confirm(req: PlanRequest, by_key: dict[tuple, Candidate], plans: dict[tuple, Plan],
             pool: Executor | None = None, memo: Memo | None = None) -> None:
    """Re-simulate at full size every estimated plan that would be shown (the top ``req.top``, the
    Pareto frontier, the best per TP size) until all shown plans are exact."""
    def key(plan: Plan) -> tuple:
        return (str(plan.layout), plan.choice)

    while True:
        fitting = sorted((p for p in plans.values() if p.fits), key=Plan.sort_key)
        shown: list[Plan] = []
        exact_top = 0
        for plan in fitting:  # walk down until the top is made of exact plans
            shown.append(plan)
            exact_top += plan.exact
            if exact_top >= req.top:
                break
        for tp in sorted({p.layout.tp for p in fitting}) if req.best_per_tp else ():
            for plan in (p for p in fitting if p.layout.tp == tp):
                shown.append(plan)
                if plan.exact:
                    break
        shown += pareto_front(fitting)
        pending = {key(p): p for p in shown if not p.exact}
        if not pending:
            return
        keys = sorted(pending, key=lambda k: (k[0], k[1]))
        jobs = [(req, by_key[k], True) for k in keys]
        results = (pool.map(_run_job, jobs) if pool is not None and len(jobs) > 1
                   else [_run(*job, memo=memo) for job in jobs])
        plans.update(zip(keys, results))


def _host_ok(req: PlanRequest, plan: Plan) -> bool:
    return req.host_memory_budget is None or plan.memory.host <= req.host_memory_budget


def _raise_infeasible(req: PlanRequest, cands: list[Candidate], plans: dict[tuple, Plan], memo: Memo) -> None:
    """Find the smallest memory any candidate needs (branch and bound on its static part) and raise."""
    def better(p: Plan, q: Plan | None) -> bool:
        return q is None or (p.memory.total, p.sort_key()) < (q.memory.total, q.sort_key())

    best: Plan | None = None
    for plan in plans.values():
        if _host_ok(req, plan) and better(plan, best):
            best = plan
    for cand in sorted(cands, key=lambda c: (max(c.static_bytes), c.key())):
        if best is not None and max(cand.static_bytes) >= best.memory.total:
            break
        if best is not None and cand.least_memory >= best.memory.total:
            continue  # it cannot need less memory than the best so far
        if cand.key() not in plans:
            plans[cand.key()] = plan = _run(req, cand, memo=memo)
            if _host_ok(req, plan) and better(plan, best):
                best = plan
    if best is None:  # only possible with a host budget
        least = min(plans.values(), key=lambda p: (p.memory.host, p.sort_key()))
        raise InfeasibleError.named(
            lambda n: f"no plan keeps pinned host memory within {req.host_memory_budget / GIB:.1f} GiB per GPU "  # type: ignore[operator]
                      f"(the least any plan needs is {least.memory.host / GIB:.1f} GiB); raise "
                      f"{n('host_memory_budget')} or drop it")
    need = best.memory.total
    host = f" within the host budget {req.host_memory_budget / GIB:.1f} GiB" if req.host_memory_budget else ""
    raise InfeasibleError.named(
        lambda n: f"no plan fits {gib(req.memory_budget)} GiB per GPU{host}: the smallest feasible memory is "
                  f"{_rounded_up(need)} GiB ({best.layout} {best.choice.label()}: parameters "
                  f"{gib(best.memory.parameters)} + optimizer {gib(best.memory.optimizer)} + activations "
                  f"{gib(best.memory.activations)} GiB); {_infeasible_hint(req, need, n)}", need, best)


def _infeasible_hint(req: PlanRequest, need: float, n: Naming) -> str:
    """What can make it fit: a budget above the GPU's memory cannot, so then more GPUs or model parallelism."""
    policies = "" if lowering_options() else " (offload/recompute policies are not available in this build)"
    if need > req.hardware.memory_bytes:
        return (f"that is above a {req.hardware.name}'s {gib(req.hardware.memory_bytes)} GiB: add GPUs "
                f"({n('gpus')}), allow more TP/PP ({n('tp_sizes')}/{n('pp_sizes')}), or offload/recompute "
                f"({n('offload')}/{n('recompute')}){policies}")
    hint = f"raise {n('memory_budget')} or add GPUs" + policies
    if req.memory_budget * GIB <= req.hardware.memory_bytes:  # bytes that read as the GPU's GiB: GiB meant
        hint += f" (memory_budget is in bytes: {req.memory_budget:g} GiB is {req.memory_budget:g} * 2**30)"
    return hint


def _rounded_up(need: float) -> str:
    """``need`` bytes in GiB rounded up (passing it back as --memory fits): to 0.1 GiB, or to two
    significant digits below that (a tiny model's need did not read "0.1" against parts of "0.0")."""
    if need >= 0.1 * GIB:
        return f"{math.ceil(need / GIB * 10) / 10:.1f}"
    digits = 1 - math.floor(math.log10(need / GIB)) if need > 0 else 1
    return f"{math.ceil(need / GIB * 10 ** digits) / 10 ** digits:.{digits}f}"
