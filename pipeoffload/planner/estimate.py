"""The cost of one exact layout, no search: "what does my Megatron config do, and what would change?".

``estimate(EstimateRequest) -> Estimate`` builds the same per-stage costs the planner's search builds
(``stagecosts``), simulates the one schedule asked for (``evaluate.simulate_choice``) and splits the
step time into parts that add up to it, measured on the critical rank (the busiest one):

- ``compute``: its F/B/I/W/R work without the tensor-parallel collectives inside it;
- ``tp_comm``: the exposed tensor-parallel collectives of its layers, and of the head and the embedding
  where it holds them (``layertime``); the all-gather after a scattered transfer is in ``pp_comm``;
- ``pp_comm``: what point-to-point transfers add to the pipeline (makespan with them minus without);
- ``bubble``: the rest of the pipeline's idle time on that rank (fill, drain, waits);
- ``offload_stall``: the time its backwards waited for a reload;
- ``dp_sync``: the data-parallel gradient reduce (and parameter all-gather) and the optimizer step.

A layout the planner would refuse for memory still gets an answer, with ``fits`` False. Bad input
(layers not divisible as asked, heads not divisible by TP, a batch not divisible by DP x microbatch
size) raises ``ConfigError`` with one line naming the value, the constraint and the fix.
Pure Python (no torch).
"""
from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from pipeoffload._perf import Memo
from pipeoffload.costs import CostModel
from pipeoffload.errors import ConfigError
from pipeoffload.planner.candidates import dp_sync_time
from pipeoffload.planner.evaluate import ScheduleChoice, SimSummary, build, placement_of, simulate_choice
from pipeoffload.planner.exchange import lockstep_makespan
from pipeoffload.planner.gemm import elementwise_time
from pipeoffload.planner.hardware import GIB, HardwareSpec, check_hardware
from pipeoffload.planner.layertime import embedding_comm, head_comm, layer_times
from pipeoffload.planner.model import ModelSpec, check_model
from pipeoffload.planner.plans import PlanRequest
from pipeoffload.planner.published import mfu_warning
from pipeoffload.planner.search import PROGRESS_AFTER, PROGRESS_EVERY, progress_log
from pipeoffload.planner.split import SPLITS, layer_split
from pipeoffload.planner.stagecosts import (
    LayerCosts,
    Layout,
    StageCosts,
    TrainingSetup,
    head_weight,
    layer_costs,
    stage_costs,
)
from pipeoffload.policies import OffloadPolicy
from pipeoffload.schedules import ScheduleSpec, get_spec

RECOMPUTE_MODES = ("none", "selective", "full")
P2P_MODES = ("eager", "megatron")
GRAD_ACCUMULATION = ("fused", "separate")
ACCUMULATE_BYTES = 6.0  # per weight and microbatch, 2-byte gradients: read the buffer and the new gradient, write


