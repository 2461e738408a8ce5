"""Candidates: the layouts and schedule choices a request allows, and how a simulation is scored.

A candidate is a layout (PP x TP x DP) and a ``ScheduleChoice`` (family, stages per rank, group size,
offload and recompute policy). Its step time is the simulated pipeline makespan plus the data-parallel
gradient sync and the optimizer step; its memory is, on the worst rank, weights + gradients + optimizer
state + the simulated activation peak.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from pipeoffload.errors import FLAGS, Naming
from pipeoffload.placement import Placement
from pipeoffload.planner.evaluate import (
    ScheduleChoice,
    SimSummary,
    lowering_options,
    placement_of,
    time_lower_bound,
)
from pipeoffload.planner.plans import MemorySplit, Plan, PlanRequest
from pipeoffload.planner.split import layer_split, most_stages
from pipeoffload.planner.stagecosts import (
    LayerCosts,
    Layout,
    StageCosts,
    head_weight,
    setup_layer_costs,
    stage_costs,
)
from pipeoffload.policies import OffloadPolicy, RecomputePolicy
from pipeoffload.schedules import get_spec

# ``offload budget`` without a target: filled per layout with what the memory budget leaves
BUDGET_FROM_MEMORY = OffloadPolicy("budget", budget=float("inf"))


def _divisors(n: int) -> list[int]:
    return [x for x in range(1, n + 1) if n % x == 0]


def layouts(req: PlanRequest, skipped: dict[str, int]) -> list[Layout]:
    """PP x TP x DP splits of the GPUs the model and batch allow, in sorted order."""
    model = req.model
    out = []
    for tp in tp_sizes(req):
        if not tp_divides(req, tp):
            count(skipped, f"tp={tp} does not divide the GPUs/heads/kv heads/ffn")
            continue
        for pp in req.pp_sizes or _divisors(req.gpus // tp):
            if (req.gpus // tp) % pp or pp > max_stages(req):
                continue
            dp = req.gpus // (tp * pp)
            if req.global_batch % (dp * model.microbatch):
                count(skipped, "global batch not divisible by DP x microbatch size")
                continue
            out.append(Layout(pp, tp, dp))
    return out


def tp_sizes(req: PlanRequest) -> list[int]:
    """The TP sizes a search considers, in order: the requested ones, or the GPUs' divisors within a node
    (a profile holds one TP size)."""
    tps = req.tp_sizes or tuple(t for t in _divisors(req.gpus) if t <= req.hardware.gpus_per_node)
    if req.measured is not None:
        tps = tuple(t for t in tps if t == req.measured.tp)
    return sorted(set(tps))


def tp_divides(req: PlanRequest, tp: int) -> bool:
    """Whether ``tp`` divides the GPUs and the model's heads, KV heads and FFN width."""
    m = req.model
    return not (req.gpus % tp or m.heads % tp or m.num_kv_heads % tp or m.ffn_size % tp)


def choices(req: PlanRequest, pp: int, m: int) -> list[ScheduleChoice]:
    """Schedule families, stages per rank, group sizes and memory policies for pp ranks, m microbatches."""
    out: list[ScheduleChoice] = []
    for family in req.families():
        for v in family_stages_per_rank(family, req.stages_per_rank):
            if _ruled_out(req, family, v, pp, m):
                continue
            for g in group_sizes(req, family, pp):
                for offload, recompute in _policies(req, v, pp):
                    target = BUDGET_FROM_MEMORY if offload == "budget" else OffloadPolicy.parse(offload)
                    out.append(ScheduleChoice(family, v, g, target, RecomputePolicy.parse(recompute)))
                    if req.max_stall > 0 and target.kind != "none" and recompute == "none":
                        # the same offload under the stall budget, at level 2 beside recompute first:1 (``level``)
                        out.append(replace(out[-1], offload=replace(target, max_stall=req.max_stall)))
    return out


def _needs_pipeline(family: str, pp: int) -> str | None:
    return f"{family} needs PP > 1" if pp == 1 and family != "1f1b" else None


