"""Tensor parallelism for the reference GPT's blocks (Megatron-style, ``torch.distributed.tensor``).

``parallelize_gpt_stage(stage, tp_mesh)`` shards every ``Block`` of a stage module across the ranks
of ``tp_mesh``: attention's fused ``qkv`` and the MLP's ``fc1`` column-wise (each rank computes its
own heads and its slice of the MLP), ``proj`` and ``fc2`` row-wise (partial sums all-reduced into a
replicated output). Everything else (embeddings, layer norms, the head) stays replicated: every
tensor-parallel rank holds a full copy, and since their inputs and the gradients flowing into them
are identical on every rank, so are their gradients.

A block's inputs and outputs stay plain, full ``torch.Tensor`` objects (the column-wise layers take
a replicated input, the row-wise ones return a replicated local tensor), so the pipeline runner
transports stage boundaries unchanged. The attention's ``qkv`` weight is laid out head-major
(``models.gpt``), so a contiguous column shard holds whole heads.

Sequence parallelism (sharding layer norms and dropout along the sequence) is not applied: it would
make the tensors between blocks sequence shards, which the stage boundary must not see, and it saves
activation memory only in the norms and residuals.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from pipeoffload.errors import ConfigError
from pipeoffload.models.gpt import Block


def _check_divisible(block: Block, tp: int) -> None:
    heads = block.qkv.out_features // (3 * block.head_dim)
    if heads % tp or block.fc1.out_features % tp:
        raise ConfigError(
            f"tensor parallel size {tp} must divide the {heads} attention heads and the MLP width "
            f"{block.fc1.out_features}; pick tp among the divisors of heads"
        )


def parallelize_gpt_stage(stage: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Shard every GPT ``Block`` inside ``stage`` in place over the 1-D ``tp_mesh``.

    Every rank of the mesh must call this with an identical copy of ``stage`` (same weights): each
    keeps its shard of the sharded layers and its full copy of the rest."""
    if tp_mesh.ndim != 1:
        raise ConfigError(f"tp_mesh has {tp_mesh.ndim} dimensions; pass the 1-D tensor-parallel sub-mesh")
    tp = tp_mesh.size()
    plan = {"qkv": ColwiseParallel(), "proj": RowwiseParallel(),
            "fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
    for module in stage.modules():
        if isinstance(module, Block):
            _check_divisible(module, tp)
            parallelize_module(module, tp_mesh, plan)  # type: ignore[arg-type]


def grad_sq_sum(params: Iterable[nn.Parameter]) -> torch.Tensor:
    """Sum of squared gradients of ``params`` as a plain float32 scalar, equal on every tensor-parallel
    rank: sharded gradients are summed over their mesh (one all-reduce per mesh), replicated ones
    counted once. ``torch.nn.utils.clip_grad_norm_`` refuses a mix of DTensor and plain gradients."""
    plain: torch.Tensor | None = None
    sharded: dict[DeviceMesh, torch.Tensor] = {}
    for p in params:
        g = p.grad
        if g is None:
            continue
        if isinstance(g, DTensor):
            local = g.to_local().float().pow(2).sum()
            if any(placement.is_shard() for placement in g.placements):
                mesh = g.device_mesh
                sharded[mesh] = sharded[mesh] + local if mesh in sharded else local
                continue
        else:
            local = g.float().pow(2).sum()
        plain = local if plain is None else plain + local
    total = plain if plain is not None else torch.zeros(())
    for mesh, local in sharded.items():
        dist.all_reduce(local, group=mesh.get_group())
        total = total + local.to(total.device)
    return total


def clip_grad_norm(params: Iterable[nn.Parameter], max_norm: float, group: dist.ProcessGroup | None = None) -> float:
    """Clip gradients (DTensor or plain) to a total norm of ``max_norm``; returns the norm before
    clipping. ``group``: ranks holding *different* parameters (e.g. the pipeline's), whose squared
    sums are added; omit it when ``params`` are the whole model."""
    params = [p for p in params if p.grad is not None]
    total = grad_sq_sum(params)
    if group is not None:
        dist.all_reduce(total, group=group)
    norm = float(total.sqrt())
    scale = max_norm / (norm + 1e-6)
    if scale < 1.0:
        for p in params:
            p.grad.mul_(scale)  # type: ignore[union-attr]
    return norm
