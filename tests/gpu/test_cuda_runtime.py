"""CUDA paths of the runtime: copy streams, events, pinned buffers (skipped without a GPU)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from pipeoffload import generate
from pipeoffload.ir import Action, ActionKind
from pipeoffload.models import GPTConfig, build_rank_stages, even_counts, gpt_layers, lm_loss, sample_batch
from pipeoffload.runtime import PipelineRunner

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
K = ActionKind
CFG = GPTConfig(vocab=128, seq=64, hidden=128, heads=4, layers=4)


def _offload_all(schedule):
    rows = []
    for a in schedule.actions[0]:
        if a.kind == K.B:
            rows.append(Action(K.RELOAD, a.stage, a.microbatch))
        rows.append(a)
        if a.kind == K.F:
            rows.append(Action(K.OFFLOAD, a.stage, a.microbatch))
    return schedule.with_actions([rows])


def test_offload_on_cuda_is_a_pure_copy_and_releases_device_memory():
    device = torch.device("cuda", torch.cuda.current_device())
    base = generate("interleaved-1f1b", 1, 4, 2)
    inputs, targets = sample_batch(CFG, 8, seed=0)
    results = []
    for schedule in (base, _offload_all(base)):
        layers = [layer.to(device) for layer in gpt_layers(CFG, seed=0)]
        stages = build_rank_stages(layers, even_counts(len(layers), 2), schedule.placement, 0)
        runner = PipelineRunner(stages, schedule, 0, loss_fn=lm_loss, device=device)
        runner.step(inputs, targets)  # warm-up: allocator, pinned pool
        torch.cuda.synchronize()
        for module in stages.values():
            module.zero_grad(set_to_none=True)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        loss = runner.step(inputs, targets).cpu()
        torch.cuda.synchronize()
        # to the host, so that the copies kept for the comparison are not counted as left behind
        grads = [p.grad.cpu() for s in sorted(stages) for p in stages[s].parameters()]
        for module in stages.values():
            module.zero_grad(set_to_none=True)
        results.append((loss, grads, torch.cuda.max_memory_allocated(device) - before, runner))
        assert runner.trace.end_bytes == 0
        assert torch.cuda.memory_allocated(device) <= before  # nothing left behind by the step
    (l0, g0, peak0, _), (l1, g1, peak1, runner) = results
    assert torch.equal(l0, l1) and all(torch.equal(a, b) for a, b in zip(g0, g1))
    assert peak1 < peak0
    stats = runner.store.copier.stats
    assert stats.d2h_copies > 0 and stats.d2h_copies == stats.h2d_copies and stats.gbps("d2h") > 0


def test_replay_benchmark_small_on_cuda():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import gpu_offload_replay

    rows = gpu_offload_replay.main(["--device", "cuda", "--hidden", "256", "--seq", "256", "--heads", "4",
                                    "--microbatches", "8", "--steps", "2"])
    none, full = rows
    assert none["end_bytes"] == 0 and full["end_bytes"] == 0
    assert full["store_peak_mb"] < none["store_peak_mb"]
    assert full["peak_allocated_mb"] < none["peak_allocated_mb"]
