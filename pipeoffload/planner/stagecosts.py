"""From (model, hardware, layout) to seconds and bytes per stage: the planner's ``CostModel`` source.

``LayerCosts`` holds what one transformer layer (and the embedding/head) costs for one microbatch on
one rank. It is built either from formulas (``layer_costs``) or from measurements (the profiler), and
``StageCosts`` turns it into a per-stage ``CostModel`` for a given pipeline partition.

Modelling choices (written down because they move the numbers):
- layer times come from ``layertime.py``: GEMMs at a shape-dependent rate, element-wise kernels at HBM
  speed, tensor-parallel collectives as Megatron-LM issues them (sequence parallel by default), with
  a separate full-backward time B for schedules that do not split the backward;
- pipeline neighbours talk over NVLink when a whole pipeline fits in one node, else over the network
  (latency + bytes / bandwidth of the hardware's network preset);
- two GPUs under one PCIe switch (``HardwareSpec.shares_pcie_switch``) are modelled only when asked
  (``host_link``): "private" (default) gives every GPU its own link; "alternating" is the reference's
  scheme (the two GPUs of a pair copy in opposite directions in alternating slots, so with one copy
  engine per GPU neither waits for the other; TP peers copy the same direction at the same time and
  get half the link each); "serialized" makes same-direction copies of ranks 2p and 2p+1 wait for each
  other (the simulator's ``shared_host_link``) and halves the link of TP peers.
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeoffload.costs import CostModel
from pipeoffload.errors import ConfigError
from pipeoffload.placement import Placement
from pipeoffload.planner.hardware import HardwareSpec
from pipeoffload.planner.layertime import embedding_times, head_times, layer_times
from pipeoffload.planner.model import ModelSpec
from pipeoffload.planner.split import even_split
from pipeoffload.policies import OffloadPolicy, check_booleans

HOST_LINK_MODES = ("private", "alternating", "serialized")


@dataclass(frozen=True)
class Layout:
    """How the GPUs are split: pipeline ranks x tensor-parallel ranks x data-parallel replicas."""

    pp: int
    tp: int
    dp: int

    @property
    def gpus(self) -> int:
        return self.pp * self.tp * self.dp

    def __str__(self) -> str:
        return f"PP{self.pp}xTP{self.tp}xDP{self.dp}"


@dataclass(frozen=True, kw_only=True)
class LayerCosts:
    """One layer (and the embedding/head extras) for one microbatch on one rank: seconds and bytes."""

    time_f: float
    time_i: float
    time_w: float
    activation_bytes: float
    params: float  # parameters of one layer held by one rank
    boundary_bytes: float  # hidden states sent to the next stage
    head_time: tuple[float, float, float] = (0.0, 0.0, 0.0)  # (F, I, W) of the output projection
    head_activation_bytes: float = 0.0
    # what W needs after I (inputs of the linear layers), per layer and for the head; None: all of it
    w_bytes: float | None = None
    head_w_bytes: float | None = None
    head_params: float = 0.0
    embedding_params: float = 0.0
    # the word embedding a tied head shares: one copy where one rank holds the first and last stage
    tied_params: float = 0.0
    model_flops: float = 0.0  # training FLOPs of one microbatch through the whole model (for MFU)
    source: str = "formulas"
    time_b: float | None = None  # full backward (I and W together); None: time_i + time_w
    head_time_b: float | None = None
    # (F, B) of the first stage's embedding lookup; all of B is weight-gradient work (W)
    embedding_time: tuple[float, float] = (0.0, 0.0)
    tp: int = 1  # the tensor-parallel size these costs were measured or computed for
    # bf16 autocast's weight-cast cache of one layer and of the head, held for the whole step (train's
    # blocks only: ``ModelSpec.layer_cast_cache_bytes``)
    cast_cache_bytes: float = 0.0
    head_cast_cache_bytes: float = 0.0
    # what the first stage's embedding saves per microbatch (train's blocks: its token ids), all W's
    embedding_activation_bytes: float = 0.0


@dataclass(frozen=True, kw_only=True)
class TrainingSetup:
    """Mixed-precision Adam state per parameter and how it is sharded (Megatron-style defaults)."""

    weight_bytes: float = 2.0  # bf16 weights
    grad_bytes: float = 4.0  # fp32 main gradients (gradient accumulation in fp32)
    optimizer_bytes: float = 12.0  # fp32 master weights + Adam m and v
    distributed_optimizer: bool = True  # optimizer state sharded over data-parallel replicas (ZeRO-1)
    # LGD (recompute LayerNorm/activation/dropout in backward): None = with offload only, as the
    # reference's offload scripts do; True/False = always/never
    partial_recompute: bool | None = None
    sequence_parallel: bool = True  # Megatron's --sequence-parallel with tensor parallelism
    selective_recompute: bool = False  # Megatron's selective recomputation of the attention core
    host_link: str = "private"  # PCIe pair sharing: private | alternating | serialized

    def __post_init__(self) -> None:
        check_booleans(self, "distributed_optimizer", "sequence_parallel", "selective_recompute",
                       optional=("partial_recompute",))
        if self.host_link not in HOST_LINK_MODES:
            raise ConfigError(f"host link mode {self.host_link!r}: use one of {', '.join(HOST_LINK_MODES)}")

    def lgd_for(self, offload: OffloadPolicy | str) -> bool:
        """Whether a candidate with this offload policy uses LGD partial recomputation."""
        if self.partial_recompute is not None:
            return self.partial_recompute
        return OffloadPolicy.parse(offload).kind != "none"


def layer_costs(model: ModelSpec, hw: HardwareSpec, tp: int = 1, *, partial_recompute: bool = False,
                sequence_parallel: bool = True, selective_recompute: bool = False) -> LayerCosts:
    """Per-layer costs on one of ``tp`` ranks from the model's shapes and the hardware (``layertime``)."""
    model.check_tp(tp)
    t = layer_times(model, hw, tp, sequence_parallel=sequence_parallel, partial_recompute=partial_recompute,
                    selective_recompute=selective_recompute)
    hf, hi, hw_, hb = head_times(model, hw, tp, sequence_parallel=sequence_parallel)
    ef, eb = embedding_times(model, hw, tp, sequence_parallel=sequence_parallel)
    sp = sequence_parallel  # without it the norms' tensors and dropout masks are whole on every TP rank
    return LayerCosts(
        time_f=t.f, time_i=t.i, time_w=t.w, time_b=t.b,
        # selective recomputation stores no s^2 attention scores, like a fused kernel
        activation_bytes=(model.with_(flash_attention=True) if selective_recompute else model)
        .layer_activation_bytes(tp, partial_recompute, sp),
        params=model.params_per_layer() / tp,
        boundary_bytes=model.boundary_bytes(tp),
        head_time=(hf, hi, hw_), head_time_b=hb, embedding_time=(ef, eb),
        head_activation_bytes=model.head_activation_bytes(tp, sp),
        w_bytes=model.layer_weight_input_bytes(tp, sp), head_w_bytes=model.head_weight_input_bytes(tp, sp),
        head_params=model.head_params() / model.outside_blocks_tp(tp),
        embedding_params=model.embedding_params() / model.outside_blocks_tp(tp),
        tied_params=model.word_embedding_params() / model.outside_blocks_tp(tp) if model.tied_embeddings else 0.0,
        model_flops=model.model_flops_per_microbatch(), tp=tp,
        cast_cache_bytes=model.layer_cast_cache_bytes(tp), head_cast_cache_bytes=model.head_cast_cache_bytes(),
        embedding_activation_bytes=model.embedding_activation_bytes(),
    )


