"""Where `Trainer.train_step`'s time goes after the pipeline, per rank (2 gloo ranks, CPU).

The GPT and settings of ``benchmarks/train_throughput.py`` (``CFG``), ours only: every rank leaves a
barrier before each step, then the median over the measured steps of each part's wall and thread CPU
milliseconds: reading the batch, the runner's step (the pipeline), the gradient norm (its float64 sums
and its all-reduce, which waits for the last rank out of the pipeline), the measurements' all-reduce,
clipping, AdamW, ``zero_grad``, and the whole step. The parts are timed by wrapping the functions
``train_step`` calls, so what is not listed (bookkeeping) is the whole minus their sum.

    python benchmarks/train_step_parts.py [--schedule zb-v] [--steps 20]
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from train_throughput import CFG  # the same GPT and settings (a script's directory is on sys.path)

from pipeoffload.models import lm_loss
from pipeoffload.runtime.launch import spawn
from pipeoffload.train import loop
from pipeoffload.train.config import TrainConfig, validate
from pipeoffload.train.data import load_corpus
from pipeoffload.train.job import TokenBatches, lowered_schedule
from pipeoffload.train.mesh import build_context
from pipeoffload.train.model import gpt_rank_model

WARMUP = 5  # steps not measured: shapes inferred, first step measures memory


def _timed(fn: Callable[..., Any], label: str, times: dict[str, list[tuple[float, float]]]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            times.setdefault(label, []).append(((time.perf_counter() - wall) * 1e3, (time.thread_time() - cpu) * 1e3))
    return run


def worker(rank: int, world: int, cfg: TrainConfig, steps: int) -> dict[str, tuple[float, float]]:
    ctx = build_context(1, world, 1, torch.device("cpu"))
    corpus, _ = load_corpus("", "byte", None, cfg.model.seq_len, cfg.data.val_fraction)  # type: ignore[arg-type]
    schedule = lowered_schedule(cfg)
    trainer = loop.Trainer(cfg, ctx, schedule, gpt_rank_model(cfg, 256, schedule, rank, ctx.device), lm_loss,
                           TokenBatches(corpus, cfg), None)
    times: dict[str, list[tuple[float, float]]] = {}
    trainer.batches.train = _timed(trainer.batches.train, "batch", times)  # type: ignore[method-assign]
    trainer.runner.step = _timed(trainer.runner.step, "pipeline", times)  # type: ignore[method-assign]
    trainer._gather = _timed(trainer._gather, "measurements", times)  # type: ignore[method-assign]
    trainer.opt.step = _timed(trainer.opt.step, "AdamW", times)  # type: ignore[method-assign]
    trainer.opt.zero_grad = _timed(trainer.opt.zero_grad, "zero_grad", times)  # type: ignore[method-assign]
    real = loop.global_grad_norm, loop.clip_gradients
    loop.global_grad_norm = _timed(loop.global_grad_norm, "norm", times)  # type: ignore[assignment]
    loop.clip_gradients = _timed(loop.clip_gradients, "clip", times)  # type: ignore[assignment]
    step = _timed(trainer.train_step, "whole step", times)
    try:
        for s in range(WARMUP + steps):
            torch.distributed.barrier()
            step(measure=s == 0)
    finally:
        loop.global_grad_norm, loop.clip_gradients = real
    return {k: (statistics.median(w for w, _ in v[WARMUP:]), statistics.median(c for _, c in v[WARMUP:]))
            for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedule", default="zb-v")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    v = 1 if args.schedule == "1f1b" else 2
    cfg = validate(CFG.updated(schedule=args.schedule, stages_per_rank=v, pp=2, nproc=2))
    result = spawn(worker, 2, (cfg, args.steps), timeout=300, deadline=900)
    if not result.ok:
        raise SystemExit("\n".join(e for e in result.errors if e))
    print(f"{args.schedule}, 2 gloo ranks, median of {args.steps} steps: part wall / thread CPU ms")
    for rank, parts in enumerate(result.results):
        print(f"  rank {rank}: " + "  ".join(f"{k} {w:.2f}/{c:.2f}" for k, (w, c) in parts.items()))


if __name__ == "__main__":
    main()