def _ruled_out(req: PlanRequest, family: str, v: int, pp: int, m: int) -> str | None:
    """Why ``choices`` leaves out ``family`` with v stages per rank on pp ranks and m microbatches, or None."""
    needs = _needs_pipeline(family, pp)
    if needs:
        return needs
    if pp * v > max_stages(req):
        return (f"{family} on PP {pp} needs at least {pp * v} stages (v={v}), more than the {req.model.layers} "
                "layers fill")
    if family == "interleaved-1f1b" and m % pp:
        return f"interleaved-1f1b needs the {m} microbatches to be a multiple of PP {pp}"
    return None


def why_no_choice(req: PlanRequest, pp: int, m: int, n: Naming = FLAGS) -> list[str]:
    """Why ``choices`` has nothing for pp ranks and m microbatches, one reason per family (its rules:
    a family's smallest v is ruled out exactly when every v is); ``n`` names the request's fields."""
    reasons = []
    for family in req.families():
        vs = family_stages_per_rank(family, req.stages_per_rank)
        why = _ruled_out(req, family, min(vs), pp, m) if vs else _needs_pipeline(family, pp)
        if why:
            reasons.append(why)
        elif not vs:
            reasons.append(f"{family} needs {n('stages_per_rank')} 2 or more")
        elif not group_sizes(req, family, pp):
            reasons.append(f"{family} has no group size of {n('group_sizes')} in 1..{pp}")
    return reasons


def family_stages_per_rank(family: str, stages_per_rank: tuple[int, ...]) -> tuple[int, ...]:
    """The stages per rank a search tries for ``family``, of the requested ``stages_per_rank``: its own
    for a family with a fixed v (1F1B: 1; V placement: 2), those >= 2 for an interleaved one, else 1."""
    spec = get_spec(family)
    if spec.fixed_stages_per_rank:
        return (spec.stages_per_rank,)  # e.g. V placement: stages r and 2d-1-r on rank r
    if spec.interleaved:
        return tuple(v for v in stages_per_rank if v >= 2)
    return (1,)


def group_sizes(req: PlanRequest, family: str, pp: int) -> tuple[int | None, ...]:
    """The group sizes a search tries for ``family`` on ``pp`` ranks: the family's own, or the requested
    ones in 1..pp (``req.group_sizes``; none for a family without a group size)."""
    own = get_spec(family).group_sizes(pp)
    if req.group_sizes is None:
        return own
    if own == (None,):
        return ()
    return tuple(g for g in req.group_sizes if 1 <= g <= pp)


def _policies(req: PlanRequest, v: int, pp: int) -> list[tuple[str, str]]:
    """(offload, recompute) pairs to try, in escalation order (see ``level``). By default: neither;
    ``offload auto`` (the lowest peak the copy lane can hide: it never makes a backward wait);
    ``recompute first:1`` (the longest-lived stage of each rank); ``offload budget:X`` with
    ``recompute auto`` (the fewest copies, then the fewest recomputations, that bring every rank's
    activations to X units, X being what the memory budget leaves; filled in per layout as
    ``budget``) and ``offload auto`` with ``recompute auto`` (recompute what could not be hidden),
    which reaches lower when X cannot be met exactly; and ``recompute first:v`` (every stage). With
    ``req.max_stall``, each offload-only pair is also tried under that stall budget (``choices``)."""
    if pp == 1:
        return [("none", "none")]
    supported = lowering_options()
    if req.offload is None and req.recompute is None:
        pairs = [("none", "none")]
        if "offload" in supported:
            pairs += [("auto", "none"), ("budget", "auto"), ("auto", "auto")]
        if "recompute" in supported:
            pairs += [("none", f"first:{k}") for k in sorted({1, v})]
        return pairs
    offloads = req.offload or ("none",)
    recomputes = req.recompute or ("none",)
    pairs = [(o, r) for o in offloads for r in recomputes if not (r == "auto" and o == "none")]
    return pairs or [("none", "none")]


MAX_LEVEL = 4  # the highest escalation level of a memory policy (``level``)


