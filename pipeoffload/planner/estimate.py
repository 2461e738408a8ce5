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

A recompute policy's recomputation (R actions) is in ``compute``, the TP collectives of its forwards
included. Every row ``plan`` prints is one request here: its layer split (``split.py``, the same
function), group size, memory policies (``recompute_policy``, ``max_stall``, ``offload="budget"``: the
target the memory budget leaves) planned as the search plans them (``candidates.planned_choice``).

A layout the planner would refuse for memory still gets an answer, with ``fits`` False. Bad input
(fewer layers than stages to split them over, heads not divisible by TP, a batch not divisible by DP x
microbatch size) raises ``ConfigError`` with one line naming the value, the constraint and the fix.
Pure Python (no torch).
"""
from __future__ import annotations

import math
import numbers
import re
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from pipeoffload._perf import Memo
from pipeoffload.costs import CostModel
from pipeoffload.errors import FIELDS, ConfigError, Naming, Worded, in_words
from pipeoffload.planner.candidates import BUDGET_FROM_MEMORY, dp_sync_time, planned_choice, static_split
from pipeoffload.planner.evaluate import ScheduleChoice, SimSummary, build, placement_of, simulate_choice
from pipeoffload.planner.exchange import lockstep_makespan, megatron_order
from pipeoffload.planner.gemm import elementwise_time
from pipeoffload.planner.hardware import GIB, HardwareSpec, check_hardware
from pipeoffload.planner.layertime import embedding_comm, head_comm, layer_times
from pipeoffload.planner.model import ModelSpec, check_model
from pipeoffload.planner.plans import PlanRequest, capped_note
from pipeoffload.planner.published import mfu_warning
from pipeoffload.planner.search import PROGRESS_AFTER, PROGRESS_EVERY, progress_log
from pipeoffload.planner.split import SPLITS, layer_split, most_stages
from pipeoffload.planner.stagecosts import (
    HOST_LINK_MODES,
    LayerCosts,
    Layout,
    StageCosts,
    TrainingSetup,
    head_weight,
    layer_costs,
    stage_costs,
)
from pipeoffload.policies import OffloadPolicy, RecomputePolicy, check_booleans
from pipeoffload.readonly import ReadOnlyDict
from pipeoffload.schedules import ScheduleSpec, get_spec, schedule_names
from pipeoffload.simulator import simulate

RECOMPUTE_MODES = ("none", "selective", "full")  # Megatron's; pipeoffload's policies are ``recompute_policy``
RECOMPUTE_POLICY_FORMS = "none, first:K (K >= 1), all or auto"
P2P_MODES = ("eager", "megatron")
GRAD_ACCUMULATION = ("fused", "separate")
ACCUMULATE_BYTES = 6.0  # per weight and microbatch, 2-byte gradients: read the buffer and the new gradient, write


@dataclass(frozen=True, kw_only=True)
class EstimateRequest:
    """One exact training configuration: model, GPU, layout, batch, schedule and memory options.

    ``model.microbatch`` is the microbatch size; ``recompute`` is Megatron's activation
    recomputation (``selective``: the attention core; ``full``: every layer from its input), which
    changes the layers' costs; ``recompute_policy`` is pipeoffload's (``first:K``, ``all``, ``auto``:
    which stages' activations the schedule drops and re-creates with R actions, ``plan``'s recompute
    column), a pass over the schedule. The two combine (``plan --recompute selective`` rows).
    ``memory_budget`` (bytes per GPU) decides ``fits`` and the target of ``offload="budget"``; None: 90%
    of the device's memory, as ``plan`` uses by default.
    """

    model: ModelSpec
    hardware: HardwareSpec
    tp: int = 1
    pp: int = 1
    dp: int = 1
    global_batch: int
    schedule: str = "1f1b"
    stages_per_rank: int | None = None  # None: the family's own (2 for interleaved-1f1b, as ``simulate``)
    group_size: int | None = None  # g of a family that has one; None: its own (ceil(PP/2) for group-interleaved)
    recompute: str = "none"
    recompute_policy: str = "none"  # pipeoffload's: none, first:K, all, auto (``policies.RecomputePolicy``)
    sequence_parallel: bool = True
    distributed_optimizer: bool = False
    # an offload policy (``policies.OffloadPolicy``), or "budget": the target the memory budget leaves
    # for activations on the fullest rank, as ``plan`` fills it (its rows print that target in GiB)
    offload: str = "none"
    max_stall: float = 0.0  # percent the offload copies may lengthen the step for a lower peak (as ``plan``)
    partial_recompute: bool | None = None  # LGD: None = with offload only (as ``plan``)
    host_link: str = "private"  # PCIe pair sharing: private | alternating | serialized (``stagecosts``)
    memory_budget: float | None = None
    # "eager": sends leave when their data exists (pipeoffload's runtime, the planner's model);
    # "megatron": Megatron-LM's blocking batched exchanges between steps (``exchange.py``)
    p2p: str = "eager"
    # "even" (as even as possible, the remainder on the earliest stages) or "balanced" (``split.py``)
    split: str = "even"
    layers_per_stage: tuple[int, ...] | None = None  # an explicit split (``plan --emit``'s layers_per_stage)
    # "fused": weight-gradient GEMMs accumulate into the gradient buffer (Megatron's
    # --gradient-accumulation-fusion); "separate": autograd adds each microbatch's weight gradient to the
    # buffer in an extra pass over the weights (2021 Megatron's F.linear; plain PyTorch)
    grad_accumulation: str = "fused"

    def __post_init__(self) -> None:
        if isinstance(self.layers_per_stage, list):  # kept as a tuple: the request stays hashable
            object.__setattr__(self, "layers_per_stage", tuple(self.layers_per_stage))
        check_model(self.model)
        check_hardware(self.hardware)
        for key in ("tp", "pp", "dp", "global_batch", "stages_per_rank"):
            value = getattr(self, key)
            if key == "stages_per_rank" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{key}={value!r}: must be an integer >= 1")
        if self.recompute not in RECOMPUTE_MODES:
            _refuse_policy_as_recompute(self.recompute)
            raise ConfigError(f"recompute {self.recompute!r}: use one of {', '.join(RECOMPUTE_MODES)}")
        check_booleans(self, "sequence_parallel", "distributed_optimizer", optional=("partial_recompute",))
        if self.memory_budget is not None and (isinstance(self.memory_budget, bool)
                                               or not isinstance(self.memory_budget, numbers.Real)):
            raise ConfigError(f"memory_budget={self.memory_budget!r}: must be a number of bytes per GPU "
                              "(40 GiB is 40 * 2**30)")  # as PlanRequest's
        if self.memory_budget is not None and not (math.isfinite(self.memory_budget) and self.memory_budget > 0):
            raise ConfigError(f"memory budget {self.memory_budget!r}: must be a finite number of bytes > 0")
        self._check_policies()
        if self.host_link not in HOST_LINK_MODES:
            raise ConfigError(f"host link {self.host_link!r}: use one of {', '.join(HOST_LINK_MODES)}")
        if self.p2p not in P2P_MODES:
            raise ConfigError(f"p2p {self.p2p!r}: use one of {', '.join(P2P_MODES)}")
        if self.p2p == "megatron" and (self.schedule not in ("1f1b", "interleaved-1f1b") or self.offload != "none"
                                       or self.recompute_policy != "none"):
            raise ConfigError.named(lambda n: (
                f"{n.given('p2p', 'megatron')} times Megatron's own schedules (1f1b, interleaved-1f1b) without "
                f"offload or a recompute policy, not {n.given('schedule', self.schedule)} with "
                f"{n.given('offload', self.offload)} and {n.given('recompute_policy', self.recompute_policy)}; "
                f"use {n.given('p2p', 'eager')}"))
        self.check()

    def _check_policies(self) -> None:
        """The memory policies, each refusal one line naming the fields (the command line: its flags)."""
        if re.fullmatch(r"\s*([a-z0-9:.]+)\s*\+\s*([0-9.]+)\s*%\s*", str(self.offload), re.IGNORECASE):
            policy, pct = re.split(r"\+", str(self.offload).strip().rstrip("%"), maxsplit=1)
            raise ConfigError.named(lambda n: f"{n.given('offload', self.offload)}: write the stall budget as "
                                    f"{n.given('offload', policy.strip())} {n.given('max_stall', pct.strip())} "
                                    "(plan's offload column prints them joined)")
        if self.offload_text != "budget":
            OffloadPolicy.parse(self.offload)  # one line on a malformed policy
        _refuse_partial("recompute_policy", self.recompute_policy, RECOMPUTE_POLICY_FORMS)
        stall = self.max_stall
        if isinstance(stall, bool) or not isinstance(stall, (int, float)) or not (math.isfinite(stall) and stall >= 0):
            raise ConfigError.named(lambda n: f"{n.given('max_stall', repr(stall))}: must be a finite percentage "
                                    ">= 0 (e.g. 5 for 5 %)")
        offload, recompute = self.offload_text, RecomputePolicy.parse(self.recompute_policy)
        if stall > 0 and offload == "none":
            raise ConfigError.named(lambda n: f"{n.given('max_stall', f'{stall:g}')} lets offload copies stall, but "
                                    f"{n('offload')} is none: give an offload policy (e.g. {n.given('offload', 'auto')}) "
                                    f"or leave {n('max_stall')} out")
        if recompute.kind == "auto" and offload == "none":
            raise ConfigError.named(lambda n: f"{n.given('recompute_policy', 'auto')} recomputes what the offload "
                                    f"policy could not move: give {n.given('offload', 'auto')}, budget or budget:X "
                                    f"too, or use {n.given('recompute_policy', 'first:K')}")
        if recompute.kind == "auto" and stall > 0:
            raise ConfigError.named(lambda n: f"{n.given('max_stall', f'{stall:g}')} with "
                                    f"{n.given('recompute_policy', 'auto')}: both deal with what the copy lane cannot "
                                    "hide (plan never combines them); use one of them")
        if self.recompute == "full" and recompute.kind != "none":
            raise ConfigError.named(lambda n: f"{n.given('recompute', 'full')} with "
                                    f"{n.given('recompute_policy', recompute)}: Megatron's full recomputation already "
                                    "re-runs every layer from its checkpoint, and a policy's recomputation on top of "
                                    f"it is not modelled; use {n.given('recompute', 'none')} or selective with the "
                                    "policy")

    @property
    def offload_text(self) -> str:
        return str(self.offload).strip().lower()

    def check(self) -> None:
        """Megatron's constraints on the layout, each as one line with its fix."""
        m, tp = self.model, self.tp
        per_node = self.hardware.gpus_per_node
        if m.heads % tp or m.num_kv_heads % tp or m.ffn_size % tp:
            raise ConfigError.named(lambda n: f"{n.given('tp', tp)} must divide the heads ({m.heads}), KV heads "
                                    f"({m.num_kv_heads}) and FFN width ({m.ffn_size}); use "
                                    f"{n.given('tp', m.tp_sizes(per_node))}")
        if tp > per_node:
            raise ConfigError.named(lambda n: f"{n.given('tp', tp)} is above the {per_node} GPUs per node (tensor "
                                    f"parallelism stays inside a node); use a smaller {n('tp')}")
        spec = get_spec(self.schedule)  # an unknown family fails here with the valid names
        v = self.stages_for(spec)
        self._check_group_size(spec)
        asked = self.stages_per_rank
        runs = 1 if not spec.interleaved and not spec.fixed_stages_per_rank else v
        if asked is not None and asked != runs and not spec.interleaved:  # never silently another v
            fix = ("use an interleaved family such as interleaved-1f1b, or " if runs == 1 else f"give {runs} or ")
            raise ConfigError.named(lambda n: f"{n.given('stages_per_rank', asked)}: schedule {self.schedule} runs "
                                    f"{runs} stage(s) per rank; {fix}{_drop(n, 'stages_per_rank')}")
        if spec.interleaved and self.pp == 1:
            raise ConfigError.named(lambda n: f"{n.given('schedule', spec.name)} interleaves stages over the pipeline "
                                    f"ranks and needs {n('pp')} > 1 (at {n.given('pp', 1)} it would be 1F1B); use "
                                    f"{n.given('schedule', '1f1b')} or a larger {n('pp')}")
        if self.recompute == "full" and spec.backward == "split":
            # Megatron's full recomputation keeps one checkpoint per layer until the backward; a split
            # backward's W then needs every layer's linear inputs from I until W (7x a GPT checkpoint),
            # which the checkpoint-sized activation of this model cannot hold: refuse, never under-count
            raise ConfigError.named(lambda n: f"{n.given('recompute', 'full')} with {n.given('schedule', spec.name)} "
                                    "(a split backward) is not modelled: W keeps each layer's linear inputs from I to "
                                    f"W, more than the checkpoint; use {n.given('recompute', 'selective')} or none, or "
                                    "a schedule with a full backward such as 1f1b")
        if self.grad_accumulation not in GRAD_ACCUMULATION:
            raise ConfigError(f"grad accumulation {self.grad_accumulation!r}: use one of {', '.join(GRAD_ACCUMULATION)}")
        if self.split not in SPLITS:
            raise ConfigError(f"split {self.split!r}: use one of {', '.join(SPLITS)}")
        stages = self.pp * v
        if self.layers_per_stage is not None:
            self._check_layers_per_stage(stages, v)
        elif self.split == "balanced" and m.layers < stages - 2:
            raise ConfigError.named(lambda n: f"{n.given('model.layers', m.layers)} cannot fill pp x stages-per-rank "
                                    f"= {self.pp} x {v} stages even with an embedding-only and a head-only stage; use "
                                    "fewer stages")
        elif stages > most_stages(self.split, m.layers):  # the even split (``split.even_split``)
            balanced = stages <= most_stages("balanced", m.layers)
            raise ConfigError.named(lambda n: f"{n.given('model.layers', m.layers)} cannot give each of pp x "
                                    f"stages-per-rank = {self.pp} x {v} stages a layer ({n.given('split', 'even')}); "
                                    "use fewer stages" + (f" or {n.given('split', 'balanced')} (its first and last "
                                    "stage may hold only the embedding and the head)" if balanced else ""))
        per_step = self.dp * m.microbatch
        if self.global_batch % per_step:
            raise ConfigError.named(lambda n: f"{n.given('global_batch', self.global_batch)} is not divisible by dp x "
                                    f"microbatch size = {self.dp} x {m.microbatch}; use a multiple of {per_step}")
        if spec.name == "interleaved-1f1b" and self.pp > 1 and self.microbatches % self.pp:
            raise ConfigError.named(lambda n: f"interleaved-1f1b needs the microbatches ({self.microbatches}) to be a "
                                    f"multiple of {n.given('pp', self.pp)}; change {n('global_batch')} or "
                                    f"{n('model.microbatch')}")

    def _check_group_size(self, spec: ScheduleSpec) -> None:
        g = self.group_size
        if g is None:
            return
        if isinstance(g, bool) or not isinstance(g, int):
            raise ConfigError.named(lambda n: f"{n.given('group_size', repr(g))}: must be an integer >= 1")
        if "group_size" not in spec.options:
            grouped = ", ".join(n for n in schedule_names() if "group_size" in get_spec(n).options)
            raise ConfigError.named(lambda n: f"{n.given('group_size', g)}: schedule {spec.name} has no group size "
                                    f"(only {grouped} has one); {_drop(n, 'group_size')}")
        if not 1 <= g <= self.pp:
            raise ConfigError.named(lambda n: f"{n.given('group_size', g)}: must be in 1..pp = 1..{self.pp} "
                                    "(ceil(PP/2) for the least memory, PP for the smallest bubble)")

    def _check_layers_per_stage(self, stages: int, v: int) -> None:
        split, layers = self.layers_per_stage, self.model.layers
        if isinstance(split, (str, bytes)) or not isinstance(split, (tuple, list)) or not all(
                isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in split):
            raise ConfigError(f"layers_per_stage={split!r}: give a tuple of layer counts >= 0, e.g. (3, 3, 2, 2)")
        shown = tuple(split)  # a tuple: (3, 3, 2) as a field, 3,3,2 as the flag
        if self.split == "balanced":
            raise ConfigError.named(lambda n: f"{n('layers_per_stage')} with {n.given('split', 'balanced')}: give one "
                                    "of them (an explicit split replaces the computed one)")
        if len(split) != stages:
            raise ConfigError.named(lambda n: f"{n.given('layers_per_stage', shown)}: needs {stages} stages (pp x "
                                    f"stages-per-rank = {self.pp} x {v}), one count each; got {len(split)}")
        if sum(split) != layers:
            raise ConfigError.named(lambda n: f"{n.given('layers_per_stage', shown)}: holds {sum(split)} layers, the "
                                    f"model has {layers}; give counts that add up to {layers}")
        if min(split[1:-1], default=1) < 1:
            raise ConfigError.named(lambda n: f"{n.given('layers_per_stage', shown)}: every stage but the first and "
                                    "the last needs a layer (the first may hold only the embedding, the last only "
                                    "the head)")

    def group_for(self, spec: ScheduleSpec | None = None) -> int | None:
        """The group size simulated: the one asked, else the family's own (its lowest-memory one, which
        its generator takes by default: ceil(PP/2) for group-interleaved); None for a family without one."""
        spec = spec or get_spec(self.schedule)
        if "group_size" not in spec.options:
            return None
        return self.group_size if self.group_size is not None else spec.group_sizes(self.pp)[0]

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
                             selective_recompute=self.recompute == "selective", host_link=self.host_link)

    def choice(self) -> ScheduleChoice:
        """The schedule choice asked for, before a layout plans its policies (``planned_choice``)."""
        spec = get_spec(self.schedule)
        policy = BUDGET_FROM_MEMORY if self.offload_text == "budget" else OffloadPolicy.parse(self.offload)
        offload = replace(policy, max_stall=float(self.max_stall))  # a budget's target: ``planned_choice``
        return ScheduleChoice(spec.name, self.stages_for(spec), self.group_for(spec), offload,
                              RecomputePolicy.parse(self.recompute_policy))

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
    breakdown: Mapping[str, float]  # seconds on the critical rank, the parts add up to step_seconds; read-only
    bubble_ratio: float
    layers_per_stage: tuple[int, ...]
    warnings: tuple[str, ...] = field(default=())
    partial_recompute: bool = False  # LGD partial recomputation applied (what an offload policy implies)
    # busy time per pipeline rank (the simulation's): its compute, recomputation included, with the TP
    # collectives inside its layers (the breakdown's ``compute`` plus ``tp_comm`` on the busiest rank)
    busy_seconds: tuple[float, ...] = ()
    choice: ScheduleChoice | None = None  # the schedule and policies simulated (g, a budget's target)
    unit_bytes: float = 0.0  # bytes of one activation unit (a ``budget:X`` target is X of them)

    def __post_init__(self) -> None:
        if not isinstance(self.breakdown, ReadOnlyDict):  # a dict given stays the caller's; this keeps a copy
            object.__setattr__(self, "breakdown", ReadOnlyDict(self.breakdown))

    @property
    def imbalance_ratio(self) -> float:
        """The part of ``bubble_ratio`` that uneven stage loads cause: the ranks' mean shortfall of busy
        time (``busy_seconds``) against the busiest rank, as a share of the makespan (the rest is the
        schedule's own fill and drain, which even stages also have). 0 when every rank is as busy."""
        busy = self.busy_seconds
        makespan = self.step_seconds - self.breakdown.get("dp_sync", 0.0)
        if not busy or makespan <= 0:
            return 0.0
        return max(0.0, (max(busy) - sum(busy) / len(busy)) / makespan)

    @property
    def memory_worst(self) -> float:
        return max(self.memory_per_rank)

    @property
    def planned(self) -> ScheduleChoice:
        """The choice simulated (the request's, its policies planned for the layout)."""
        return self.choice if self.choice is not None else self.request.choice()

    def as_dict(self, naming: Naming = FIELDS) -> dict:
        """The object ``estimate --json`` prints (``naming``: ``FLAGS``; its warnings name what was set so)."""
        r, c = self.request, self.planned
        return {
            "model": r.model.name, "params": r.model.total_params(), "params_exact": not r.model.params_note,
            "gpu": r.hardware.name,
            "layout": {"tp": r.tp, "pp": r.pp, "dp": r.dp, "gpus": r.layout.gpus},
            "schedule": r.schedule, "stages_per_rank": r.stages_for(), "group_size": c.group_size,
            "microbatch_size": r.model.microbatch,
            "microbatches": self.microbatches, "global_batch": r.global_batch, "seq": r.model.seq,
            "recompute": r.recompute, "recompute_policy": str(c.recompute), "partial_recompute": self.partial_recompute,
            "sequence_parallel": r.sequence_parallel, "flash_attention": r.model.flash_attention,
            "distributed_optimizer": r.distributed_optimizer, "offload": str(c.offload),
            "max_stall": c.offload.max_stall, "host_link": r.host_link,
            "grad_accumulation": r.grad_accumulation, "p2p": r.p2p,
            "step_seconds": self.step_seconds, "mfu": self.mfu, "tflops_per_gpu": self.tflops_per_gpu,
            "tokens_per_second": self.tokens_per_second,
            "memory_gib": {"per_rank": [x / GIB for x in self.memory_per_rank], "worst": self.memory_worst / GIB,
                           "activations_per_rank": [x / GIB for x in self.activation_per_rank],
                           "host": self.host_bytes / GIB, "budget": r.budget / GIB},
            "fits": self.fits, "bubble_ratio": self.bubble_ratio, "imbalance_ratio": self.imbalance_ratio,
            "breakdown_seconds": dict(self.breakdown),
            "split": "given" if r.layers_per_stage is not None else r.split,
            "layers_per_stage": list(self.layers_per_stage),
            "warnings": [in_words(w, naming) for w in self.warnings],
        }