@dataclass(frozen=True, kw_only=True)
class EstimateRequest:
    """One exact training configuration: model, GPU, layout, batch, schedule and memory options.

    ``model.microbatch`` is the microbatch size; ``recompute`` is Megatron's activation
    recomputation (``selective``: the attention core; ``full``: every layer from its input).
    ``memory_budget`` (bytes per GPU) only decides ``fits``; None: 90% of the device's memory, as
    ``plan`` uses by default.
    """

    model: ModelSpec
    hardware: HardwareSpec
    tp: int = 1
    pp: int = 1
    dp: int = 1
    global_batch: int
    schedule: str = "1f1b"
    stages_per_rank: int | None = None  # None: the family's own (2 for interleaved-1f1b, as ``simulate``)
    recompute: str = "none"
    sequence_parallel: bool = True
    distributed_optimizer: bool = False
    offload: str = "none"
    partial_recompute: bool | None = None  # LGD: None = with offload only (as ``plan``)
    memory_budget: float | None = None
    # "eager": sends leave when their data exists (pipeoffload's runtime, the planner's model);
    # "megatron": Megatron-LM's blocking batched exchanges between steps (``exchange.py``)
    p2p: str = "eager"
    split: str = "even"  # "even" (Megatron: layers divisible by the stages) or "balanced" (``split.py``)
    # "fused": weight-gradient GEMMs accumulate into the gradient buffer (Megatron's
    # --gradient-accumulation-fusion); "separate": autograd adds each microbatch's weight gradient to the
    # buffer in an extra pass over the weights (2021 Megatron's F.linear; plain PyTorch)
    grad_accumulation: str = "fused"

    def __post_init__(self) -> None:
        check_model(self.model)
        check_hardware(self.hardware)
        for key in ("tp", "pp", "dp", "global_batch", "stages_per_rank"):
            value = getattr(self, key)
            if key == "stages_per_rank" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{key}={value!r}: must be an integer >= 1")
        if self.recompute not in RECOMPUTE_MODES:
            raise ConfigError(f"recompute {self.recompute!r}: use one of {', '.join(RECOMPUTE_MODES)}")
        if self.memory_budget is not None and not (math.isfinite(self.memory_budget) and self.memory_budget > 0):
            raise ConfigError(f"memory budget {self.memory_budget!r}: must be a finite number of bytes > 0")
        OffloadPolicy.parse(self.offload)  # one line on a malformed policy
        if self.p2p not in P2P_MODES:
            raise ConfigError(f"p2p {self.p2p!r}: use one of {', '.join(P2P_MODES)}")
        if self.p2p == "megatron" and (self.schedule not in ("1f1b", "interleaved-1f1b") or self.offload != "none"):
            raise ConfigError(f"p2p 'megatron' times Megatron's own schedules (1f1b, interleaved-1f1b) without "
                              f"offload, not {self.schedule} with offload {self.offload}; use p2p 'eager'")
        self.check()

    def check(self) -> None:
        """Megatron's constraints on the layout, each as one line with its fix."""
        m, tp = self.model, self.tp
        if m.heads % tp or m.num_kv_heads % tp or m.ffn_size % tp:
            raise ConfigError(f"--tp {tp} must divide the heads ({m.heads}), KV heads ({m.num_kv_heads}) and "
                              f"FFN width ({m.ffn_size}); use a divisor such as 1, 2, 4 or 8")
        if tp > self.hardware.gpus_per_node:
            raise ConfigError(f"--tp {tp} is above the {self.hardware.gpus_per_node} GPUs per node (tensor "
                              "parallelism stays inside a node); use a smaller --tp")
        spec = get_spec(self.schedule)  # an unknown family fails here with the valid names
        v = self.stages_for(spec)
        asked = self.stages_per_rank
        runs = 1 if not spec.interleaved and not spec.fixed_stages_per_rank else v
        if asked is not None and asked != runs and not spec.interleaved:  # never silently another v
            fix = ("use an interleaved family such as interleaved-1f1b, or drop the flag" if runs == 1
                   else f"give {runs} or drop the flag")
            raise ConfigError(f"--stages-per-rank {asked}: schedule {self.schedule} runs {runs} stage(s) per rank; "
                              + fix)
        if spec.interleaved and self.pp == 1:
            raise ConfigError(f"--schedule {spec.name} interleaves stages over the pipeline ranks and needs --pp > 1 "
                              "(at --pp 1 it would be 1F1B); use --schedule 1f1b or a larger --pp")
        if self.recompute == "full" and spec.backward == "split":
            # Megatron's full recomputation keeps one checkpoint per layer until the backward; a split
            # backward's W then needs every layer's linear inputs from I until W (7x a GPT checkpoint),
            # which the checkpoint-sized activation of this model cannot hold: refuse, never under-count
            raise ConfigError(f"--recompute full with --schedule {spec.name} (a split backward) is not modelled: W "
                              "keeps each layer's linear inputs from I to W, more than the checkpoint; use "
                              "--recompute selective or none, or a schedule with a full backward such as 1f1b")
        if self.grad_accumulation not in GRAD_ACCUMULATION:
            raise ConfigError(f"grad accumulation {self.grad_accumulation!r}: use one of {', '.join(GRAD_ACCUMULATION)}")
        if self.split not in SPLITS:
            raise ConfigError(f"split {self.split!r}: use one of {', '.join(SPLITS)}")
        if self.split == "balanced" and m.layers < self.pp * v - 2:
            raise ConfigError(f"--layers {m.layers} cannot fill pp x stages-per-rank = {self.pp} x {v} stages even "
                              "with an embedding-only and a head-only stage; use fewer stages")
        if self.split == "even" and m.layers % (self.pp * v):
            raise ConfigError(f"--layers {m.layers} is not divisible by pp x stages-per-rank = {self.pp} x {v}; "
                              f"pick a layer count divisible by {self.pp * v}, another --pp/--stages-per-rank, "
                              "or --split balanced")
        per_step = self.dp * m.microbatch
        if self.global_batch % per_step:
            raise ConfigError(f"--global-batch {self.global_batch} is not divisible by dp x microbatch size = "
                              f"{self.dp} x {m.microbatch}; use a multiple of {per_step}")
        if spec.name == "interleaved-1f1b" and self.pp > 1 and self.microbatches % self.pp:
            raise ConfigError(f"interleaved-1f1b needs the microbatches ({self.microbatches}) to be a multiple of "
                              f"--pp {self.pp}; change --global-batch or --microbatch-size")

    def stages_for(self, spec: ScheduleSpec | None = None) -> int:
        """Stages per rank: the family's own for fixed placements (V), else the requested v, else the
        family's default (as ``simulate``: 2 for interleaved-1f1b)."""
        spec = spec or get_spec(self.schedule)
        if spec.fixed_stages_per_rank:
            return spec.stages_per_rank
        return self.stages_per_rank if self.stages_per_rank is not None else spec.default_stages_per_rank()

    @property
    def microbatches(self) -> int:
        return self.global_batch // (self.dp * self.model.microbatch)

    @property
    def layout(self) -> Layout:
        return Layout(self.pp, self.tp, self.dp)

    @property
    def setup(self) -> TrainingSetup:
        return TrainingSetup(distributed_optimizer=self.distributed_optimizer,
                             partial_recompute=self.partial_recompute, sequence_parallel=self.sequence_parallel,
                             selective_recompute=self.recompute == "selective")

    @property
    def budget(self) -> float:
        """Bytes per GPU that decide ``fits``: never above the device (as ``plan``)."""
        cap = self.hardware.memory_bytes
        return 0.9 * cap if self.memory_budget is None else min(self.memory_budget, cap)


