"""Tokens/s of `pipeoffload train`'s step vs the same GPT and schedule on torch.distributed.pipelining.

Both run on the same spawned gloo ranks (1 intra-op thread each), on the same stage modules (two
copies with the same initial weights) and the same microbatches, step by step in alternating order
(ours first on even steps, torch first on odd ones, so neither always runs right after the barrier).
What each timed step includes:

- ours: the whole ``pipeoffload.train.loop.Trainer.train_step``: the pipeline step through
  ``PipelineRunner`` (activation store with saved-tensor hooks and the per-action trace), the
  global gradient norm and clipping (one all-reduce over the ranks), AdamW, the all-reduce that
  gathers every rank's measurements (loss, stop flag; on measured steps peaks and slot bytes), and
  the metrics record (with the cached simulated peak).
- torch: the schedule of the same family (``THEIRS``: ``Schedule1F1B``, ``ScheduleInterleaved1F1B``,
  ``ScheduleInterleavedZeroBubble`` for zb-h1 with 2 stages per rank, ``ScheduleZBVZeroBubble``,
  ``ScheduleDualPipeV``) ``.step``, the same global-norm clipping done the way
  a ``torch.distributed.pipelining`` user does it (each rank's squared gradient norm, one all-reduce
  over the pipeline ranks, ``clip_grad_norm_``'s scaling), and AdamW with ours' settings (betas, weight
  decay, the default implementation); no metrics. ``--no-clip`` turns clipping off on both sides.

Every rank leaves a barrier before each timed step, so a step lasts until its slowest rank is done:
the reported step time is the median over steps of the slowest rank's time (torch's step ends with
no collective, so one rank's own time would leave out the imbalance that the next step's wait pays;
ours ends with the measurements' all-reduce, which makes every rank wait for the last). Per rank, the
median of each part is printed: ours' pipeline step (``runner.trace.wall``), its norm+clip+AdamW,
its metrics record; torch's schedule step and AdamW.
``--measure every`` has ours measure the activation memory on every step, as ``Trainer`` asks by
default (saved-tensor hooks on every forward, ``metrics.jsonl``'s peak fields filled each step);
``--measure first`` (the default here) measures on the first step only, as a trainer that logs
memory now and then would: the other steps run with no hooks (``PipelineRunner.step(measure=False)``)
on ranks that neither offload nor split the backward. torch measures nothing.
The process CPU time per step (``time.process_time``: this rank's threads, gloo's included; waits
that sleep do not count) is printed too: it is less sensitive to the other load on the machine than
wall time; so is its part after the pipeline step (ours: after ``PipelineRunner.step`` returned; torch:
after the schedule's step), the norm, clipping and AdamW that both sides do alike. So are the minor page faults per step (``getrusage``: the process, its threads
included), which the load does not change at all: a page fault is a freed block the C library gave
back to the OS and took again (``pipeoffload.runtime.hostmem``; ``PIPEOFFLOAD_KEEP_FREED_MEMORY=0``
runs both sides with glibc's default thresholds). The load average (``os.getloadavg``) before and
after is printed: a shared 2-core machine is noisy.

``--messages`` times, per step and rank, each side's posting of messages and its waits for them (wall
and thread CPU): ours' ``Transport.post``/``wait`` (the runner's Python around gloo's send/recv
included), torch's ``_batch_p2p``/``_wait_batch_p2p`` (its P2P ops and the same gloo calls).

    python benchmarks/train_throughput.py [--ranks 2] [--steps 30] [--messages]
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
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

CFG = TrainConfig.build(layers=6, hidden=128, heads=4, seq_len=128, global_batch=16, microbatches=8, steps=1000,
                  warmup=5, lr=1e-3, progress=False)


# Our schedule family -> torch.distributed.pipelining's schedule run against it (2 stages per rank but for 1f1b:
# interleaved placement for interleaved-1f1b and zb-h1, V placement for zb-v and dualpipe-v, as both sides place them).
THEIRS = {"1f1b": "Schedule1F1B", "interleaved-1f1b": "ScheduleInterleaved1F1B",
          "zb-h1": "ScheduleInterleavedZeroBubble", "zb-v": "ScheduleZBVZeroBubble", "dualpipe-v": "ScheduleDualPipeV"}


class TorchStage(nn.Module):
    """A GPT stage as torch.distributed.pipelining wants it: one tensor in, one tensor out."""

    def __init__(self, stage: nn.Module) -> None:
        super().__init__()
        self.stage = stage

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.stage(x, None, 0)
        return out[0] if isinstance(out, tuple) else out


class MessageClock:
    """Per step: the messages posted, and the wall and thread CPU seconds spent posting and waiting for them."""

    def __init__(self) -> None:
        self.totals = [0.0] * 5  # messages, post wall, post thread CPU, wait wall, wait thread CPU

    def wrap(self, fn: Any, slot: int, count: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                t = self.totals
                t[0] += count(*args) if count else 0
                t[slot] += time.perf_counter() - wall
                t[slot + 1] += time.thread_time() - cpu
        return timed

    def take(self) -> list[float]:
        out, self.totals = self.totals, [0.0] * 5
        return out


def time_messages(ours: Trainer) -> tuple[MessageClock, MessageClock]:
    """Time both sides' posting and waiting: ours' ``Transport.post``/``wait``, torch's ``_batch_p2p`` and
    ``_wait_batch_p2p`` (what its schedules call for every exchange; private to torch)."""
    import torch.distributed.pipelining.schedules as their_schedules

    mine, theirs = MessageClock(), MessageClock()
    transport: Any = ours.runner.transport
    transport.post = mine.wrap(transport.post, 1, lambda sends, recvs: len(sends) + len(recvs))
    transport.wait = mine.wrap(transport.wait, 3, None)
    their_schedules._batch_p2p = theirs.wrap(their_schedules._batch_p2p, 1, lambda ops, *_: len(ops))
    their_schedules._wait_batch_p2p = theirs.wrap(their_schedules._wait_batch_p2p, 3, None)
    return mine, theirs


def worker(rank: int, world: int, cfg: TrainConfig, steps: int, measure: str,
           messages: bool = False) -> dict[str, list[float]]:
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleDualPipeV,
        ScheduleInterleaved1F1B,
        ScheduleInterleavedZeroBubble,
        ScheduleZBVZeroBubble,
    )

    ctx = build_context(1, world, 1, torch.device("cpu"))
    corpus, _ = load_corpus("", "byte", None, cfg.model.seq_len, cfg.data.val_fraction)  # type: ignore[arg-type]
    batches = TokenBatches(corpus, cfg)
    schedule = lowered_schedule(cfg)
    ours = Trainer(cfg, ctx, schedule, gpt_rank_model(cfg, 256, schedule, rank, ctx.device), lm_loss, batches, None)
    theirs_model = gpt_rank_model(cfg, 256, schedule, rank, ctx.device)
    stages = [PipelineStage(TorchStage(m), s, schedule.num_stages, ctx.device, group=ctx.pp_group)
              for s, m in sorted(theirs_model.stages.items())]
    m = cfg.schedule.microbatches
    if cfg.schedule.family == "zb-v":
        sched: Any = ScheduleZBVZeroBubble(stages, m, loss_fn=lm_loss)
    elif cfg.schedule.family == "dualpipe-v":
        sched = ScheduleDualPipeV(stages, m, loss_fn=lm_loss)
    elif cfg.schedule.family == "zb-h1":  # with 2 stages per rank in a loop: torch's interleaved ZB1P
        sched = ScheduleInterleavedZeroBubble(stages, m, loss_fn=lm_loss)
    elif cfg.schedule.stages_per_rank == 1:
        sched = Schedule1F1B(stages[0], m, loss_fn=lm_loss)
    else:
        sched = ScheduleInterleaved1F1B(stages, m, loss_fn=lm_loss)
    # the same AdamW as ours (pipeoffload.train.optim.make_optimizer: betas, weight decay; torch's default
    # per-tensor implementation on CPU on both sides), so the update does the same work
    opt = torch.optim.AdamW(theirs_model.parameters(), lr=cfg.optim.lr, betas=(0.9, 0.95),
                            weight_decay=cfg.optim.weight_decay)
    holds_first, holds_last = 0 in theirs_model.stages, schedule.num_stages - 1 in theirs_model.stages

    parts: dict[str, list[float]] = {k: [] for k in ("ours", "ours_pipeline", "ours_update", "ours_metrics", "ours_cpu",
                                                     "ours_update_cpu", "ours_faults", "torch", "torch_pipeline",
                                                     "torch_update", "torch_cpu", "torch_update_cpu", "torch_faults")}
    pipeline_cpu = [0.0]  # process CPU at the end of ours' pipeline step (the runner's step returned)
    run_pipeline = ours.runner.step

    def timed_pipeline(*args: Any, **kwargs: Any) -> Any:
        out = run_pipeline(*args, **kwargs)
        pipeline_cpu[0] = time.process_time()
        return out

    ours.runner.step = timed_pipeline  # type: ignore[method-assign]
    clocks = time_messages(ours) if messages else None

    def our_step(step: int) -> None:
        start, cpu, faults = time.perf_counter(), time.process_time(), _faults()
        record = ours.train_step(measure=measure == "every" or step == 0)
        total, end_cpu = time.perf_counter() - start, time.process_time()
        if step >= 2:
            parts["ours_cpu"].append(end_cpu - cpu)
            parts["ours_update_cpu"].append(end_cpu - pipeline_cpu[0])
            parts["ours_faults"].append(_faults() - faults)
            wall = ours.runner.trace.wall  # type: ignore[union-attr]
            parts["ours"].append(total)
            parts["ours_pipeline"].append(wall)
            parts["ours_update"].append(record["step_s"] - wall)
            parts["ours_metrics"].append(total - record["step_s"])
        if clocks is not None:
            taken = clocks[0].take()
            if step >= 2:
                for i, value in enumerate(taken):
                    parts.setdefault(f"ours_msg{i}", []).append(value)

    def their_step(step: int) -> None:
        (tokens, _, _), targets = batches.train(step, 0)
        kwargs: dict[str, Any] = {"target": targets, "losses": []} if holds_last else {}
        start, cpu, faults = time.perf_counter(), time.process_time(), _faults()
        if holds_first:
            sched.step(tokens, **kwargs)
        else:
            sched.step(**kwargs)
        mid, mid_cpu = time.perf_counter(), time.process_time()
        if cfg.optim.clip > 0:  # global-norm clipping across the pipeline ranks, as a pipelining user writes it
            grads = [p.grad for p in theirs_model.parameters() if p.grad is not None]
            squares = torch.stack([g.detach().pow(2).sum() for g in grads]).sum().reshape(1)
            dist.all_reduce(squares, group=ctx.pp_group)
            scale = cfg.optim.clip / (float(squares.sqrt()) + 1e-6)
            if scale < 1:
                torch._foreach_mul_(grads, scale)
            del grads  # so that zero_grad frees the gradients inside the timed step, as ours' does
        opt.step()
        opt.zero_grad(set_to_none=True)
        end, end_cpu = time.perf_counter(), time.process_time()
        if step >= 2:  # the first two steps infer shapes and warm up
            parts["torch_cpu"].append(end_cpu - cpu)
            parts["torch_update_cpu"].append(end_cpu - mid_cpu)
            parts["torch_faults"].append(_faults() - faults)
            parts["torch"].append(end - start)
            parts["torch_pipeline"].append(mid - start)
            parts["torch_update"].append(end - mid)
        if clocks is not None:
            taken = clocks[1].take()
            if step >= 2:
                for i, value in enumerate(taken):
                    parts.setdefault(f"torch_msg{i}", []).append(value)

    for step in range(steps + 2):
        order = (our_step, their_step) if step % 2 == 0 else (their_step, our_step)
        for fn in order:
            dist.barrier()
            fn(step)
    return parts


def _faults() -> float:
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--measure", choices=("first", "every"), default="first",
                        help="ours measures activation memory on the first step only, or on every step")
    parser.add_argument("--schedules", nargs="+", default=["1f1b", "interleaved-1f1b"],
                        choices=list(THEIRS), help="each against torch's schedule of the same family: "
                        + ", ".join(f"{ours} {theirs}" for ours, theirs in THEIRS.items()))
    parser.add_argument("--no-clip", action="store_true", help="no gradient clipping on either side")
    parser.add_argument("--messages", action="store_true",
                        help="also time each side's posting of and waiting for messages (per step, per rank)")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"GPT {CFG.model.layers} blocks, hidden {CFG.model.hidden}, seq {CFG.model.seq_len}, global batch {CFG.data.global_batch}, "
          f"{CFG.schedule.microbatches} microbatches, {args.ranks} gloo ranks (1 thread each), median of {args.steps} steps, "
          f"{'no clipping' if args.no_clip else f'global-norm clipping at {CFG.optim.clip:g} on both sides'}, "
          f"ours measures memory on {'every step' if args.measure == 'every' else 'the first step only'}")
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} CPUs)")
    for schedule in args.schedules:
        v = 1 if schedule == "1f1b" else 2
        cfg = validate(CFG.updated(schedule=schedule, stages_per_rank=v, pp=args.ranks, nproc=args.ranks,
                               clip=0.0 if args.no_clip else CFG.optim.clip))
        result = spawn(worker, args.ranks, (cfg, args.steps, args.measure, args.messages), timeout=300, deadline=1800)
        if not result.ok:
            raise SystemExit("\n".join(e for e in result.errors if e))
        tokens = cfg.data.global_batch * cfg.model.seq_len
        # All ranks leave the barrier together: a step lasts until its slowest rank is done.
        step_s = {k: statistics.median(max(col) for col in zip(*(r[k] for r in result.results)))
                  for k in ("ours", "torch")}
        print(f"{schedule:17} v={v}: ours {tokens / step_s['ours']:6.0f} tokens/s ({step_s['ours'] * 1e3:.0f} ms/step), "
              f"torch.distributed.pipelining {tokens / step_s['torch']:6.0f} tokens/s "
              f"({step_s['torch'] * 1e3:.0f} ms/step); ratio ours/torch {step_s['torch'] / step_s['ours']:.2f}")
        for rank, parts in enumerate(result.results):
            ms = {k: statistics.median(v) * 1e3 for k, v in parts.items()}
            print(f"    rank {rank}: ours {ms['ours']:.0f} ms = pipeline {ms['ours_pipeline']:.0f} + norm/clip/AdamW "
                  f"{ms['ours_update']:.1f} + metrics {ms['ours_metrics']:.1f}; torch {ms['torch']:.0f} ms = "
                  f"pipeline {ms['torch_pipeline']:.0f} + norm/clip/AdamW {ms['torch_update']:.1f}; process CPU ms/step: "
                  f"ours {ms['ours_cpu']:.0f}, torch {ms['torch_cpu']:.0f} (after the pipeline: ours "
                  f"{ms['ours_update_cpu']:.1f}, torch {ms['torch_update_cpu']:.1f}); page faults/step: ours "
                  f"{ms['ours_faults'] / 1e3:.0f}, torch {ms['torch_faults'] / 1e3:.0f}")
            if args.messages:
                print("      " + "; ".join(
                    f"{side} {ms[f'{side}_msg0'] / 1e3:.0f} messages/step: posting {ms[f'{side}_msg1']:.1f} ms "
                    f"(thread CPU {ms[f'{side}_msg2']:.1f}), waiting {ms[f'{side}_msg3']:.1f} ms "
                    f"(thread CPU {ms[f'{side}_msg4']:.1f})" for side in ("ours", "torch")))
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