def estimate(req: EstimateRequest) -> Estimate:
    """Simulate ``req``'s exact layout and schedule and account for its step time and memory."""
    choice = req.choice()
    v = choice.stages_per_rank
    lgd = req.setup.lgd_for(choice.offload)
    lc = _layer_costs(req, lgd)
    placement = placement_of(choice, req.pp)
    split = req.layers_per_stage or layer_split(req.split, req.model.layers, placement, head_weight(lc))
    sc = stage_costs(lc, req.hardware, req.layout, v, req.model.layers, placement, host_link=req.host_link,
                     gather_after_p2p=req.tp > 1 and not req.sequence_parallel, split=tuple(split))
    plan_req = _plan_request(req)
    # the policies as plan's search plans them on this layout: a budget's target, the ranks' offsets
    choice = planned_choice(plan_req, choice, sc, tuple(sum(x) for x in static_split(plan_req, req.layout, sc)))
    m = req.microbatches
    with progress(f"simulating {choice.family} PP{req.pp} v={v}"
                  + (f" g={choice.group_size}" if choice.group_size is not None else "") + f" over {m} microbatches"
                  + (f" with offload {choice.offload} (its copies planned over the whole step)"
                     if choice.offload.kind != "none" else "")):
        sim = _simulate(req, choice, m, sc.costs)
        no_p2p = sim if req.pp == 1 else _simulate(req, _without_copies(req, choice), m,
                                                   replace(sc.costs, p2p_time=0.0))
    dp_time = dp_sync_time(plan_req, req.layout, max(sc.params_per_rank), placement)
    step = sim.makespan + dp_time
    memory, activations = _memory(req, lc, sc, sim)
    model_flops = m * req.dp * _model_flops(req.model)
    gpus = req.layout.gpus
    mfu = model_flops / (step * gpus * req.hardware.peak_flops)
    breakdown = _breakdown(req, lc, sc, sim, no_p2p, dp_time, placement)
    warnings = tuple(req.model.notes()) + tuple(w for w in (mfu_warning(req.hardware, req.model, mfu),
                                                            _budget_warning(req)) if w) + sim.warnings
    return Estimate(
        request=req, step_seconds=step, mfu=mfu, tflops_per_gpu=model_flops / step / gpus / 1e12,
        tokens_per_second=req.global_batch * req.model.seq / step, microbatches=m,
        memory_per_rank=memory, activation_per_rank=activations,
        host_bytes=max(sim.host_units) * sc.unit_bytes, fits=max(memory) <= req.budget * (1 + 1e-12),
        breakdown=breakdown, bubble_ratio=sim.bubble_ratio, layers_per_stage=sc.layers_per_stage,
        warnings=warnings, partial_recompute=lgd, busy_seconds=sim.busy, choice=choice,
        unit_bytes=sc.unit_bytes)


