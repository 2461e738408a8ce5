"""Cost of the split backward: I + W against a full backward B, per microbatch of one GPT stage.

One middle stage (3 GPT blocks, hidden 128, sequence 128, 2 sequences per microbatch, 1 thread),
its forward run through pipeoffload's ``PipelineStage`` and activation store; then either B, or I
then W (``PipelineStage.backward_input``/``backward_weight``, which also releases after I what W
does not need). The same forward is also split the way torch.distributed.pipelining's stages do it
(``stage_backward_input``/``stage_backward_weight``), for comparison. Process CPU time (less
sensitive to other load on a shared machine than wall time), median over microbatches.

    .venv/bin/python benchmarks/split_backward.py [--microbatches 20] [--repeats 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from pipeoffload.models import GPTConfig, StageModule, gpt_layers
from pipeoffload.runtime.offload import ActivationStore
from pipeoffload.runtime.stage import PipelineStage

CFG = GPTConfig(vocab=256, seq=128, hidden=128, heads=4, layers=6, max_offset=0)


def _ours(stage: PipelineStage, x: torch.Tensor, split: bool) -> tuple[float, float]:
    out = stage.forward(0, (x.detach().requires_grad_(), None, 0))
    grads = [torch.ones_like(out[0])]
    start = time.process_time()
    if not split:
        stage.backward(0, grads)
        end = time.process_time()
        stage.store.release(stage.index, 0)
        return end - start, 0.0
    stage.backward_input(0, grads)
    mid = time.process_time()
    stage.backward_weight(0)
    end = time.process_time()
    stage.store.release(stage.index, 0)
    return mid - start, end - mid


def _torch(module: torch.nn.Module, x: torch.Tensor) -> tuple[float, float]:
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    inp = x.detach().requires_grad_()
    out = module(inp, None, 0)[0]
    start = time.process_time()
    _, groups = stage_backward_input([out], [torch.ones_like(out)], [inp], module.parameters())
    mid = time.process_time()
    stage_backward_weight(module.parameters(), groups)
    return mid - start, time.process_time() - mid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--microbatches", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    module = StageModule(*gpt_layers(CFG, seed=0)[3:6])
    stage = PipelineStage(module, 1, 3, ActivationStore("cpu", list(module.parameters())))
    x = torch.randn(2, CFG.seq, CFG.hidden)
    print(f"torch {torch.__version__}; 3 GPT blocks, hidden {CFG.hidden}, seq {CFG.seq}, 2 sequences per microbatch; "
          f"process CPU ms per microbatch, median of {args.microbatches}; load average {os.getloadavg()[0]:.2f} "
          f"({os.cpu_count()} CPUs)")
    for _ in range(3):
        _ours(stage, x, False), _ours(stage, x, True), _torch(module, x)
    for _ in range(args.repeats):
        b = statistics.median(_ours(stage, x, False)[0] for _ in range(args.microbatches))
        ours = [_ours(stage, x, True) for _ in range(args.microbatches)]
        theirs = [_torch(module, x) for _ in range(args.microbatches)]
        oi, ow = (statistics.median(c) for c in zip(*ours))
        ti, tw = (statistics.median(c) for c in zip(*theirs))
        print(f"B {b * 1e3:5.1f} | ours I {oi * 1e3:5.1f} + W {ow * 1e3:5.1f} = {(oi + ow) / b:.2f} B | "
              f"torch.distributed.pipelining I {ti * 1e3:5.1f} + W {tw * 1e3:5.1f} = {(ti + tw) / b:.2f} B")
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
