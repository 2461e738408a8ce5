"""The planner: enumerate layouts and schedules, simulate each, keep the best that fit the budget.

A candidate is a layout (PP x TP x DP) and a ``ScheduleChoice`` (family, stages per rank, group size,
offload and recompute policy). Its step time is the simulated pipeline makespan plus the data-parallel
gradient sync and the optimizer step; its memory is, on the worst rank, weights + gradients + optimizer
state + the simulated activation peak. Candidates whose weights and optimizer state alone exceed the
budget are not simulated. Everything is enumerated in sorted order, so plans are deterministic.
"""
from __future__ import annotations

import heapq
import logging
import multiprocessing
import math
import time
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Iterator

from pipeoffload.errors import ConfigError
from pipeoffload.planner.evaluate import (V_FAMILIES, ScheduleChoice, SimSummary, lowering_options,
                                          placement_of, simulate_choice, time_lower_bound)
from pipeoffload.planner.hardware import HardwareSpec
from pipeoffload.planner.model import ModelSpec
from pipeoffload.schedules import get_spec, schedule_names
from pipeoffload.planner.stagecosts import LayerCosts, Layout, StageCosts, TrainingSetup, layer_costs, stage_costs

log = logging.getLogger(__name__)

DEFAULT_SCHEDULES = ("1f1b", "zb-h1", "interleaved-1f1b", "group-interleaved", "zb-v", "v-half", "v-min")
# group-interleaved with g = d has interleaved 1F1B's memory and a smaller bubble (split backward), so
# Megatron's interleaved 1F1B is searched by default only in builds without it.
SUPERSEDED = {"interleaved-1f1b": "group-interleaved"}
GIB = 1024**3
BATCH = 2  # candidates taken from the queue at a time; fixed, so results do not depend on ``workers``


class InfeasibleError(ConfigError):
    """No candidate fits; carries the smallest memory any candidate needs and that candidate."""

    def __init__(self, message: str, min_memory: float | None = None, plan: "Plan | None" = None) -> None:
        super().__init__(message)
        self.min_memory = min_memory
        self.plan = plan


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    model: ModelSpec
    hardware: HardwareSpec
    gpus: int
    global_batch: int  # sequences per optimizer step
    memory_budget: float  # bytes per GPU
    host_memory_budget: float | None = None  # pinned host bytes per GPU; None: unlimited
    setup: TrainingSetup = field(default_factory=TrainingSetup)
    schedules: tuple[str, ...] | None = None  # None: the DEFAULT_SCHEDULES this build registers
    tp_sizes: tuple[int, ...] | None = None  # None: divisors of gpus up to gpus_per_node
    pp_sizes: tuple[int, ...] | None = None  # None: every divisor that fits the layers
    stages_per_rank: tuple[int, ...] = (2, 4)  # for the multi-stage families
    offload: tuple[str, ...] | None = None  # None: "none", "first:K" and "all" where supported
    recompute: tuple[str, ...] | None = None
    measured: LayerCosts | None = None  # profiled per-layer costs (valid for tp == 1 only)
    top: int = 5  # how many best plans to guarantee exactly
    prune: bool = True  # skip candidates that provably cannot change the top plans or the frontier
    escalate: bool = True  # try offload, then recompute, only where nothing cheaper of a schedule fits
    exact_frontier: bool = False  # also simulate whatever could join the Pareto frontier (slower)
    workers: int = 1  # worker processes that simulate a batch of candidates in parallel
    best_per_tp: bool = False  # also find the best plan of every TP size exactly (slower)

    def __post_init__(self) -> None:
        for key in ("gpus", "global_batch"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key}={getattr(self, key)!r}: must be >= 1")
        if not self.memory_budget > 0:
            raise ConfigError(f"memory budget {self.memory_budget!r} bytes: must be > 0")
        for name in self.schedules or ():
            get_spec(name)  # unknown names fail here with the list of valid ones

    def families(self) -> tuple[str, ...]:
        if self.schedules is not None:
            return tuple(get_spec(n).name for n in self.schedules)
        known = set(schedule_names())
        return tuple(n for n in DEFAULT_SCHEDULES if n in known and SUPERSEDED.get(n) not in known)


