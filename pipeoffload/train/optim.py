"""Optimizer, learning-rate schedule, data-parallel gradient averaging (overlapped with the step) and
global-norm clipping."""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from pipeoffload.runtime.offload import local_tensor as local_tensor  # DTensor.to_local(), one definition
from pipeoffload.train.config import TrainConfig


def lr_at(cfg: TrainConfig, step: int) -> float:
    """Learning rate of 1-based ``step``: linear warm-up to ``lr``, then cosine down to ``min_lr_ratio*lr``."""
    if cfg.optim.warmup and step <= cfg.optim.warmup:
        return cfg.optim.lr * step / cfg.optim.warmup
    span = max(1, cfg.run.steps - cfg.optim.warmup)
    progress = min(1.0, (step - cfg.optim.warmup) / span)
    floor = cfg.optim.lr * cfg.optim.min_lr_ratio
    return floor + 0.5 * (cfg.optim.lr - floor) * (1 + math.cos(math.pi * progress))


def is_sharded(t: torch.Tensor) -> bool:
    placements = getattr(t, "placements", None)
    return placements is not None and any(p.is_shard() for p in placements)


def make_optimizer(cfg: TrainConfig, params: list[nn.Parameter], dp_group: Any, dp: int) -> torch.optim.Optimizer:
    """AdamW, or ``ZeroRedundancyOptimizer`` wrapping it (optimizer state sharded over the dp group).

    AdamW creates its state at the first step; a resumed run's is created and filled by
    ``checkpoint.load`` (torch's ``set_state_dict``) before the first step, so it takes exactly the
    path of an uninterrupted run. A rank whose stages have no parameters (``nn.Identity()``, an
    activation) gets an AdamW over one empty group: nothing to step or save."""
    kwargs: dict[str, Any] = {"lr": cfg.optim.lr, **adamw_options(cfg)}
    if not params:  # torch refuses an empty parameter list, not an empty group
        return torch.optim.AdamW([{"params": []}], **kwargs)
    if cfg.parallel.zero and dp > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, process_group=dp_group, **kwargs)
    return torch.optim.AdamW(params, **kwargs)  # type: ignore[arg-type]


def adamw_options(cfg: TrainConfig) -> dict[str, Any]:
    """AdamW's options other than the learning rate (which ``set_lr`` sets every step): the configured
    weight decay, and betas and eps, which are fixed."""
    return {"betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": cfg.optim.weight_decay}


def apply_options(opt: torch.optim.Optimizer, cfg: TrainConfig) -> dict[str, tuple[Any, Any]]:
    """Put ``cfg``'s AdamW options (``adamw_options``) into every parameter group of ``opt`` and of its
    local optimizer (ZeRO), after a checkpoint's optimizer state was loaded: its parameter groups hold
    the options of the run that saved it, and the run goes on with what its config says (a
    ``--weight-decay`` given on resume). Returns the options that changed: name -> (old, new)."""
    options = adamw_options(cfg)
    changed: dict[str, tuple[Any, Any]] = {}
    for o in {id(x): x for x in (opt, local_opt(opt))}.values():
        for group in o.param_groups:
            for name, value in options.items():
                old = group.get(name)
                if (tuple(old) if isinstance(old, (list, tuple)) else old) != value:
                    changed.setdefault(name, (old, value))
                group[name] = value
    return changed


def local_opt(opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer holding this rank's state (ZeRO's local shard optimizer, or ``opt``)."""
    return getattr(opt, "optim", opt)


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr


def average_gradients(params: list[nn.Parameter], dp_group: Any, dp: int) -> None:
    """Mean of the replicas' gradients: one flat all-reduce per dtype, so every replica gets the same bits."""
    if dp == 1:
        return
    for grads in _by_dtype(params).values():
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=dp_group)
        _scatter_mean(flat, grads, dp)


class OverlappedAverage:
    """The data-parallel mean of each stage's gradients, started while the step still runs.

    The runtime calls ``launch(stage)`` right after the stage's last B or W of the step
    (``PipelineRunner(on_stage_gradients=...)``): its gradients are final, and their all-reduce
    (one flat tensor per dtype, ``async_op``) proceeds while the rank computes its other stages and
    exchanges activations. ``wait`` completes them, so it runs once per step, after the runner's
    step. Parameters in ``later`` (a tied embedding's copies, whose gradients are first summed
    across pipeline ranks) are left to ``average_gradients`` after that sum, as before."""

    def __init__(self, stage_params: dict[int, list[nn.Parameter]], dp_group: Any, dp: int,
                 later: Sequence[nn.Parameter] = ()) -> None:
        skip = {id(p) for p in later}
        self.stage_params = {s: [p for p in ps if id(p) not in skip] for s, ps in stage_params.items()}
        self.dp_group, self.dp = dp_group, dp
        self._inflight: list[tuple[Any, torch.Tensor, list[torch.Tensor]]] = []

    def launch(self, stage: int) -> None:
        for grads in _by_dtype(self.stage_params[stage]).values():
            flat = torch.cat([g.reshape(-1) for g in grads])
            self._inflight.append((dist.all_reduce(flat, group=self.dp_group, async_op=True), flat, grads))

    def wait(self) -> None:
        inflight, self._inflight = self._inflight, []
        for work, flat, grads in inflight:
            work.wait()
            _scatter_mean(flat, grads, self.dp)


