"""Tensor parallelism for the reference GPT's blocks (Megatron-style, ``torch.distributed.tensor``).

``parallelize_gpt_stage(stage, tp_mesh)`` shards every ``Block`` of a stage module across the ranks
of ``tp_mesh``: attention's fused ``qkv`` and the MLP's ``fc1`` column-wise (each rank computes its
own heads and its slice of the MLP), ``proj`` and ``fc2`` row-wise. The attention's ``qkv`` weight
is laid out head-major (``models.gpt``), so a contiguous column shard holds whole heads.

With ``sequence_parallel`` (the default), the tensors between the sharded layers -- the residual
stream, the layer norms and dropouts -- are split along the sequence too: each rank keeps ``1/tp``
of those activations; the column-wise layers all-gather the sequence, the row-wise ones
reduce-scatter it. A run of consecutive blocks slices its input at entry and all-gathers its output
at exit. Without it, row-wise outputs are all-reduced and everything between them is replicated.

Either way a stage's inputs and outputs stay plain, full ``torch.Tensor`` objects, so the pipeline
runner transports stage boundaries unchanged. Layers outside the blocks (embeddings, the head) stay
replicated: every tensor-parallel rank holds a full copy and, since their inputs and incoming
gradients are identical on every rank, computes identical gradients.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from pipeoffload.errors import ConfigError
from pipeoffload.models.gpt import Block


def _check_divisible(block: Block, tp: int) -> None:
    heads = block.qkv.out_features // (3 * block.head_dim)
    if heads % tp or block.fc1.out_features % tp:
        raise ConfigError(
            f"tensor parallel size {tp} must divide the {heads} attention heads and the MLP width "
            f"{block.fc1.out_features}; pick tp among the divisors of heads"
        )


def _block_runs(stage: nn.Module) -> list[list[Block]]:
    """Maximal runs of consecutive blocks (a ``Sequential`` stage); elsewhere each block alone."""
    if not isinstance(stage, nn.Sequential):
        return [[m] for m in stage.modules() if isinstance(m, Block)]
    runs: list[list[Block]] = []
    previous = False
    for child in stage:
        if isinstance(child, Block):
            if previous:
                runs[-1].append(child)
            else:
                runs.append([child])
        previous = isinstance(child, Block)
    return runs


def _plan(sequence_parallel: bool) -> dict:
    if not sequence_parallel:
        return {"qkv": ColwiseParallel(), "proj": RowwiseParallel(),
                "fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
    seq = Shard(1)
    return {"ln1": SequenceParallel(use_local_output=True), "qkv": ColwiseParallel(input_layouts=seq),
            "proj": RowwiseParallel(output_layouts=seq),
            "ln2": SequenceParallel(use_local_output=True), "fc1": ColwiseParallel(input_layouts=seq),
            "fc2": RowwiseParallel(output_layouts=seq)}


def parallelize_gpt_stage(stage: nn.Module, tp_mesh: DeviceMesh, *, sequence_parallel: bool = True,
                          seq_len: int | None = None) -> None:
    """Shard every GPT ``Block`` inside ``stage`` in place over the 1-D ``tp_mesh``.

    Every rank of the mesh must call this with an identical copy of ``stage`` (same weights): each
    keeps its shard of the sharded layers and its full copy of the rest. With ``sequence_parallel``
    the sequence length must be a multiple of the mesh size (checked here when ``seq_len`` is given)."""
    if tp_mesh.ndim != 1:
        raise ConfigError(f"tp_mesh has {tp_mesh.ndim} dimensions; pass the 1-D tensor-parallel sub-mesh")
    tp = tp_mesh.size()
    if sequence_parallel and seq_len is not None and seq_len % tp:
        raise ConfigError(f"sequence parallelism splits the sequence: seq_len={seq_len} must be a multiple of "
                          f"tp={tp}; change seq_len or pass sequence_parallel=False")
    for run in _block_runs(stage):
        for block in run:
            _check_divisible(block, tp)
            parallelize_module(block, tp_mesh, _plan(sequence_parallel))  # type: ignore[arg-type]
        if sequence_parallel:  # full tensors outside the run, sequence shards inside it
            parallelize_module(run[0], tp_mesh, PrepareModuleInput(
                input_layouts=(Replicate(), None, None), desired_input_layouts=(Shard(1), None, None),
                use_local_output=True))
            parallelize_module(run[-1], tp_mesh, PrepareModuleOutput(
                output_layouts=(Shard(1), None, None),  # type: ignore[arg-type]
                desired_output_layouts=(Replicate(), None, None), use_local_output=True))  # type: ignore[arg-type]


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
            if any(placement.is_partial() for placement in g.placements):  # e.g. sequence-parallel norms
                g = g.redistribute(placements=[Replicate()] * g.device_mesh.ndim)
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