@dataclass(frozen=True)
class MemorySplit:
    """Bytes on the worst rank (the one with the highest total), and pinned host bytes per GPU."""

    parameters: float  # weights + gradients
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

    def sort_key(self) -> tuple:
        return (-round(self.tokens_per_second, 6), round(self.memory.total), str(self.layout), self.choice)

    def as_dict(self) -> dict:
        c = self.choice
        return {
            "layout": {"pp": self.layout.pp, "tp": self.layout.tp, "dp": self.layout.dp},
            "schedule": c.family, "stages_per_rank": c.stages_per_rank, "group_size": c.group_size,
            "offload": c.offload, "recompute": c.recompute, "microbatches": self.microbatches,
            "step_time_s": self.step_time, "pipeline_time_s": self.pipeline_time,
            "dp_sync_time_s": self.dp_sync_time, "tokens_per_s": self.tokens_per_second, "mfu": self.mfu,
            "memory_gib": {"parameters": self.memory.parameters / GIB, "optimizer": self.memory.optimizer / GIB,
                           "activations": self.memory.activations / GIB, "total": self.memory.total / GIB,
                           "host": self.memory.host / GIB},
            "bubble_ratio": self.bubble_ratio, "stall_ratio": self.stall_ratio, "fits": self.fits,
        }


@dataclass
class SearchResult:
    request: PlanRequest
    plans: list[Plan]  # every simulated candidate, best first
    candidates: int  # enumerated
    evaluated: int  # simulated
    seconds: float
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count

    @property
    def fitting(self) -> list[Plan]:
        return [p for p in self.plans if p.fits]

    def best(self, n: int = 5) -> list[Plan]:
        return self.fitting[:n]

    def pareto(self) -> list[Plan]:
        return pareto_front(self.fitting)

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


# ---- enumeration ------------------------------------------------------------------------------
def _divisors(n: int) -> list[int]:
    return [x for x in range(1, n + 1) if n % x == 0]