@dataclass(frozen=True)
class Estimate:
    """Step time, throughput, memory and where the time goes, for one ``EstimateRequest``."""

    request: EstimateRequest
    step_seconds: float
    mfu: float
    tflops_per_gpu: float  # model FLOPs (no recomputation counted) per second per GPU
    tokens_per_second: float
    microbatches: int
    memory_per_rank: tuple[float, ...]  # bytes per pipeline rank: weights, grads, optimizer, activations
    activation_per_rank: tuple[float, ...]
    host_bytes: float  # pinned host memory per GPU (offload)
    fits: bool
    breakdown: dict[str, float]  # seconds on the critical rank; the parts add up to step_seconds
    bubble_ratio: float
    layers_per_stage: tuple[int, ...]
    warnings: tuple[str, ...] = field(default=())
    partial_recompute: bool = False  # LGD partial recomputation applied (what an offload policy implies)
    busy_seconds: tuple[float, ...] = ()  # compute per pipeline rank (the simulation's busy time)

    @property
    def imbalance_ratio(self) -> float:
        """The part of ``bubble_ratio`` that uneven stage loads cause: the ranks' mean shortfall of
        compute against the busiest rank, as a share of the makespan (the rest is the schedule's own
        fill and drain, which even stages also have). 0 when every rank computes the same."""
        busy = self.busy_seconds
        makespan = self.step_seconds - self.breakdown.get("dp_sync", 0.0)
        if not busy or makespan <= 0:
            return 0.0
        return max(0.0, (max(busy) - sum(busy) / len(busy)) / makespan)

    @property
    def memory_worst(self) -> float:
        return max(self.memory_per_rank)

    def as_dict(self) -> dict:
        r = self.request
        return {
            "model": r.model.name, "gpu": r.hardware.name,
            "layout": {"tp": r.tp, "pp": r.pp, "dp": r.dp, "gpus": r.layout.gpus},
            "schedule": r.schedule, "stages_per_rank": r.stages_for(), "microbatch_size": r.model.microbatch,
            "microbatches": self.microbatches, "global_batch": r.global_batch, "seq": r.model.seq,
            "recompute": r.recompute, "partial_recompute": self.partial_recompute,
            "sequence_parallel": r.sequence_parallel, "flash_attention": r.model.flash_attention,
            "distributed_optimizer": r.distributed_optimizer, "offload": r.offload,
            "grad_accumulation": r.grad_accumulation, "p2p": r.p2p,
            "step_seconds": self.step_seconds, "mfu": self.mfu, "tflops_per_gpu": self.tflops_per_gpu,
            "tokens_per_second": self.tokens_per_second,
            "memory_gib": {"per_rank": [x / GIB for x in self.memory_per_rank], "worst": self.memory_worst / GIB,
                           "activations_per_rank": [x / GIB for x in self.activation_per_rank],
                           "host": self.host_bytes / GIB, "budget": r.budget / GIB},
            "fits": self.fits, "bubble_ratio": self.bubble_ratio, "imbalance_ratio": self.imbalance_ratio,
            "breakdown_seconds": dict(self.breakdown),
            "split": r.split, "layers_per_stage": list(self.layers_per_stage), "warnings": list(self.warnings),
        }