def level(choice: ScheduleChoice) -> int:
    """Escalation level, roughly by growing cost: 0 plain, 1 offload only (free when hidden), 2 recompute
    of the longest-lived stage, or offload only under a stall budget (``max_stall``: at most that much
    longer; its fit does not stop the escalation, see ``search``), 3 offload then ``recompute auto``
    (down to the budget, or what could not be hidden: one level, since neither is the cheaper one
    everywhere), 4 recompute everything."""
    offload, recompute, v = choice.offload, choice.recompute, choice.stages_per_rank
    if recompute == RecomputePolicy():
        return 0 if offload == OffloadPolicy() else (2 if offload.max_stall > 0 else 1)
    if recompute == RecomputePolicy("auto"):
        return 3
    return 4 if recompute == RecomputePolicy("first", v) and v > 1 else 2


def max_stages(req: PlanRequest) -> int:
    """Stages the layers can fill: one layer each, plus an embedding-only and a head-only stage when the
    split is balanced."""
    return most_stages(req.split, req.model.layers)


def count(skipped: dict[str, int], reason: str, n: int = 1) -> None:
    skipped[reason] = skipped.get(reason, 0) + n


# ---- evaluation -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Candidate:
    layout: Layout
    choice: ScheduleChoice
    microbatches: int
    stage: StageCosts
    static_bytes: tuple[float, ...]  # weights + grads + optimizer, per rank
    time_bound: float  # no simulation of this candidate can give a shorter step
    # no simulation can give a smaller activation peak, per rank (bytes; see ``activation_floor``)
    activation_floor: tuple[float, ...] = ()

    @property
    def least_memory(self) -> float:
        """Bytes on the worst rank no simulation can go below: static memory plus the activation floor."""
        return max((s + a for s, a in zip(self.static_bytes, self.activation_floor)), default=0.0)

    def cannot_fit(self, req: PlanRequest) -> bool:
        """Whether even the activation floor breaks the budgets: then no simulation can fit."""
        floor = self.activation_floor
        if not floor:
            return False
        over_activations = req.activation_budget is not None and max(floor) > req.activation_budget * (1 + 1e-9)
        return self.least_memory > req.memory_budget or over_activations

    def key(self) -> tuple:
        return (str(self.layout), self.choice)

    def is_base(self) -> bool:
        """No offload and no recompute: the schedule its memory-policy variants are lowered from."""
        return self.choice.is_plain()

    def base_key(self) -> tuple:
        return (str(self.layout), self.choice.plain())


def static_split(req: PlanRequest, layout: Layout, stage: StageCosts) -> tuple[tuple[float, float], ...]:
    """Per rank (weights and gradients, with bf16 autocast's weight-cast cache where train keeps one;
    optimizer state)."""
    s = req.setup
    shard = layout.dp if s.distributed_optimizer else 1
    cache = stage.cast_cache_per_rank or (0.0,) * len(stage.params_per_rank)
    return tuple((p * (s.weight_bytes + s.grad_bytes) + c, p * s.optimizer_bytes / shard)
                 for p, c in zip(stage.params_per_rank, cache))


def enumerate_candidates(req: PlanRequest, skipped: dict[str, int]) -> list[Candidate]:
    out = []
    per_layer: dict[tuple[int, bool], LayerCosts] = {}
    for layout in layouts(req, skipped):
        m = req.global_batch // (layout.dp * req.model.microbatch)
        stages: dict[tuple, StageCosts] = {}
        bounds: dict[tuple, tuple[float, tuple[float, ...]]] = {}  # a schedule's policy variants share them
        for choice in choices(req, layout.pp, m):
            lgd = req.setup.lgd_for(choice.offload)  # LGD with offload, as the reference does
            lc = per_layer.get((layout.tp, lgd))
            if lc is None:
                lc = _measured(req) or setup_layer_costs(req.model, req.hardware, layout.tp, req.setup, lgd)
                per_layer[(layout.tp, lgd)] = lc
            placement = placement_of(choice, layout.pp)
            key = (choice.stages_per_rank, placement, lgd)
            if key not in stages:
                split = layer_split(req.split, req.model.layers, placement, head_weight(lc))
                stages[key] = stage_costs(lc, req.hardware, layout, choice.stages_per_rank, req.model.layers,
                                          placement, host_link=req.setup.host_link,
                                          gather_after_p2p=layout.tp > 1 and not req.setup.sequence_parallel,
                                          split=split)
            sc = stages[key]
            static = tuple(sum(x) for x in static_split(req, layout, sc))
            choice = planned_choice(req, choice, sc, static)
            if (key, choice.recompute) not in bounds:
                bounds[(key, choice.recompute)] = (
                    time_lower_bound(choice, layout.pp, m, sc.costs)
                    + dp_sync_time(req, layout, max(sc.params_per_rank), placement),
                    activation_floor(choice, placement, sc))
            bound, floor = bounds[(key, choice.recompute)]
            out.append(Candidate(layout, choice, m, sc, static, bound, floor))
    return sorted(out, key=Candidate.key)


