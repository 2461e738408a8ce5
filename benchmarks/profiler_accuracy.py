"""Does the profiler's CostModel predict the runtime's step time? (2 ranks, gloo, CPU)

Profiles each pipeline stage of the reference GPT in this process (one thread, like each spawned rank),
builds a CostModel (P2P time from a measured gloo ping-pong), simulates the schedule, then runs the
same schedule with the runtime on 2 spawned ranks and compares the median step times.

Run: .venv/bin/python benchmarks/profiler_accuracy.py [--save benchmarks/results/plan_profiler_accuracy.txt]
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from pipeoffload.models.gpt import GPTConfig, gpt_layers, lm_loss, sample_batch
from pipeoffload.models.split import build_rank_stages, even_counts, split_layers
from pipeoffload.passes.lower import lower
from pipeoffload.profiling import profile_stages
from pipeoffload.runtime import PipelineRunner
from pipeoffload.runtime.launch import spawn
from pipeoffload.schedules import generate
from pipeoffload.simulator import simulate

CFG = GPTConfig(vocab=512, seq=128, hidden=256, heads=8, layers=8, flash=False)
MICROBATCH = 4
CASES = [("1f1b", 1, 8), ("1f1b", 1, 16), ("interleaved-1f1b", 2, 8), ("gpipe", 1, 8), ("zb-h1", 1, 8)]
RANKS = 2


def _ping_pong(rank: int, world: int, nbytes: int, repeats: int) -> float:
    """Median one-way time of a gloo send/recv of ``nbytes`` between ranks 0 and 1."""
    buf = torch.empty(nbytes // 4)
    samples = []
    for n in range(repeats + 2):
        dist.barrier()
        start = time.perf_counter()
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        else:
            dist.recv(buf, 0)
            dist.send(buf, 0)
        if n >= 2:
            samples.append((time.perf_counter() - start) / 2)
    return statistics.median(samples)


def _run_runtime(rank: int, world: int, family: str, v: int, m: int, steps: int) -> list[float]:
    schedule = lower(generate(family, world, m, v))
    counts = even_counts(len(gpt_layers(CFG)), world * v)
    stages = build_rank_stages(gpt_layers(CFG), counts, schedule.placement, rank)
    runner = PipelineRunner(stages, schedule, rank, loss_fn=lm_loss)
    inputs, targets = sample_batch(CFG, MICROBATCH * m, padded=False)
    walls = []
    for n in range(steps + 2):
        dist.barrier()
        runner.step(inputs, targets)
        for p in (p for s in stages.values() for p in s.parameters()):
            p.grad = None
        if n >= 2:
            walls.append(runner.trace.wall)  # type: ignore[union-attr]
    return walls


def _profile(v: int, p2p_time: float):  # type: ignore[no-untyped-def]
    """Profile the RANKS * v stages of the reference GPT once, in this process, with one thread."""
    torch.set_num_threads(1)
    layers = gpt_layers(CFG)
    stages = split_layers(layers, even_counts(len(layers), RANKS * v))
    (tokens, mask, offset), targets = sample_batch(CFG, MICROBATCH, padded=False)
    profile = profile_stages(stages, (tokens, mask, offset), loss_fn=lm_loss, target=targets, warmup=3, repeats=7)
    return profile.cost_model(p2p_time=p2p_time)


def _predict(costs, family: str, v: int, m: int) -> float:  # type: ignore[no-untyped-def]
    return simulate(lower(generate(family, RANKS, m, v), costs), costs).makespan


def _ms(values) -> str:  # type: ignore[no-untyped-def]
    return "/".join(f"{x * 1e3:.1f}" for x in values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--save")
    args = parser.parse_args()
    boundary = MICROBATCH * CFG.seq * CFG.hidden * 4
    pp = spawn(_ping_pong, RANKS, (boundary, 20), deadline=120)
    assert pp.ok, pp.errors
    p2p = max(pp.results)
    lines = [f"# profiler accuracy: {CFG}, microbatch {MICROBATCH}, {RANKS} ranks, gloo on CPU, 1 thread/rank",
             f"# measured P2P one-way for {boundary} B: {p2p * 1e3:.3f} ms"]
    costs = {v: _profile(v, p2p) for v in sorted({v for _, v, _ in CASES})}
    for v, c in costs.items():
        lines.append(f"# v={v}: per-stage F {_ms(c.time_f)} I {_ms(c.time_i)} W {_ms(c.time_w)} ms; "
                     f"activation {c.activation_bytes / 2**20:.1f} MiB/unit")
    lines.append(f"{'schedule':<17} {'v':>2} {'m':>3} {'predicted s':>12} {'measured s':>11} {'error':>7}")
    for family, v, m in CASES:
        predicted = _predict(costs[v], family, v, m)
        run = spawn(_run_runtime, RANKS, (family, v, m, args.steps), deadline=600)
        assert run.ok, run.errors
        measured = statistics.median(max(walls) for walls in zip(*run.results))
        lines.append(f"{family:<17} {v:>2} {m:>3} {predicted:>12.4f} {measured:>11.4f} "
                     f"{(predicted - measured) / measured:>+7.1%}")
        print(lines[-1], flush=True)
    text = "\n".join(lines)
    print(text)
    if args.save:
        Path(args.save).write_text(text + "\n")


if __name__ == "__main__":
    main()