def estimate(req: EstimateRequest) -> Estimate:
    """Simulate ``req``'s exact layout and schedule and account for its step time and memory."""
    spec = get_spec(req.schedule)
    v = req.stages_for(spec)
    choice = ScheduleChoice(spec.name, v, None, OffloadPolicy.parse(req.offload))
    lgd = req.setup.lgd_for(choice.offload)
    lc = _layer_costs(req, lgd)
    placement = placement_of(choice, req.pp)
    split = layer_split(req.split, req.model.layers, placement, head_weight(lc))
    sc = stage_costs(lc, req.hardware, req.layout, v, req.model.layers, placement,
                     gather_after_p2p=req.tp > 1 and not req.sequence_parallel, split=split)
    m = req.microbatches
    with progress(f"simulating {spec.name} PP{req.pp} v={v} over {m} microbatches"
                  + (f" with offload {choice.offload} (its copies planned over the whole step)"
                     if choice.offload.kind != "none" else "")):
        sim = _simulate(req, choice, m, sc.costs)
        no_p2p = sim if req.pp == 1 else _simulate(req, _without_copies(req, choice), m,
                                                   replace(sc.costs, p2p_time=0.0))
    plan_req = _plan_request(req)
    dp_time = dp_sync_time(plan_req, req.layout, max(sc.params_per_rank), placement)
    step = sim.makespan + dp_time
    memory, activations = _memory(req, lc, sc, sim)
    model_flops = m * req.dp * _model_flops(req.model)
    gpus = req.layout.gpus
    mfu = model_flops / (step * gpus * req.hardware.peak_flops)
    breakdown = _breakdown(req, lc, sc, sim, no_p2p, dp_time, placement)
    warnings = tuple(w for w in (req.model.params_note, mfu_warning(req.hardware, req.model, mfu),
                                 _budget_warning(req)) if w) + sim.warnings
    return Estimate(
        request=req, step_seconds=step, mfu=mfu, tflops_per_gpu=model_flops / step / gpus / 1e12,
        tokens_per_second=req.global_batch * req.model.seq / step, microbatches=m,
        memory_per_rank=memory, activation_per_rank=activations,
        host_bytes=max(sim.host_units) * sc.unit_bytes, fits=max(memory) <= req.budget * (1 + 1e-12),
        breakdown=breakdown, bubble_ratio=sim.bubble_ratio, layers_per_stage=sc.layers_per_stage,
        warnings=warnings, partial_recompute=lgd, busy_seconds=sim.busy)