def layouts(req: PlanRequest, skipped: dict[str, int]) -> list[Layout]:
    """PP x TP x DP splits of the GPUs the model and batch allow, in sorted order."""
    model, hw = req.model, req.hardware
    tps = req.tp_sizes or tuple(t for t in _divisors(req.gpus) if t <= hw.gpus_per_node)
    if req.measured is not None:
        tps = tuple(t for t in tps if t == 1)
    out = []
    for tp in sorted(set(tps)):
        if req.gpus % tp or model.heads % tp or model.num_kv_heads % tp or model.ffn_size % tp:
            skipped[f"tp={tp} does not divide the GPUs/heads/kv heads/ffn"] = skipped.get(
                f"tp={tp} does not divide the GPUs/heads/kv heads/ffn", 0) + 1
            continue
        for pp in req.pp_sizes or _divisors(req.gpus // tp):
            if (req.gpus // tp) % pp or pp > model.layers:
                continue
            dp = req.gpus // (tp * pp)
            if req.global_batch % (dp * model.microbatch):
                _count(skipped, "global batch not divisible by DP x microbatch size")
                continue
            out.append(Layout(pp, tp, dp))
    return out


def choices(req: PlanRequest, d: int, m: int) -> list[ScheduleChoice]:
    """Schedule families, stages per rank, group sizes and memory policies for d ranks, m microbatches."""
    out: list[ScheduleChoice] = []
    for family in req.families():
        if d == 1 and family != "1f1b":
            continue
        if family in ("1f1b", "zb-h1", "zb-h2", "gpipe"):
            vs: tuple[int, ...] = (1,)
        elif family in V_FAMILIES:
            vs = (2,)  # V placement: stages r and 2d-1-r on rank r
        else:
            vs = tuple(v for v in req.stages_per_rank if v >= 2)
        for v in vs:
            if d * v > req.model.layers:
                continue
            if family == "interleaved-1f1b" and m % d:
                continue
            groups: tuple[int | None, ...] = (None,)
            if family == "group-interleaved":
                groups = tuple(sorted({math.ceil(d / 2), d}))
            for g in groups:
                for offload, recompute in _policies(req, v, d):
                    out.append(ScheduleChoice(family, v, g, offload, recompute))
    return out


def _policies(req: PlanRequest, v: int, d: int) -> list[tuple[str, str]]:
    """(offload, recompute) pairs to try, in escalation order (see ``_level``). By default: neither;
    ``offload auto`` (the lowest peak the copy lane can hide: it never makes a backward wait); that
    plus ``recompute auto`` (recompute what could not be hidden); ``recompute first:1`` (the longest-
    lived stage of each rank); and ``recompute first:v`` (every stage)."""
    if d == 1:
        return [("none", "none")]
    supported = lowering_options()
    if req.offload is None and req.recompute is None:
        pairs = [("none", "none")]
        if "offload" in supported:
            pairs += [("auto", "none"), ("auto", "auto")]
        if "recompute" in supported:
            pairs += [("none", f"first:{k}") for k in sorted({1, v})]
        return pairs
    offloads = req.offload or ("none",)
    recomputes = req.recompute or ("none",)
    pairs = [(o, r) for o in offloads for r in recomputes if not (r == "auto" and o == "none")]
    return pairs or [("none", "none")]


def _level(choice: ScheduleChoice) -> int:
    """Escalation level, roughly by growing cost: 0 plain, 1 offload only (free when hidden), 2 recompute
    of the longest-lived stage, 3 recompute of what offload cannot hide, 4 recompute of every stage."""
    if choice.recompute == "none":
        return 0 if choice.offload == "none" else 1
    if choice.recompute == "auto":
        return 3
    return 4 if choice.recompute == f"first:{choice.stages_per_rank}" and choice.stages_per_rank > 1 else 2


def _count(skipped: dict[str, int], reason: str, n: int = 1) -> None:
    skipped[reason] = skipped.get(reason, 0) + n


# ---- evaluation -------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Candidate:
    layout: Layout
    choice: ScheduleChoice
    microbatches: int
    stage: StageCosts
    static_bytes: tuple[float, ...]  # weights + grads + optimizer, per rank
    time_bound: float  # no simulation of this candidate can give a shorter step

    def key(self) -> tuple:
        return (str(self.layout), self.choice)

    def is_base(self) -> bool:
        """No offload and no recompute: the schedule its memory-policy variants are lowered from."""
        return self.choice.offload == "none" and self.choice.recompute == "none"

    def base_key(self) -> tuple:
        return (str(self.layout), replace(self.choice, offload="none", recompute="none"))


def _static(req: PlanRequest, layout: Layout, stage: StageCosts) -> tuple[tuple[float, float], ...]:
    s = req.setup
    shard = layout.dp if s.distributed_optimizer else 1
    return tuple((p * (s.weight_bytes + s.grad_bytes), p * s.optimizer_bytes / shard) for p in stage.params_per_rank)


def enumerate_candidates(req: PlanRequest, skipped: dict[str, int]) -> list[_Candidate]:
    out = []
    per_layer: dict[int, LayerCosts] = {}
    for layout in layouts(req, skipped):
        m = req.global_batch // (layout.dp * req.model.microbatch)
        lc = per_layer.get(layout.tp)
        if lc is None:
            lc = req.measured or layer_costs(req.model, req.hardware, layout.tp,
                                             partial_recompute=req.setup.partial_recompute)
            per_layer[layout.tp] = lc
        stages: dict[tuple, StageCosts] = {}
        for choice in choices(req, layout.pp, m):
            placement = placement_of(choice, layout.pp)
            key = (choice.stages_per_rank, placement)
            if key not in stages:
                stages[key] = stage_costs(lc, req.hardware, layout, choice.stages_per_rank, req.model.layers,
                                          placement)
            sc = stages[key]
            static = tuple(sum(x) for x in _static(req, layout, sc))
            bound = time_lower_bound(choice, layout.pp, m, sc.costs) + _dp_sync_time(
                req, layout, max(sc.params_per_rank))
            out.append(_Candidate(layout, choice, m, sc, static, bound))
    return sorted(out, key=_Candidate.key)


def _dp_sync_time(req: PlanRequest, layout: Layout, params: float) -> float:
    """Gradient reduce (+ parameter all-gather with a distributed optimizer), not overlapped, plus the
    memory-bound optimizer step (~30 bytes of HBM traffic per local parameter)."""
    s, hw, dp = req.setup, req.hardware, layout.dp
    step = params * 30 / (dp if s.distributed_optimizer else 1) / hw.hbm_bandwidth
    if dp == 1:
        return step
    bw = hw.collective_bandwidth(dp, layout.tp * layout.pp)
    if s.distributed_optimizer:
        return step + (dp - 1) / dp * params * (s.grad_bytes + s.weight_bytes) / bw
    return step + 2 * (dp - 1) / dp * params * s.grad_bytes / bw


def evaluate(req: PlanRequest, cand: _Candidate, sim: SimSummary) -> Plan:
    layout, stage = cand.layout, cand.stage
    unit = stage.unit_bytes
    static = _static(req, layout, stage)
    totals = [w + o + sim.peak_units[r] * unit for r, (w, o) in enumerate(static)]
    worst = max(range(layout.pp), key=lambda r: (totals[r], -r))
    host = max(sim.host_units) * unit
    memory = MemorySplit(static[worst][0], static[worst][1], sim.peak_units[worst] * unit, host)
    dp_time = _dp_sync_time(req, layout, max(stage.params_per_rank))
    step = sim.makespan + dp_time
    tokens = req.global_batch * req.model.seq
    flops = req.global_batch / req.model.microbatch * _model_flops(req)
    fits = memory.total <= req.memory_budget and (
        req.host_memory_budget is None or host <= req.host_memory_budget)
    return Plan(layout, cand.choice, cand.microbatches, step, sim.makespan, dp_time, tokens / step,
                flops / (step * layout.gpus * req.hardware.peak_flops), memory, sim.bubble_ratio,
                max(sim.stall) / step if step else 0.0, fits, sim.exact, sim)


def _model_flops(req: PlanRequest) -> float:
    return req.measured.model_flops if req.measured and req.measured.model_flops else \
        req.model.model_flops_per_microbatch()


def find_plans(req: PlanRequest) -> SearchResult:
    """Find the fastest plans that fit ``req.memory_budget``; raise ``InfeasibleError`` if none does.

    Candidates are simulated in order of a lower bound on their step time. Offload and recompute only
    add waits and work to a schedule, so a schedule's offload/recompute variants are queued after the
    plain schedule, bounded by its step time; with ``req.escalate`` only when nothing cheaper of the
    same schedule fits: first the offload variants, then the recompute ones. A candidate is skipped
    when its bound is slower than the top ``req.top`` (and, with ``req.best_per_tp``, than the best
    plan of its TP size), so the Pareto frontier is that of the simulated plans; with
    ``req.exact_frontier`` a candidate is also
    kept while it could join the frontier (no fitting plan that is at least as fast needs no more
    memory than the candidate's weights and optimizer state alone).
    """
    start = time.perf_counter()
    skipped: dict[str, int] = {}
    cands = enumerate_candidates(req, skipped)
    if not cands:
        reasons = "; ".join(f"{k} ({n}x)" for k, n in skipped.items()) or "no PP x TP x DP split of the GPUs"
        raise ConfigError(f"no layout for {req.gpus} GPUs and global batch {req.global_batch}: {reasons}; "
                          "pick a global batch divisible by the data-parallel size x microbatch size")
    search = _Search(req, skipped)
    for cand in cands:
        search.add(cand)
    search.release_orphans()
    by_key = {c.key(): c for c in cands}
    with _pool(req.workers) as pool:
        search.run(pool, batch=BATCH)
        _confirm(req, by_key, search.plans, pool)
    if not any(p.fits for p in search.plans.values()):
        _raise_infeasible(req, cands, search.plans)
    ordered = sorted(search.plans.values(), key=Plan.sort_key)
    elapsed = time.perf_counter() - start
    log.info("planner: %d candidates, %d simulated in %.1fs", len(cands), len(search.plans), elapsed)
    return SearchResult(req, ordered, len(cands), len(search.plans), elapsed, skipped)


class _Search:
    """The priority queue of candidates, the escalation of memory policies, and the pruning state."""

    def __init__(self, req: PlanRequest, skipped: dict[str, int]) -> None:
        self.req, self.skipped = req, skipped
        self.queue: list[tuple[float, tuple, int, _Candidate]] = []
        self.levels: dict[tuple, list[list[_Candidate]]] = {}  # base key -> variants by escalation level
        self.plans: dict[tuple, Plan] = {}
        self.top: list[float] = []  # step times of the fastest fitting plans, at most req.top
        self.best_tp: dict[int, float] = {}  # fastest fitting step time per TP size
        self.front: list[tuple[float, float]] = []  # (memory, step time) of fitting plans
        self.base_time: dict[tuple, float] = {}
        self.base_sim: dict[tuple, SimSummary] = {}
        self.fitted: set[tuple] = set()  # base keys with a fitting plan
        self.pushed = 0

    def add(self, cand: _Candidate) -> None:
        if cand.is_base():
            self._push(cand, cand.time_bound)
        else:
            levels = self.levels.setdefault(cand.base_key(), [[], [], [], []])
            levels[_level(cand.choice) - 1].append(cand)

    def release_orphans(self) -> None:
        """Queue the first variants of schedules whose plain form was not asked for (e.g. --offload auto)."""
        bases = {key for _, key, _, _ in self.queue}
        for base in sorted(set(self.levels) - bases):
            self._release(base)

    def _push(self, cand: _Candidate, bound: float) -> None:
        self.pushed += 1
        heapq.heappush(self.queue, (bound, cand.key(), self.pushed, cand))

    def _release(self, base: tuple) -> None:
        """Queue the next level of memory policies of ``base`` (all of them without escalation)."""
        levels = self.levels.get(base)
        while levels:
            level = levels.pop(0)
            for cand in level:
                self._push(cand, max(cand.time_bound, self.base_time.get(base, 0.0)))
            if self.req.escalate and level:
                break

    def _prunable(self, cand: _Candidate, bound: float) -> bool:
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
            todo: list[_Candidate] = []
            while self.queue and len(todo) < batch:
                bound, _, _, cand = heapq.heappop(self.queue)
                if max(cand.static_bytes) > self.req.memory_budget:
                    _count(self.skipped, "weights + optimizer state alone exceed the budget")
                    self._drop(cand.base_key())
                elif self._prunable(cand, bound):
                    _count(self.skipped, "pruned: its step-time bound cannot make the shown plans")
                    self._drop(cand.base_key())
                else:
                    todo.append(cand)
            jobs = [(self.req, cand, False, self.base_sim.get(cand.base_key())) for cand in todo]
            results = list(pool.map(_run_job, jobs)) if pool is not None and len(todo) > 1 else [
                _run_job(job) for job in jobs]
            for cand, plan in zip(todo, results):
                self._done(cand, plan)
        for base in list(self.levels):
            self._drop(base, reason="not needed: a plan without it fits")

    def _done(self, cand: _Candidate, plan: Plan) -> None:
        base = cand.base_key()
        self.plans[cand.key()] = plan
        if cand.is_base():
            self.base_time[base] = plan.step_time
            self.base_sim[base] = plan.sim
        if plan.fits:
            self._record(plan, base)
        if not (self.req.escalate and base in self.fitted) and not self._pending(base):
            self._release(base)

    def _record(self, plan: Plan, base: tuple) -> None:
        self.fitted.add(base)
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
            _count(self.skipped, reason or "pruned with the schedule they vary", dropped)


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
    return _run(*job)


def _run(req: PlanRequest, cand: _Candidate, exact: bool = False, base: SimSummary | None = None) -> Plan:
    sim = simulate_choice(cand.choice, cand.layout.pp, cand.microbatches, cand.stage.costs,
                          extrapolate=not exact, fallback=cand.choice.periodic(), base=base)
    return evaluate(req, cand, sim)


def _confirm(req: PlanRequest, by_key: dict[tuple, _Candidate], plans: dict[tuple, Plan],
             pool: Executor | None = None) -> None:
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
        results = pool.map(_run_job, jobs) if pool is not None and len(jobs) > 1 else map(_run_job, jobs)
        plans.update(zip(keys, results))


def _host_ok(req: PlanRequest, plan: Plan) -> bool:
    return req.host_memory_budget is None or plan.memory.host <= req.host_memory_budget


def _raise_infeasible(req: PlanRequest, cands: list[_Candidate], plans: dict[tuple, Plan]) -> None:
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
        if cand.key() not in plans:
            plans[cand.key()] = plan = _run(req, cand)
            if _host_ok(req, plan) and better(plan, best):
                best = plan
    if best is None:  # only possible with a host budget
        least = min(plans.values(), key=lambda p: (p.memory.host, p.sort_key()))
        raise InfeasibleError(
            f"no plan keeps pinned host memory within {req.host_memory_budget / GIB:.1f} GiB per GPU "  # type: ignore[operator]
            f"(the least any plan needs is {least.memory.host / GIB:.1f} GiB); raise --host-memory or drop it")
    need = best.memory.total
    hint = "raise --memory or add GPUs" + (
        "" if lowering_options() else " (offload/recompute policies are not available in this build)")
    host = f" within the host budget {req.host_memory_budget / GIB:.1f} GiB" if req.host_memory_budget else ""
    raise InfeasibleError(
        f"no plan fits {req.memory_budget / GIB:.1f} GiB per GPU{host}: the smallest feasible memory is "
        f"{math.ceil(need / GIB * 10) / 10:.1f} GiB ({best.layout} {best.choice.label()}: parameters "
        f"{best.memory.parameters / GIB:.1f} + optimizer {best.memory.optimizer / GIB:.1f} + activations "
        f"{best.memory.activations / GIB:.1f} GiB); {hint}", need, best)
