"""Modules that update buffers in their forward (BatchNorm) under recompute: R replays the forward
for autograd only, so running statistics are updated once per microbatch, as without recompute."""
from __future__ import annotations

import torch
from torch import nn

from pipeoffload import generate, lower
from pipeoffload.runtime import PipelineRunner


def _stages(seed: int = 0) -> dict[int, nn.Module]:
    torch.manual_seed(seed)
    return {0: nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU()),
            1: nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))}


def _train(recompute: str, steps: int = 3) -> tuple[dict[int, nn.Module], list[float]]:
    schedule = lower(generate("interleaved-1f1b", 1, 4, 2), recompute=recompute)
    stages = _stages()
    runner = PipelineRunner(stages, schedule, 0, loss_fn=nn.functional.mse_loss, min_offload_bytes=0)
    opt = torch.optim.SGD([p for m in stages.values() for p in m.parameters()], lr=0.1)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(16, 6, generator=gen), torch.randn(16, 3, generator=gen)
        losses.append(runner.step(x, y).item())
        opt.step()
        opt.zero_grad()
    return stages, losses


def test_recompute_updates_running_statistics_once():
    plain, plain_losses = _train("none")
    again, again_losses = _train("all")
    assert again_losses == plain_losses
    for s in plain:
        bn_plain = [m for m in plain[s] if isinstance(m, nn.BatchNorm1d)][0]
        bn_again = [m for m in again[s] if isinstance(m, nn.BatchNorm1d)][0]
        assert int(bn_plain.num_batches_tracked) == 3 * 4
        assert int(bn_again.num_batches_tracked) == int(bn_plain.num_batches_tracked)
        assert torch.allclose(bn_again.running_mean, bn_plain.running_mean, atol=1e-6, rtol=0)
        assert torch.allclose(bn_again.running_var, bn_plain.running_var, atol=1e-6, rtol=0)
        for p, q in zip(plain[s].parameters(), again[s].parameters()):
            assert torch.allclose(p, q, atol=1e-6, rtol=0)