def _budget_warning(req: EstimateRequest) -> str | None:
    """A ``memory_budget`` above the device is capped (``budget``), and says so as ``plan`` does."""
    cap = req.hardware.memory_bytes
    if req.memory_budget is None or req.memory_budget <= cap * (1 + 1e-12):
        return None
    return (f"--memory {req.memory_budget / GIB:g} GiB is above the {req.hardware.name}'s {cap / GIB:.2f} GiB; "
            f"fits is checked against {cap / GIB:.2f} GiB (raise it with --hw memory_gib=...)")


@contextmanager
def progress(what: str) -> Iterator[None]:
    """While the block runs, a line on ``planner.progress`` (the logger ``plan``'s search reports on, which
    the CLI shows on stderr) after ``PROGRESS_AFTER`` seconds and every ``PROGRESS_EVERY`` seconds after:
    "estimating: 5 s, <what>". A simulation has no loop of its own to report from (most of an offload
    estimate is one pass planning every copy), so a daemon thread reports; nothing shows for a quick one."""
    done, started = threading.Event(), time.perf_counter()

    def report() -> None:
        wait = PROGRESS_AFTER
        while not done.wait(wait):
            progress_log.info("estimating: %.0f s, %s", time.perf_counter() - started, what)
            wait = PROGRESS_EVERY

    reporter = threading.Thread(target=report, name="pipeoffload-estimate-progress", daemon=True)
    reporter.start()
    try:
        yield
    finally:
        done.set()
        reporter.join()


def _without_copies(req: EstimateRequest, choice: ScheduleChoice) -> ScheduleChoice:
    """The choice whose run without point-to-point time gives ``pp_comm``: with eager transfers, the
    schedule without its offload policy. The offload pass never lengthens the step (its copies never
    delay compute), so the makespan without transfers is the plain schedule's, which extrapolates from a
    few periods; planning the copies of every microbatch a second time for it took half of an offload
    estimate's time (zb-v PP4, 2000 microbatches: ~7 s of ~15 s)."""
    return choice.plain() if req.p2p == "eager" else choice


def _simulate(req: EstimateRequest, choice: ScheduleChoice, m: int, costs: CostModel) -> SimSummary:
    if req.p2p == "eager" or req.pp == 1:
        return simulate_choice(choice, req.pp, m, costs, extrapolate=choice.periodic(), fallback=True)
    memo = Memo()  # the schedule built here is the one simulate_choice generates and lowers again
    schedule = build(choice, req.pp, m, costs, memo)
    makespan, busy = lockstep_makespan(schedule, costs, interleaved=choice.family != "1f1b")
    plain = simulate_choice(choice, req.pp, m, costs, extrapolate=choice.periodic(), fallback=True, memo=memo)
    return replace(plain, makespan=makespan, busy=busy, extrapolated=False)


def _model_flops(model: ModelSpec) -> float:
    return model.model_flops_per_microbatch()


def _plan_request(req: EstimateRequest) -> PlanRequest:
    """The ``PlanRequest`` whose data-parallel accounting (``dp_sync_time``) ``estimate`` shares."""
    return PlanRequest(model=req.model, hardware=req.hardware, gpus=req.layout.gpus,
                       global_batch=req.global_batch, memory_budget=req.budget,
                       setup=req.setup)


def _layer_costs(req: EstimateRequest, lgd: bool) -> LayerCosts:
    """One layer's costs; with full recomputation the backward re-runs the forward first and only the
    layer's input (the checkpoint) is kept per microbatch."""
    lc = layer_costs(req.model, req.hardware, req.tp, partial_recompute=lgd,
                     sequence_parallel=req.sequence_parallel, selective_recompute=req.recompute == "selective")
    if req.grad_accumulation == "separate" and req.microbatches > 1:
        lc = _separate_accumulation(lc, req.hardware)
    if req.recompute != "full":
        return lc
    checkpoint = req.model.boundary_bytes(req.tp if req.sequence_parallel else 1)
    b = lc.time_b if lc.time_b is not None else lc.time_i + lc.time_w
    return replace(lc, time_b=b + lc.time_f, time_i=lc.time_i + lc.time_f, activation_bytes=checkpoint)


