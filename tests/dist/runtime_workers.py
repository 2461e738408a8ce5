"""Workers for the runtime's robustness tests (imported by name in spawned children)."""
from __future__ import annotations

import os
import signal
import time
from typing import Any

import torch
from torch import nn

from pipeoffload import generate, lower
from pipeoffload.costs import CostModel
from pipeoffload.models import GPTConfig, build_rank_stages, even_counts, gpt_layers, lm_loss, sample_batch
from pipeoffload.runtime import PipelineRunner


class DictOut(nn.Module):
    """Stage 0: takes ``{"x": tensor}``, returns a dict nesting a list (tensor, int) and a tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, batch: dict) -> dict:
        h = torch.tanh(self.a(batch["x"]))
        return {"h": h, "aux": [self.b(h), 3], "mask": batch["x"] > 0}


class DictIn(nn.Module):
    """Stage 1: consumes the dict."""

    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Linear(8, 3)
        self.d = nn.Linear(6, 3, bias=False)

    def forward(self, d: dict) -> torch.Tensor:
        scale = d["aux"][1]
        return self.c(d["h"] * d["aux"][0]) * scale + self.d(d["mask"].float())


def _container_modules() -> list[nn.Module]:
    torch.manual_seed(0)
    return [DictOut(), DictIn()]


def _container_batches(steps: int) -> list[tuple[dict, torch.Tensor]]:
    gen = torch.Generator().manual_seed(3)
    return [({"x": torch.randn(8, 6, generator=gen)}, torch.randn(8, 3, generator=gen)) for _ in range(steps)]


def container_worker(rank: int, world: int, microbatches: int = 4, steps: int = 2) -> dict:
    """Two ranks pass a dict (with a nested list) between stages; compare with one process."""
    schedule = lower(generate("1f1b", world, microbatches))
    modules = _container_modules()
    stages = {rank: modules[rank]}
    runner = PipelineRunner(stages, schedule, rank, loss_fn=nn.functional.mse_loss, timeout=60)
    ref_modules = _container_modules()
    opt = torch.optim.SGD(modules[rank].parameters(), lr=0.1)
    ref_opt = torch.optim.SGD([p for m in ref_modules for p in m.parameters()], lr=0.1)
    out: dict[str, Any] = {"loss_diff": [], "grad_diff": [], "tensor": torch.full((2,), float(rank)),
                           "launcher": {k: os.environ.get(k) for k in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_MAX_RESTARTS")}}
    for batch, target in _container_batches(steps):
        loss = runner.step(batch, target)
        ref_loss = torch.zeros(())
        for x, y in zip(batch["x"].tensor_split(microbatches), target.tensor_split(microbatches)):
            part = nn.functional.mse_loss(ref_modules[1](ref_modules[0]({"x": x})), y) / microbatches
            part.backward()
            ref_loss = ref_loss + part.detach()
        if loss is not None:
            out["loss_diff"].append(abs(loss.item() - ref_loss.item()))
        diffs = [(p.grad - q.grad).abs().max().item() if p.grad is not None else float("inf")
                 for p, q in zip(modules[rank].parameters(), ref_modules[rank].parameters())]
        out["grad_diff"].append(max(diffs))
        opt.step()
        opt.zero_grad()
        ref_opt.step()
        ref_opt.zero_grad()
    return out


def _gpt_runner(rank: int, world: int, timeout: float, microbatches: int) -> tuple[PipelineRunner, list]:
    cfg = GPTConfig(vocab=32, seq=8, hidden=16, heads=2, layers=4)
    schedule = lower(generate("1f1b", world, microbatches))
    layers = gpt_layers(cfg, seed=0)
    stages = build_rank_stages(layers, even_counts(len(layers), schedule.num_stages), schedule.placement, rank)
    runner = PipelineRunner(stages, schedule, rank, loss_fn=lm_loss, timeout=timeout)
    batches = [sample_batch(cfg, 2 * microbatches, seed=s) for s in range(50)]
    return runner, batches


def stuck_worker(rank: int, world: int, bad_rank: int, how: str, timeout: float, stamp: str) -> None:
    """Every rank trains; after one step ``bad_rank`` writes the time to ``stamp`` and stops
    (SIGSTOP) or dies (SIGKILL)."""
    runner, batches = _gpt_runner(rank, world, timeout, 2 * world)
    for step, (inputs, targets) in enumerate(batches):
        if step == 1 and rank == bad_rank:
            with open(stamp, "w") as fh:
                fh.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGSTOP if how == "stop" else signal.SIGKILL)
            time.sleep(3600)
        runner.step(inputs, targets)


def mismatch_worker(rank: int, world: int) -> str:
    """Rank 1 builds its runner from another schedule (gpipe instead of 1f1b)."""
    cfg = GPTConfig(vocab=32, seq=8, hidden=16, heads=2, layers=2)
    schedule = lower(generate("1f1b" if rank == 0 else "gpipe", world, 4))
    layers = gpt_layers(cfg, seed=0)
    stages = build_rank_stages(layers, even_counts(len(layers), schedule.num_stages), schedule.placement, rank)
    runner = PipelineRunner(stages, schedule, rank, loss_fn=lm_loss, timeout=30)
    inputs, targets = sample_batch(cfg, 8)
    runner.step(inputs, targets)
    return "no error"


def _saving_output_layers() -> list[nn.Module]:
    """Eight layers whose last op saves its own output (ReLU): every stage's output is both a saved
    activation of its slot and the tensor sent to the next stage."""
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(8)]


def saved_output_worker(rank: int, world: int, cases: list[tuple], microbatches: int = 4) -> list[dict]:
    """Per (schedule, offload, recompute[, k the copies are planned for]) case, two steps of ``_saving_output_layers``: the last step's trace, each
    stage's slot bytes and bytes kept after I, and whether the loss and every gradient equal one process's
    (bit for bit)."""
    out = []
    gen = torch.Generator().manual_seed(5)
    rows = 32 * microbatches  # 8 KiB per boundary tensor: above min_offload_bytes
    inputs, targets = torch.randn(rows, 64, generator=gen), torch.randn(rows, 64, generator=gen)
    reference = _saving_output_layers()
    ref_loss = torch.zeros(())
    for x, y in zip(inputs.tensor_split(microbatches), targets.tensor_split(microbatches)):
        h = x
        for layer in reference:
            h = layer(h)
        part = nn.functional.mse_loss(h, y) / microbatches
        part.backward()
        ref_loss = ref_loss + part.detach()
    for name, offload, recompute, *k in cases:
        costs = CostModel().with_offload_ratio(k[0]) if k else None  # as ``train --offload-ratio`` plans them
        schedule = lower(generate(name, world, microbatches), costs, offload=offload, recompute=recompute)
        layers = _saving_output_layers()
        counts = even_counts(len(layers), schedule.num_stages)
        stages = build_rank_stages(layers, counts, schedule.placement, rank)
        runner = PipelineRunner(stages, schedule, rank, loss_fn=nn.functional.mse_loss, timeout=60)
        for _ in range(2):
            for m in stages.values():
                m.zero_grad(set_to_none=True)
            loss = runner.step(inputs, targets)
        starts = [sum(counts[:s]) for s in range(len(counts))]
        exact = True
        for s, m in stages.items():
            ref = [p for layer in reference[starts[s]:starts[s] + counts[s]] for p in layer.parameters()]
            mine = list(m.parameters())
            exact = exact and len(mine) == len(ref) and all(p.grad is not None and torch.equal(p.grad, q.grad)
                                                            for p, q in zip(mine, ref))
        assert runner.trace is not None
        out.append({"trace": runner.trace.as_dict(), "slot_bytes": dict(runner.slot_bytes),
                    "w_bytes": dict(runner.w_bytes), "schedule": schedule.to_json(),
                    "exact": exact and (loss is None or torch.equal(loss, ref_loss))})
        runner.close()
    return out


def crash_worker(rank: int, world: int, bad_rank: int) -> int:
    """``bad_rank`` dies of SIGSEGV in C code (a read at address 0); the others wait on it."""
    import ctypes
    import time

    import torch.distributed as dist

    if rank == bad_rank:
        time.sleep(0.2)
        ctypes.string_at(0)
    dist.barrier()
    return rank
