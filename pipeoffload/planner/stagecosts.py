"""From (model, hardware, layout) to seconds and bytes per stage: the planner's ``CostModel`` source.

``LayerCosts`` holds what one transformer layer (and the embedding/head) costs for one microbatch on
one rank. It is built either from formulas (``layer_costs``) or from measurements (the profiler), and
``StageCosts`` turns it into a per-stage ``CostModel`` for a given pipeline partition.

Modelling choices (written down because they move the numbers):
- tensor parallelism uses sequence parallelism: per layer 4 all-gather/reduce-scatter collectives of
  the full ``s*b*h`` tensor in F and 4 in I (none in W), not overlapped with compute;
- pipeline neighbours talk over NVLink when a whole pipeline fits in one node, else over the network;
- when two GPUs share a PCIe switch: with ``tp == 1`` they are adjacent pipeline ranks (2p, 2p+1) and
  the simulator serialises their same-direction copies; with ``tp > 1`` the partner is a TP peer that
  copies at the same moment, so each GPU gets half the link.
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeoffload.costs import CostModel
from pipeoffload.errors import ConfigError
from pipeoffload.placement import Placement
from pipeoffload.planner.hardware import HardwareSpec
from pipeoffload.planner.model import ModelSpec


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
    head_params: float = 0.0
    embedding_params: float = 0.0
    model_flops: float = 0.0  # training FLOPs of one microbatch through the whole model (for MFU)
    source: str = "formulas"


@dataclass(frozen=True, kw_only=True)
class TrainingSetup:
    """Mixed-precision Adam state per parameter and how it is sharded (Megatron-style defaults)."""

    weight_bytes: float = 2.0  # bf16 weights
    grad_bytes: float = 4.0  # fp32 main gradients (gradient accumulation in fp32)
    optimizer_bytes: float = 12.0  # fp32 master weights + Adam m and v
    distributed_optimizer: bool = True  # optimizer state sharded over data-parallel replicas (ZeRO-1)
    partial_recompute: bool = False  # LGD: recompute LayerNorm/activation/dropout in backward


def layer_costs(model: ModelSpec, hw: HardwareSpec, tp: int = 1, *, partial_recompute: bool = False) -> LayerCosts:
    """Per-layer costs on one of ``tp`` ranks from FLOP and byte formulas and the hardware's rates."""
    model.check_tp(tp)
    f, i, w = model.layer_fiw_flops(tp)
    full = model.boundary_bytes(1)
    tp_comm = 4 * (tp - 1) / tp * full / hw.collective_bandwidth(tp, 1) if tp > 1 else 0.0
    lgd = model.recompute_elementwise_bytes() / tp / hw.hbm_bandwidth if partial_recompute else 0.0
    hf, hi, hw_ = model.head_fiw_flops(tp)
    head_comm = (tp - 1) / tp * full / hw.collective_bandwidth(tp, 1) if tp > 1 else 0.0
    return LayerCosts(
        time_f=f / hw.flops + tp_comm,
        time_i=i / hw.flops + tp_comm + lgd,
        time_w=w / hw.flops,
        activation_bytes=model.layer_activation_bytes(tp, partial_recompute),
        params=model.params_per_layer() / tp,
        boundary_bytes=model.boundary_bytes(tp),
        head_time=(hf / hw.flops + head_comm, hi / hw.flops + head_comm, hw_ / hw.flops),
        head_activation_bytes=model.head_activation_bytes(tp),
        head_params=model.head_params() / tp,
        embedding_params=model.embedding_params() / tp,
        model_flops=model.model_flops_per_microbatch(),
    )


def partition(layers: int, stages: int) -> tuple[int, ...]:
    """Layers per stage, as even as possible; the remainder goes to the earliest stages (the last
    stage already carries the output head)."""
    if stages > layers:
        raise ConfigError(f"{stages} stages for {layers} layers: every stage needs a layer; "
                          "use fewer ranks or stages per rank")
    base, extra = divmod(layers, stages)
    return tuple(base + (1 if s < extra else 0) for s in range(stages))


@dataclass(frozen=True)
class StageCosts:
    """A per-stage ``CostModel`` for one layout and partition, plus what it needs to report bytes."""

    costs: CostModel
    unit_bytes: float  # bytes of one activation unit (CostModel.activation == 1.0)
    params_per_rank: tuple[float, ...]
    layers_per_stage: tuple[int, ...]


def stage_costs(lc: LayerCosts, hw: HardwareSpec, layout: Layout, stages_per_rank: int,
                layers: int, placement: Placement | None = None) -> StageCosts:
    """Build per-stage costs for ``layout.pp * stages_per_rank`` stages (loop placement unless given)."""
    d, v = layout.pp, stages_per_rank
    placement = placement or Placement.loop(d, v)
    split = partition(layers, d * v)
    last = len(split) - 1
    head = [lc.head_time if s == last else (0.0, 0.0, 0.0) for s in range(len(split))]
    f = tuple(n * lc.time_f + head[s][0] for s, n in enumerate(split))
    i = tuple(n * lc.time_i + head[s][1] for s, n in enumerate(split))
    w = tuple(n * lc.time_w + head[s][2] for s, n in enumerate(split))
    act_bytes = [n * lc.activation_bytes + (lc.head_activation_bytes if s == last else 0.0)
                 for s, n in enumerate(split)]
    unit = max(split) * lc.activation_bytes
    p2p_bw = hw.nvlink_bandwidth if layout.tp * d <= hw.gpus_per_node else hw.internode_bandwidth
    copy_share = 2.0 if hw.shares_pcie_switch and layout.tp > 1 else 1.0
    costs = CostModel(
        time_f=f, time_i=i, time_w=w,
        activation=tuple(b / unit for b in act_bytes),
        activation_bytes=unit,
        p2p_time=lc.boundary_bytes / p2p_bw if d > 1 else 0.0,
        d2h_time=unit * copy_share / hw.d2h_bandwidth,
        h2d_time=unit * copy_share / hw.h2d_bandwidth,
        shared_copy_engine=True,
        shared_host_link=hw.shares_pcie_switch and layout.tp == 1,
    )
    params = [0.0] * d
    for s, n in enumerate(split):
        extra = (lc.embedding_params if s == 0 else 0.0) + (lc.head_params if s == last else 0.0)
        params[placement.rank_of(s)] += n * lc.params + extra
    return StageCosts(costs, unit, tuple(params), split)


