"""Workers for the tensor-parallel tests (imported by name in spawned children)."""
from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from pipeoffload import generate, lower
from pipeoffload.models import GPTConfig, build_rank_stages, even_counts, gpt_layers, lm_loss, sample_batch
from pipeoffload.models.split import StageModule
from pipeoffload.models.tensor_parallel import clip_grad_norm, parallelize_gpt_stage
from pipeoffload.runtime import PipelineRunner

CFG = GPTConfig(vocab=32, seq=8, hidden=16, heads=4, layers=2)


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _grad_diffs(sharded: torch.nn.Module, ref: torch.nn.Module) -> dict[str, float]:
    out = {}
    for (name, p), q in zip(sharded.named_parameters(), ref.parameters()):
        out[name] = float("inf") if p.grad is None else (_full(p.grad) - q.grad).abs().max().item()
    return out


def tp_worker(rank: int, world: int) -> dict[str, Any]:
    """On a 2 (pipeline) x 2 (tensor) mesh of 4 ranks: both tensor-parallel modes of a module on the
    tensor-parallel sub-mesh, then a 2-rank pipeline of sharded stages."""
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("pp", "tp"))
    result = {sp: tp_module_check(mesh["tp"], sp) for sp in ("plain", "sequence_parallel")}
    result["pipeline"] = tp_pipeline_run(mesh, "1f1b", "all")
    return result


def tp_module_check(mesh: Any, mode: str) -> dict[str, Any]:
    """A block stage (hidden in, hidden out) and the whole model (tokens in, logits out), sharded
    over the mesh, against the unsharded modules."""
    sp = mode == "sequence_parallel"
    layers = gpt_layers(CFG, seed=0)
    (tokens, mask, offset), targets = sample_batch(CFG, 4, seed=1)
    result: dict[str, Any] = {}
    # a middle stage: two blocks; its input needs a gradient
    ref, tp = StageModule(*copy.deepcopy(layers[1:3])), StageModule(*copy.deepcopy(layers[1:3]))
    parallelize_gpt_stage(tp, mesh, sequence_parallel=sp)
    x = torch.randn(4, CFG.seq, CFG.hidden, generator=torch.Generator().manual_seed(2))  # equal on every rank
    x_ref, x_tp = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ref, y_tp = ref(x_ref, mask, offset)[0], tp(x_tp, mask, offset)[0]
    result["block_plain"] = type(y_tp) is torch.Tensor
    w = torch.randn(y_ref.shape, generator=torch.Generator().manual_seed(3))
    (y_ref * w).sum().backward()
    (y_tp * w).sum().backward()
    result["block_out"] = (y_tp - y_ref).abs().max().item()
    result["block_in_grad"] = (x_tp.grad - x_ref.grad).abs().max().item()
    result["block_grads"] = _grad_diffs(tp, ref)
    result["sharded"] = sorted(n for n, p in tp.named_parameters() if isinstance(p, DTensor))
    # the whole model, loss included
    ref, tp = StageModule(*copy.deepcopy(layers)), StageModule(*copy.deepcopy(layers))
    parallelize_gpt_stage(tp, mesh, sequence_parallel=sp)
    loss_ref, loss_tp = lm_loss(ref(tokens, mask, offset), targets), lm_loss(tp(tokens, mask, offset), targets)
    loss_ref.backward()
    loss_tp.backward()
    result["model_loss"] = abs(loss_tp.item() - loss_ref.item())
    result["model_grads"] = _grad_diffs(tp, ref)
    norm_ref = float(torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.1))
    result["norm"] = (clip_grad_norm(tp.parameters(), 0.1), norm_ref)
    result["clipped_grads"] = _grad_diffs(tp, ref)
    return result


def tp_pipeline_run(mesh: Any, schedule_name: str, offload: str) -> dict[str, Any]:
    """A pipeline over the mesh's "pp" dimension of stages sharded over its "tp" dimension; 2 SGD
    steps compared with one process."""
    pp = mesh["pp"].size()
    pp_group, pp_rank = mesh["pp"].get_group(), mesh["pp"].get_local_rank()
    microbatches = 2 * pp
    schedule = lower(generate(schedule_name, pp, microbatches), offload=offload)
    layers = gpt_layers(CFG, seed=0)
    ref_model = StageModule(*copy.deepcopy(layers))
    counts = even_counts(len(layers), schedule.num_stages)
    stages = build_rank_stages(layers, counts, schedule.placement, pp_rank)
    for module in stages.values():
        parallelize_gpt_stage(module, mesh["tp"])
    runner = PipelineRunner(stages, schedule, pp_rank, group=pp_group, loss_fn=lm_loss, timeout=60,
                            min_offload_bytes=256)
    params = [p for m in stages.values() for p in m.parameters()]
    opt = torch.optim.SGD(params, lr=0.1)
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.1)
    starts = {s: sum(counts[:s]) for s in range(len(counts))}
    out: dict[str, Any] = {"loss": [], "grad": [], "end_bytes": [], "peak": []}
    for step in range(2):
        (tokens, mask, offset), targets = sample_batch(CFG, 2 * microbatches, seed=10 + step)
        loss = runner.step((tokens, mask, offset), targets)
        ref_loss = torch.zeros(())
        for tok, msk, tgt in zip(tokens.tensor_split(microbatches), mask.tensor_split(microbatches),
                                 targets.tensor_split(microbatches)):
            part = lm_loss(ref_model(tok, msk, offset), tgt) / microbatches
            part.backward()
            ref_loss = ref_loss + part.detach()
        if loss is not None:
            out["loss"].append(abs(loss.item() - ref_loss.item()))
        worst = 0.0
        for s, module in stages.items():
            for j, layer in enumerate(module):
                for p, q in zip(layer.parameters(), ref_model[starts[s] + j].parameters()):
                    worst = max(worst, (_full(p.grad) - q.grad).abs().max().item())
        out["grad"].append(worst)
        out["end_bytes"].append(runner.trace.end_bytes)
        out["peak"].append(runner.trace.peak_bytes)
        opt.step()
        opt.zero_grad()
        ref_opt.step()
        ref_opt.zero_grad()
    dist.barrier()
    return out


def tp_grad_norm_worker(rank: int, world: int) -> tuple[float, float]:
    """The whole GPT sharded over ``world`` tensor-parallel ranks (sequence parallel) in float64: train's
    ``global_grad_norm`` of its gradients, and the norm of the unsharded model's gradients."""
    from pipeoffload.train.optim import global_grad_norm

    torch.set_default_dtype(torch.float64)
    mesh = init_device_mesh("cpu", (world,))
    layers = gpt_layers(CFG, seed=0)
    ref, tp = StageModule(*copy.deepcopy(layers)), StageModule(*copy.deepcopy(layers))
    parallelize_gpt_stage(tp, mesh)
    (tokens, mask, offset), targets = sample_batch(CFG, 2, seed=1)
    lm_loss(ref(tokens, mask, offset), targets).backward()
    lm_loss(tp(tokens, mask, offset), targets).backward()
    named = dict(tp.named_parameters())
    order = {name: i for i, name in enumerate(named)}
    norm = global_grad_norm(named, order, dp_rank=0, tp_rank=rank)
    norm_ref = float(torch.stack([p.grad.pow(2).sum() for p in ref.parameters()]).sum().sqrt())
    return norm, norm_ref