def _separate_accumulation(lc: LayerCosts, hw: HardwareSpec) -> LayerCosts:
    """Every backward adds its weight gradients to the buffer in a memory-bound pass over the weights."""
    layer = elementwise_time(hw, lc.params * ACCUMULATE_BYTES)
    head = elementwise_time(hw, lc.head_params * ACCUMULATE_BYTES)
    hf, hi, hw_ = lc.head_time
    b = lc.time_b if lc.time_b is not None else lc.time_i + lc.time_w
    head_b = lc.head_time_b if lc.head_time_b is not None else hi + hw_
    return replace(lc, time_w=lc.time_w + layer, time_b=b + layer, head_time=(hf, hi, hw_ + head),
                   head_time_b=head_b + head)


def _transient(req: EstimateRequest) -> float:
    """Full recomputation rebuilds one layer's activations at a time in backward: working memory on
    top of the checkpoints (the layer's whole activation for one microbatch)."""
    if req.recompute != "full":
        return 0.0
    return layer_costs(req.model, req.hardware, req.tp, sequence_parallel=req.sequence_parallel).activation_bytes


def _memory(req: EstimateRequest, lc: LayerCosts, sc: StageCosts,
            sim: SimSummary) -> tuple[tuple[float, ...], tuple[float, ...]]:
    s = req.setup
    shard = req.dp if s.distributed_optimizer else 1
    transient = _transient(req)
    acts = tuple(u * sc.unit_bytes + transient for u in sim.peak_units)
    total = tuple(p * (s.weight_bytes + s.grad_bytes) + p * s.optimizer_bytes / shard + a
                  for p, a in zip(sc.params_per_rank, acts))
    return total, acts


def _breakdown(req: EstimateRequest, lc: LayerCosts, sc: StageCosts, sim: SimSummary, no_p2p: SimSummary,
               dp_time: float, placement: object) -> dict[str, float]:
    """Seconds on the busiest rank, adding up to the step time (see the module docstring)."""
    rank = max(range(req.pp), key=lambda r: (sim.busy[r], -r))
    stages = placement.stages_of(rank)  # type: ignore[attr-defined]
    layers = sum(sc.layers_per_stage[s] for s in stages)
    t = layer_times(req.model, req.hardware, req.tp, sequence_parallel=req.sequence_parallel)
    split = get_spec(req.schedule).backward == "split"
    per_layer = t.detail["comm_f"] * (2 if req.recompute == "full" else 1) + (
        t.detail["comm_i"] + t.detail["comm_w"] if split else t.detail["comm_b"])
    per_microbatch = per_layer * layers + _outside_layers_comm(req, stages, len(sc.layers_per_stage))
    tp_comm = min(sim.busy[rank], per_microbatch * req.microbatches)
    pp_comm = max(0.0, sim.makespan - no_p2p.makespan)
    stall = sim.stall[rank]
    bubble = max(0.0, sim.makespan - pp_comm - sim.busy[rank] - stall)
    compute = sim.makespan - pp_comm - bubble - stall - tp_comm
    return {"compute": compute, "bubble": bubble, "tp_comm": tp_comm, "pp_comm": pp_comm,
            "offload_stall": stall, "dp_sync": dp_time}


def _outside_layers_comm(req: EstimateRequest, stages: object, n_stages: int) -> float:
    """Per microbatch, the collectives of the head (last stage) and the embedding (first stage) among
    ``stages``: neither is recomputed, and their backward collectives are the same whole or split."""
    kw = {"sequence_parallel": req.sequence_parallel}
    held = set(stages)  # type: ignore[call-overload]
    head = sum(head_comm(req.model, req.hardware, req.tp, **kw)) if n_stages - 1 in held else 0.0
    return head + (sum(embedding_comm(req.model, req.hardware, req.tp, **kw)) if 0 in held else 0.0)


def check_total(e: Estimate) -> float:
    """The breakdown's sum minus the step time (zero up to float noise; tests use it)."""
    return math.fsum(e.breakdown.values()) - e.step_seconds