def _by_dtype(params: list[nn.Parameter]) -> dict[torch.dtype, list[torch.Tensor]]:
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for p in params:
        if p.grad is not None:
            g = local_tensor(p.grad)
            by_dtype.setdefault(g.dtype, []).append(g)
    return by_dtype


def _scatter_mean(flat: torch.Tensor, grads: list[torch.Tensor], dp: int) -> None:
    flat.div_(dp)
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[offset:offset + n].view_as(g))
        offset += n


def is_partial(t: torch.Tensor) -> bool:
    """A DTensor holding on each rank of its mesh a summand of its value (``Partial``): the gradient of a
    parameter replicated over tensor parallelism that sequence parallelism feeds a shard of the
    sequence (the norms' weights), until ``replicate_partial_gradients`` sums it."""
    placements = getattr(t, "placements", None)
    return placements is not None and any(p.is_partial() for p in placements)


def replicate_partial_gradients(params: Iterable[nn.Parameter]) -> int:
    """Sum every ``Partial`` DTensor gradient over its mesh once, in place: ``p.grad`` becomes the
    ``Replicate`` DTensor of the sum (the placement its parameter has) in the summands' storage.

    Left ``Partial``, each DTensor op that reads it sums it again: AdamW's step three all-reduces per
    gradient (24 per step for the 2-layer GPT at tp 2), each of the same bits. The loop calls this
    after the data-parallel mean of the summands and before the norm, the clip and the step, which
    then read replicated gradients without a collective. One all-reduce (sum) per 1-D mesh and dtype
    of the concatenated summands (the same per-element sums as DTensor's; ``redistribute`` for any
    other mesh or reduction). Returns the number of gradients summed."""
    from torch.distributed.tensor import DTensor, Replicate

    flat_groups: dict[tuple[Any, torch.dtype], list[tuple[nn.Parameter, Any]]] = {}  # (parameter, gradient)
    count = 0
    with torch.no_grad():
        for p in params:
            g: Any = p.grad
            if g is None or not is_partial(g):
                continue
            count += 1
            if g.device_mesh.ndim == 1 and g.placements[0].reduce_op == "sum":
                flat_groups.setdefault((g.device_mesh, g.dtype), []).append((p, g))
            else:
                p.grad = g.redistribute(placements=[Replicate() if q.is_partial() else q for q in g.placements])
        for (mesh, _), group in flat_groups.items():
            summands = [local_tensor(g) for _, g in group]
            flat = torch.cat([t.reshape(-1) for t in summands])
            dist.all_reduce(flat, group=mesh.get_group())
            offset = 0
            for (p, g), t in zip(group, summands):
                t.copy_(flat[offset:offset + t.numel()].view_as(t))
                offset += t.numel()
                p.grad = DTensor.from_local(t, mesh, [Replicate()], run_check=False, shape=g.shape, stride=g.stride())
    return count


def global_grad_norm(named: dict[str, nn.Parameter], order: dict[str, int], dp_rank: int, tp_rank: int,
                     device: torch.device | None = None, dp_sharded: bool = False) -> float:
    """The gradient norm over the whole model, the same value on every rank of every layout.

    Each parameter's squared norm (accumulated in float64) goes into a slot of one vector indexed by
    its full name (one replica contributes, once per tensor-parallel shard; with ``dp_sharded``
    (FSDP) every replica, its shard's squares); one all-reduce over the world fills it and its sum,
    in name order, is independent of how the model is split. A gradient that tensor parallelism
    leaves as per-rank summands (``is_partial``: the sequence-parallel norms' weights) is the norm of
    its sum, counted once as any replicated gradient: the loop has summed it in place
    (``replicate_partial_gradients``), which this does first for any still ``Partial`` (every rank
    calls it). A whole tensor gives the same bits in every layout; a tensor split into shards (FSDP,
    tensor parallel) agrees to float64 rounding."""
    replicate_partial_gradients(named.values())  # nothing left to sum after the loop's call
    squares = torch.zeros(len(order), dtype=torch.float64, device=device)  # on the GPU for NCCL
    if dp_rank == 0 or dp_sharded:
        slots, grads = [], []
        for name, p in named.items():
            if p.grad is None or (tp_rank != 0 and not is_sharded(p)):
                continue
            slots.append(order[name])
            grads.append(local_tensor(p.grad).detach())
        if grads:  # one call: float64 accumulation of each tensor's squares, without float64 copies of it
            norms = torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float64)).to(squares.device)
            index = torch.tensor(slots, dtype=torch.long, device=squares.device)
            squares.index_copy_(0, index, norms.mul_(norms))  # each name has its own slot: one scatter
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(squares)
    return float(squares.sum().sqrt())


def clip_gradients(params: list[nn.Parameter], norm: float, max_norm: float) -> None:
    if max_norm <= 0 or not math.isfinite(norm) or norm <= max_norm:
        return
    scale = max_norm / (norm + 1e-6)
    grads = [local_tensor(p.grad) for p in params if p.grad is not None]
    if grads:
        torch._foreach_mul_(grads, scale)  # one call; per tensor the same multiply as ``mul_(scale)``