def layer_copy_and_compute(lc: LayerCosts, hw: HardwareSpec, share: float = 1.0) -> tuple[float, float]:
    """(D2H + H2D seconds of one layer's saved activations for one microbatch, that layer's F + I + W
    seconds): the cost model's offload ratio k is their quotient (``pipeoffload k``). ``share``: how
    many copies use the host link at once (2: two GPUs under one PCIe switch)."""
    copy = lc.activation_bytes * share * (1 / hw.d2h_bandwidth + 1 / hw.h2d_bandwidth)
    return copy, lc.time_f + lc.time_i + lc.time_w


def setup_layer_costs(model: ModelSpec, hw: HardwareSpec, tp: int, setup: TrainingSetup,
                      lgd: bool) -> LayerCosts:
    return layer_costs(model, hw, tp, partial_recompute=lgd, sequence_parallel=setup.sequence_parallel,
                       selective_recompute=setup.selective_recompute)


def partition(layers: int, stages: int) -> tuple[int, ...]:
    """Layers per stage, as even as possible; the remainder goes to the earliest stages (the last
    stage already carries the output head). ``split.py`` also has the balanced split."""
    return even_split(layers, stages)


def head_weight(lc: LayerCosts) -> float:
    """The head's forward + backward in units of one layer's (what the balanced split weighs it as)."""
    layer = lc.time_f + (lc.time_b if lc.time_b is not None else lc.time_i + lc.time_w)
    head_b = lc.head_time_b if lc.head_time_b is not None else lc.head_time[1] + lc.head_time[2]
    return (lc.head_time[0] + head_b) / layer if layer > 0 else 0.0


@dataclass(frozen=True)
class StageCosts:
    """A per-stage ``CostModel`` for one layout and partition, plus what it needs to report bytes."""

    costs: CostModel
    unit_bytes: float  # bytes of one activation unit (CostModel.activation == 1.0)
    params_per_rank: tuple[float, ...]
    layers_per_stage: tuple[int, ...]
    # bytes of bf16 autocast's weight-cast cache per rank, on top of the parameters' state for the whole
    # pipeline of a step (train's blocks under bf16; () where there is none)
    cast_cache_per_rank: tuple[float, ...] = ()