def _budget_warning(req: EstimateRequest) -> Worded | None:
    """A ``memory_budget`` above the device is capped (``budget``), and says so as ``plan`` does; one that
    reads as the device's memory in GiB was most likely meant in GiB (it is in bytes), as ``plan`` hints."""
    cap, asked = req.hardware.memory_bytes, req.memory_budget
    if asked is not None and asked * GIB <= cap:
        return Worded.named(lambda n: f"{n.given('memory_budget', f'{asked:g}')} is {asked:g} bytes, so nothing "
                            f"fits: {n('memory_budget')} is in bytes ({asked:g} GiB is {asked:g} * 2**30)")
    if asked is None or asked <= cap * (1 + 1e-12):
        return None
    return Worded.named(lambda n: capped_note(n, "memory_budget", asked, req.hardware, cap, "fits is"))


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
    """The choice whose run without point-to-point time gives ``pp_comm``: with eager transfers and no
    other policy, the schedule without its offload policy. The offload pass never lengthens the step
    (its copies never delay compute), so the makespan without transfers is the plain schedule's, which
    extrapolates from a few periods; planning the copies of every microbatch a second time for it took
    half of an offload estimate's time (zb-v PP4, 2000 microbatches: ~7 s of ~15 s). A recompute policy
    (its R actions are compute) and a stall budget (its copies may delay compute) are kept."""
    if req.p2p != "eager" or choice.recompute != RecomputePolicy() or choice.offload.max_stall > 0:
        return choice
    return choice.plain()


