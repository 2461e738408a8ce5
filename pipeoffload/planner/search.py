"""The planner: enumerate layouts and schedules, simulate each, keep the best that fit the budget.

A candidate is a layout (PP x TP x DP) and a ``ScheduleChoice`` (family, stages per rank, group size,
offload and recompute policy). Its step time is the simulated pipeline makespan plus the data-parallel
gradient sync and the optimizer step; its memory is, on the worst rank, weights + gradients + optimizer
state + the simulated activation peak. Candidates whose weights and optimizer state alone exceed the
budget are not simulated. Everything is enumerated in sorted order, so plans are deterministic.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

from pipeoffload.errors import ConfigError
from pipeoffload.planner.evaluate import (ScheduleChoice, SimSummary, lowering_options, simulate_choice,
                                          time_lower_bound)
from pipeoffload.planner.hardware import HardwareSpec
from pipeoffload.planner.model import ModelSpec
from pipeoffload.schedules import get_spec, schedule_names
from pipeoffload.planner.stagecosts import LayerCosts, Layout, StageCosts, TrainingSetup, layer_costs, stage_costs

log = logging.getLogger(__name__)

DEFAULT_SCHEDULES = ("1f1b", "interleaved-1f1b", "group-interleaved")
GIB = 1024**3


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
        return tuple(n for n in DEFAULT_SCHEDULES if n in known)


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
    extrapolated: bool

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
        """Fitting plans that no other fitting plan beats in both throughput and memory, by memory."""
        front: list[Plan] = []
        for plan in sorted(self.fitting, key=lambda p: (p.memory.total, p.sort_key())):
            if not front or plan.tokens_per_second > front[-1].tokens_per_second * (1 + 1e-9):
                front.append(plan)
        return front

    def best_by_tp(self) -> dict[int, Plan]:
        out: dict[int, Plan] = {}
        for plan in self.fitting:
            out.setdefault(plan.layout.tp, plan)
        return dict(sorted(out.items()))


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
        vs = (1,) if family == "1f1b" else tuple(v for v in req.stages_per_rank if v >= 2)
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
    """(offload, recompute) pairs: neither, or one of them (they act on the same stages)."""
    if d == 1:
        return [("none", "none")]
    supported = lowering_options()
    levels = [f"first:{k}" for k in range(1, v)] + ["all"]
    offloads = req.offload if req.offload is not None else (tuple(levels) if "offload" in supported else ())
    recomputes = req.recompute if req.recompute is not None else (
        tuple(levels) if "recompute" in supported else ())
    pairs = [("none", "none")]
    pairs += [(o, "none") for o in offloads if o != "none"]
    pairs += [("none", r) for r in recomputes if r != "none"]
    return pairs


def _count(skipped: dict[str, int], reason: str) -> None:
    skipped[reason] = skipped.get(reason, 0) + 1


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
        stages: dict[int, StageCosts] = {}
        for choice in choices(req, layout.pp, m):
            v = choice.stages_per_rank
            if v not in stages:
                stages[v] = stage_costs(lc, req.hardware, layout, v, req.model.layers)
            static = tuple(sum(x) for x in _static(req, layout, stages[v]))
            bound = time_lower_bound(choice, layout.pp, m, stages[v].costs) + _dp_sync_time(
                req, layout, max(stages[v].params_per_rank))
            out.append(_Candidate(layout, choice, m, stages[v], static, bound))
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
                max(sim.stall) / step if step else 0.0, fits, sim.extrapolated)


def _model_flops(req: PlanRequest) -> float:
    return req.measured.model_flops if req.measured and req.measured.model_flops else \
        req.model.model_flops_per_microbatch()


def find_plans(req: PlanRequest) -> SearchResult:
    """Find the fastest plans that fit ``req.memory_budget``; raise ``InfeasibleError`` if none does.

    Candidates are simulated in order of a time lower bound. One is skipped (without changing the
    answer) when it can neither enter the top ``req.top`` nor the Pareto frontier: its lower bound is
    slower than the current top-``top`` and than some fitting plan that needs no more memory than its
    weights and optimizer state alone.
    """
    start = time.perf_counter()
    skipped: dict[str, int] = {}
    cands = enumerate_candidates(req, skipped)
    if not cands:
        reasons = "; ".join(f"{k} ({n}x)" for k, n in skipped.items()) or "no PP x TP x DP split of the GPUs"
        raise ConfigError(f"no layout for {req.gpus} GPUs and global batch {req.global_batch}: {reasons}; "
                          "pick a global batch divisible by the data-parallel size x microbatch size")
    plans: dict[tuple, Plan] = {}
    top: list[float] = []  # step times of the fastest fitting plans, ascending, at most req.top
    front: list[tuple[float, float]] = []  # (memory, step time) of fitting plans
    for cand in sorted(cands, key=lambda c: (c.time_bound, c.key())):
        if max(cand.static_bytes) > req.memory_budget:
            _count(skipped, "weights + optimizer state alone exceed the budget")
            continue
        if req.prune and len(top) >= req.top and cand.time_bound > top[-1] and any(
                mem <= max(cand.static_bytes) and t <= cand.time_bound for mem, t in front):
            _count(skipped, "pruned: cannot beat the top plans or the Pareto frontier")
            continue
        plan = plans[cand.key()] = _run(req, cand)
        if plan.fits:
            top = sorted(top + [plan.step_time])[: req.top]
            front.append((plan.memory.total, plan.step_time))
    if not any(p.fits for p in plans.values()):
        _raise_infeasible(req, cands, plans)
    ordered = sorted(plans.values(), key=Plan.sort_key)
    elapsed = time.perf_counter() - start
    log.info("planner: %d candidates, %d simulated in %.1fs", len(cands), len(plans), elapsed)
    return SearchResult(req, ordered, len(cands), len(plans), elapsed, skipped)


def _run(req: PlanRequest, cand: _Candidate) -> Plan:
    sim = simulate_choice(cand.choice, cand.layout.pp, cand.microbatches, cand.stage.costs)
    return evaluate(req, cand, sim)


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