def stage_costs(lc: LayerCosts, hw: HardwareSpec, layout: Layout, stages_per_rank: int,
                layers: int, placement: Placement | None = None, *, host_link: str = "private",
                gather_after_p2p: bool = False, split: tuple[int, ...] | None = None) -> StageCosts:
    """Build per-stage costs for ``layout.pp * stages_per_rank`` stages (loop placement unless given).

    Each of the ``tp`` ranks of a stage sends its 1/tp of the hidden states (Megatron's scatter/gather
    optimisation); without sequence parallelism the receiver then all-gathers them over NVLink before
    use (``gather_after_p2p``), which is part of the transfer's time. ``split`` gives the layers of each
    stage (``split.py``; default: even); a first stage with none holds only the embedding, a last stage
    with none only the head."""
    d, v = layout.pp, stages_per_rank
    placement = placement or Placement.loop(d, v)
    if split is None:
        split = partition(layers, d * v)
    elif len(split) != d * v or sum(split) != layers or min(split[1:-1], default=1) < 1:
        raise ConfigError(f"layer split {split}: needs {d * v} stages holding {layers} layers, a layer on every "
                          "stage but the first and last")
    last = len(split) - 1
    head = [lc.head_time if s == last else (0.0, 0.0, 0.0) for s in range(len(split))]
    ef, eb = lc.embedding_time
    emb_f, emb_b = [ef if s == 0 else 0.0 for s in range(len(split))], [eb if s == 0 else 0.0 for s in range(len(split))]
    f = tuple(n * lc.time_f + head[s][0] + emb_f[s] for s, n in enumerate(split))
    i = tuple(n * lc.time_i + head[s][1] for s, n in enumerate(split))
    w = tuple(n * lc.time_w + head[s][2] + emb_b[s] for s, n in enumerate(split))
    b = None
    if lc.time_b is not None:
        head_b = lc.head_time_b if lc.head_time_b is not None else lc.head_time[1] + lc.head_time[2]
        b = tuple(n * lc.time_b + (head_b if s == last else 0.0) + emb_b[s] for s, n in enumerate(split))
    act_bytes = [n * lc.activation_bytes + (lc.head_activation_bytes if s == last else 0.0)
                 + (lc.embedding_activation_bytes if s == 0 else 0.0) for s, n in enumerate(split)]
    unit = max(split) * lc.activation_bytes
    w_fractions = _stage_w_fractions(lc, split, act_bytes)
    in_node = layout.tp * d <= hw.gpus_per_node
    shared = hw.shares_pcie_switch and host_link != "private"
    copy_share = 2.0 if shared and layout.tp > 1 else 1.0
    costs = CostModel(
        time_f=f, time_i=i, time_w=w, time_b=b,
        activation=tuple(x / unit for x in act_bytes),
        activation_bytes=unit,
        w_fraction=max(w_fractions, default=1.0), stage_w_fraction=w_fractions,
        p2p_time=(hw.p2p_time(lc.boundary_bytes, in_node) + (
            hw.collective_time(lc.boundary_bytes * layout.tp, layout.tp) if gather_after_p2p else 0.0)) if d > 1 else 0.0,
        d2h_time=unit * copy_share / hw.d2h_bandwidth,
        h2d_time=unit * copy_share / hw.h2d_bandwidth,
        shared_copy_engine=True,
        shared_host_link=shared and host_link == "serialized" and layout.tp == 1,
    )
    params, cache = [0.0] * d, [0.0] * d
    for s, n in enumerate(split):
        extra = (lc.embedding_params if s == 0 else 0.0) + (lc.head_params if s == last else 0.0)
        params[placement.rank_of(s)] += n * lc.params + extra
        cache[placement.rank_of(s)] += n * lc.cast_cache_bytes + (lc.head_cast_cache_bytes if s == last else 0.0)
    if placement.rank_of(0) == placement.rank_of(last):  # PP 1 or a V: Megatron shares the tied tensor
        params[placement.rank_of(0)] -= lc.tied_params
    return StageCosts(costs, unit, tuple(params), split, tuple(cache) if any(cache) else ())


def _stage_w_fractions(lc: LayerCosts, split: list[int] | tuple[int, ...], act_bytes: list[float]) -> tuple[float, ...]:
    """Per stage, the part of its saved bytes W still needs after I: the inputs of its linear layers
    (``ModelSpec.layer_weight_input_bytes``, and the head's) over all it saved; 1.0 where unknown."""
    if lc.w_bytes is None:
        return tuple(1.0 for _ in split)
    last = len(split) - 1
    out = []
    for s, n in enumerate(split):
        needed = n * lc.w_bytes + ((lc.head_w_bytes or 0.0) if s == last else 0.0) + (
            lc.embedding_activation_bytes if s == 0 else 0.0)
        out.append(min(1.0, needed / act_bytes[s]) if act_bytes[s] > 0 else 1.0)
    return tuple(out)