def _simulate(req: EstimateRequest, choice: ScheduleChoice, m: int, costs: CostModel) -> SimSummary:
    if req.p2p == "eager" or req.pp == 1:
        return simulate_choice(choice, req.pp, m, costs, extrapolate=choice.periodic(), fallback=True)
    memo = Memo()  # the schedule built here is the one simulate_choice generates and lowers again
    interleaved = choice.family != "1f1b"
    built = build(choice, req.pp, m, costs, memo)
    schedule = megatron_order(built, interleaved)
    makespan, busy = lockstep_makespan(schedule, costs, interleaved=interleaved)
    plain = simulate_choice(choice, req.pp, m, costs, extrapolate=choice.periodic(), fallback=True, memo=memo)
    if schedule is not built:  # Megatron's own order holds other activations than the generator's
        ranks = simulate(schedule, costs).per_rank
        plain = replace(plain, peak_units=tuple(r.peak_activation_units for r in ranks),
                        host_units=tuple(r.peak_host_units for r in ranks))
    return replace(plain, makespan=makespan, busy=busy, extrapolated=False)


def _model_flops(model: ModelSpec) -> float:
    return model.model_flops_per_microbatch()


def _plan_request(req: EstimateRequest) -> PlanRequest:
    """The ``PlanRequest`` whose data-parallel accounting (``dp_sync_time``), static memory and policy
    planning (``planned_choice``) ``estimate`` shares."""
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
    cache = sc.cast_cache_per_rank or (0.0,) * len(sc.params_per_rank)  # bf16 autocast's weight casts
    total = tuple(p * (s.weight_bytes + s.grad_bytes) + p * s.optimizer_bytes / shard + c + a
                  for p, c, a in zip(sc.params_per_rank, cache, acts))
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