def planned_choice(req: PlanRequest, choice: ScheduleChoice, stage: StageCosts,
                   static: tuple[float, ...]) -> ScheduleChoice:
    """``choice`` with its memory policies as a layout of these stage costs and this static memory per
    rank (weights, gradients, optimizer state) plans them; ``estimate`` plans its policies with it too.
    ``offload budget`` without a target (``BUDGET_FROM_MEMORY``) gets what the memory budget leaves for
    activations, in units (4 significant digits), under a stall budget too (``fills_from_memory``). Under a stall budget or with ``recompute auto`` the
    offload policy carries each rank's static memory in units (``rank_offsets``): plans are compared by
    each rank's total memory, the stall budget's, and whether recompute auto's recomputation lowers
    the plan's memory (the first stage's weights can make a rank other than the one with the most
    activations the fullest)."""
    if fills_from_memory(choice.offload):  # what the memory budget leaves for activations, in units
        room = max(0.0, min(req.memory_budget - x for x in static)) / stage.unit_bytes
        if req.activation_budget is not None:
            room = min(room, req.activation_budget / stage.unit_bytes)
        choice = replace(choice, offload=replace(choice.offload, budget=float(f"{room:.4g}")))
    if choice.offload.max_stall > 0 or choice.recompute.kind == "auto":
        offsets = tuple(float(f"{x / stage.unit_bytes:.6g}") for x in static)
        choice = replace(choice, offload=replace(choice.offload, rank_offsets=offsets))
    return choice


def fills_from_memory(offload: OffloadPolicy) -> bool:
    """Whether ``offload`` is ``offload budget`` without a target (``BUDGET_FROM_MEMORY``), with or
    without a stall budget: the stall variant of a budget candidate gets the same target as its twin."""
    return replace(offload, max_stall=0.0) == BUDGET_FROM_MEMORY


def activation_floor(choice: ScheduleChoice, placement: Placement, stage: StageCosts) -> tuple[float, ...]:
    """Per rank, activation bytes no schedule, offload or recompute can go below: the largest of its
    stages' activations, which must be on the device while its backward runs (an offloaded one is
    reloaded, a recomputed one re-created first). Lowered slightly so that float noise in a simulated
    peak can never make the bound exceed it; used to skip simulating candidates that cannot fit."""
    costs = (stage.costs, choice.recompute.apply_to(stage.costs))
    return tuple(max(min(c.act(s) for c in costs) for s in placement.stages_of(rank)) * stage.unit_bytes
                 * (1 - 1e-9) for rank in range(placement.num_ranks))


# Megatron's mixed-precision optimizer step (bf16 weights, fp32 main gradients and master weights), as
# bytes of HBM traffic per weight, each pass a memory-bound multi-tensor kernel:
OPTIMIZER_SHARD_BYTES = (
    4.0  # gradient norm for clipping: read the fp32 gradient
    + 28.0  # fused Adam: read master weight, gradient, m, v (16); write master weight, m, v (12)
    + 6.0  # copy the fp32 master weights to the 2-byte model weights: read 4, write 2
)
OPTIMIZER_ZERO_BYTES = 4.0  # zero the fp32 gradient buffer for the next step (every local weight)
# Megatron's DDP divides the whole gradient buffer by the data-parallel size before reducing it
# (``buffer_.data /= dp``: read 4, write 4), a pass that runs even at DP 1 (every local weight)
DP_DIVIDE_BYTES = 8.0


