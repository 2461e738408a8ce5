"""Tokens/s of `pipeoffload train`'s step vs the same GPT and schedule on torch.distributed.pipelining.

Both run on the same spawned gloo ranks, alternating step by step: ours is the whole training step
of ``pipeoffload.train.loop.Trainer`` (pipeline step, gradient clipping, AdamW, the per-step metrics
gather); theirs is ``Schedule1F1B``/``ScheduleInterleaved1F1B`` over the same stage modules plus
AdamW. The median step of each is reported, one run (a shared 2-core machine is noisy).

    python benchmarks/train_throughput.py [--ranks 2] [--steps 20]
"""
from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from pipeoffload.models import lm_loss
from pipeoffload.runtime.launch import spawn
from pipeoffload.train.config import TrainConfig, validate
from pipeoffload.train.data import load_corpus
from pipeoffload.train.job import TokenBatches, lowered_schedule
from pipeoffload.train.loop import Trainer
from pipeoffload.train.mesh import build_context
from pipeoffload.train.model import gpt_rank_model

CFG = TrainConfig(layers=6, hidden=128, heads=4, seq_len=128, global_batch=16, microbatches=8, steps=1000,
                  warmup=5, lr=1e-3, progress=False)


class TorchStage(nn.Module):
    """A GPT stage as torch.distributed.pipelining wants it: one tensor in, one tensor out."""

    def __init__(self, stage: nn.Module) -> None:
        super().__init__()
        self.stage = stage

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.stage(x, None, 0)
        return out[0] if isinstance(out, tuple) else out


def worker(rank: int, world: int, cfg: TrainConfig, steps: int) -> list[dict[str, Any]]:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B

    ctx = build_context(1, world, 1, torch.device("cpu"))
    corpus, _ = load_corpus("", "byte", None, cfg.seq_len, cfg.val_fraction)  # type: ignore[arg-type]
    batches = TokenBatches(corpus, cfg)
    schedule = lowered_schedule(cfg)
    ours = Trainer(cfg, ctx, schedule, gpt_rank_model(cfg, 256, schedule, rank, ctx.device), lm_loss, batches, None)
    theirs_model = gpt_rank_model(cfg, 256, schedule, rank, ctx.device)
    stages = [PipelineStage(TorchStage(m), s, schedule.num_stages, ctx.device, group=ctx.pp_group)
              for s, m in sorted(theirs_model.stages.items())]
    sched = Schedule1F1B(stages[0], cfg.microbatches, loss_fn=lm_loss) if cfg.stages_per_rank == 1 else \
        ScheduleInterleaved1F1B(stages, cfg.microbatches, loss_fn=lm_loss)
    opt = torch.optim.AdamW(theirs_model.parameters(), lr=cfg.lr)
    holds_first, holds_last = 0 in theirs_model.stages, schedule.num_stages - 1 in theirs_model.stages

    def their_step(step: int) -> None:
        (tokens, _, _), targets = batches.train(step, 0)
        kwargs: dict[str, Any] = {"target": targets, "losses": []} if holds_last else {}
        if holds_first:
            sched.step(tokens, **kwargs)
        else:
            sched.step(**kwargs)
        opt.step()
        opt.zero_grad(set_to_none=True)

    times: dict[str, list[float]] = {"ours": [], "torch": []}
    for step in range(steps + 2):
        for label, fn in (("ours", lambda s=step: ours.train_step()), ("torch", lambda s=step: their_step(s))):
            dist.barrier()
            start = time.perf_counter()
            fn()
            if step >= 2:  # the first two steps infer shapes and warm up
                times[label].append(time.perf_counter() - start)
    tokens = cfg.global_batch * cfg.seq_len
    return [{"label": k, "tokens_per_s": tokens / statistics.median(v), "median_step_s": statistics.median(v)}
            for k, v in times.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    print(f"GPT {CFG.layers} blocks, hidden {CFG.hidden}, seq {CFG.seq_len}, global batch {CFG.global_batch}, "
          f"{CFG.microbatches} microbatches, {args.ranks} gloo ranks (1 thread each), median of {args.steps} steps")
    for schedule, v in (("1f1b", 1), ("interleaved-1f1b", 2)):
        cfg = validate(replace(CFG, schedule=schedule, stages_per_rank=v, pp=args.ranks, nproc=args.ranks))
        result = spawn(worker, args.ranks, (cfg, args.steps), timeout=300, deadline=1800)
        if not result.ok:
            raise SystemExit("\n".join(e for e in result.errors if e))
        rows = {r["label"]: r for r in result.results[0]}
        ratio = rows["ours"]["tokens_per_s"] / rows["torch"]["tokens_per_s"]
        print(f"{schedule:17} v={v}: ours {rows['ours']['tokens_per_s']:8.0f} tokens/s "
              f"({rows['ours']['median_step_s'] * 1e3:.0f} ms/step), torch.distributed.pipelining "
              f"{rows['torch']['tokens_per_s']:8.0f} tokens/s ({rows['torch']['median_step_s'] * 1e3:.0f} ms/step); "
              f"ratio ours/torch {ratio:.2f}")


if __name__ == "__main__":
    main()