def _refuse_policy_as_recompute(text: object) -> None:
    """A pipeoffload recompute policy given as Megatron's ``--recompute`` names the flag that takes it."""
    try:
        policy = RecomputePolicy.parse(text)  # type: ignore[arg-type]
    except ConfigError:
        return
    _refuse_partial("recompute", text, ", ".join(RECOMPUTE_MODES))
    if policy.kind != "none":
        raise ConfigError.named(lambda n: f"{n.given('recompute', text)} is a pipeoffload recompute policy (plan's "
                                f"recompute column): give it as {n.given('recompute_policy', text)}; {n('recompute')} "
                                f"takes Megatron's {', '.join(RECOMPUTE_MODES)}")


def _refuse_partial(field: str, text: object, forms: str) -> None:
    """A partial-recomputation form of a policy (``lgd``, ``partial:S:T``) names the field that models it:
    a policy's own partial form is applied only while lowering, never to the costs simulated, so plan
    has no row with it."""
    policy = RecomputePolicy.parse(text)  # type: ignore[arg-type]
    if policy.partial:
        raise ConfigError.named(lambda n: f"{n.given(field, text)}: partial recomputation is "
                                f"{n('partial_recompute')} here (LGD: LayerNorm, activation and dropout recomputed in "
                                f"the backward, as plan); {n(field)} takes {forms}")


def _drop(n: Naming, field: str) -> str:
    """The fix of a value that the request should not set: the CLI drops the flag, the API leaves it None."""
    return "drop the flag" if n.flags else f"leave {field} None"