def optimizer_step_time(req: PlanRequest, layout: Layout, params: float) -> float:
    """The optimizer step's passes over ``params`` local weights at the streaming-kernel rate (the
    ``hbm_efficiency`` share of HBM bandwidth that element-wise kernels get); with a distributed
    optimizer every pass but the gradient zeroing runs on the 1/dp shard."""
    shard = layout.dp if req.setup.distributed_optimizer else 1
    hw = req.hardware
    per_weight = OPTIMIZER_SHARD_BYTES / shard + OPTIMIZER_ZERO_BYTES + DP_DIVIDE_BYTES
    return params * per_weight / (hw.hbm_bandwidth * hw.hbm_efficiency)


def embedding_sync_time(req: PlanRequest, layout: Layout, placement: Placement | None = None) -> float:
    """A tied word embedding lives on the first stage (lookup) and the last (output head): Megatron
    all-reduces its gradient between the two after the backward, before the optimizer step, which
    every rank waits for (the gradient norm is reduced over the whole model-parallel group). Nothing
    when one rank holds both (PP 1, or a V placement: the first and last stage on rank 0)."""
    if layout.pp <= 1 or not req.model.tied_embeddings:
        return 0.0
    if placement is not None and placement.rank_of(0) == placement.rank_of(placement.num_stages - 1):
        return 0.0
    nbytes = req.model.word_embedding_params() / req.model.outside_blocks_tp(layout.tp) * req.setup.grad_bytes
    return 2 * req.hardware.collective_time(nbytes, 2, layout.tp * (layout.pp - 1))


def dp_sync_time(req: PlanRequest, layout: Layout, params: float, placement: Placement | None = None) -> float:
    """Gradient reduce (+ parameter all-gather with a distributed optimizer), not overlapped, plus the
    memory-bound optimizer step (``optimizer_step_time``) and the tied embedding's gradient all-reduce
    between the first and the last stage (``embedding_sync_time``)."""
    s, hw, dp = req.setup, req.hardware, layout.dp
    step = optimizer_step_time(req, layout, params) + embedding_sync_time(req, layout, placement)
    if dp == 1:
        return step
    bw = hw.collective_bandwidth(dp, layout.tp * layout.pp)
    if s.distributed_optimizer:
        return step + (dp - 1) / dp * params * (s.grad_bytes + s.weight_bytes) / bw
    return step + 2 * (dp - 1) / dp * params * s.grad_bytes / bw


def evaluate(req: PlanRequest, cand: Candidate, sim: SimSummary) -> Plan:
    layout, stage = cand.layout, cand.stage
    unit = stage.unit_bytes
    static = static_split(req, layout, stage)
    totals = [w + o + sim.peak_units[r] * unit for r, (w, o) in enumerate(static)]
    worst = max(range(layout.pp), key=lambda r: (totals[r], -r))
    host = max(sim.host_units) * unit
    memory = MemorySplit(static[worst][0], static[worst][1], sim.peak_units[worst] * unit, host)
    dp_time = dp_sync_time(req, layout, max(stage.params_per_rank), placement_of(cand.choice, layout.pp))
    step = sim.makespan + dp_time
    tokens = req.global_batch * req.model.seq
    flops = req.global_batch / req.model.microbatch * _model_flops(req)
    fits = memory.total <= req.memory_budget and (
        req.host_memory_budget is None or host <= req.host_memory_budget) and (
        req.activation_budget is None or max(sim.peak_units) * unit <= req.activation_budget * (1 + 1e-9))
    return Plan(layout, cand.choice, cand.microbatches, step, sim.makespan, dp_time, tokens / step,
                flops / (step * layout.gpus * req.hardware.peak_flops), memory, sim.bubble_ratio,
                max(sim.stall) / step if step else 0.0, fits, sim.exact, sim, unit)


def _measured(req: PlanRequest) -> LayerCosts | None:
    """The profile, with the tied word embedding it cannot record (held once where one rank holds both ends)."""
    lc = req.measured
    if lc is None or lc.tied_params or not req.model.tied_embeddings:
        return lc
    return replace(lc, tied_params=req.model.word_embedding_params() / req.model.outside_blocks_tp(lc.tp))


def _model_flops(req: PlanRequest) -> float:
    return req.measured.model_flops if req.measured and req.measured.model_flops else \
        req.model.model_flops_per_microbatch()
