"""The Llama model at long sequences on 4 pipeline ranks: measured activation peaks and tokens/s,
1F1B without offload vs group-interleaved (v=2) with offload all.

Every case runs the Llama-family model (``models.llama``: RMSNorm, RoPE, SwiGLU, grouped-query
attention through the CPU flash kernel, no s x s matrix) through the runtime (``PipelineRunner``)
on spawned gloo ranks, one intra-op thread each, on the same random tokens and weights. Per case and
sequence length: each rank's measured peak of resident activations (``runner.trace.peak_bytes``), the
simulator's peak for the same lowered schedule with the measured per-stage slot bytes as the unit
(``simulated_peaks``; they must be equal), the peak host bytes of offloaded activations, and tokens/s
of the pipeline step (forward and backward of every microbatch; no optimizer) as the median over the
timed steps of the slowest rank's step (a barrier before each). The load average before and after is
printed: on a shared CPU machine tokens/s is noisy, the byte counts are exact.

    python benchmarks/llama_long_seq.py [--seqs 2048 4096 8192] [--steps 1] [--warmup 0] [--microbatches 4]

Results: benchmarks/results/llama_long_seq.txt (one run per sequence length).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from pipeoffload import Schedule, generate, lower
from pipeoffload.llama_config import LlamaShape
from pipeoffload.models import build_rank_stages, even_counts, lm_loss
from pipeoffload.models.llama import llama_layers
from pipeoffload.runtime import PipelineRunner, simulated_peaks
from pipeoffload.runtime.launch import spawn
from pipeoffload.runtime.trace import measured_w_fractions

SHAPE = LlamaShape(vocab=256, hidden=64, layers=6, heads=4, kv_heads=2, ffn_hidden=128)
CASES = [("1f1b", 1, "none"), ("group-interleaved", 2, "all")]  # (family, v, offload)
MIB = 2**20


def worker(rank: int, world: int, seqs: list[int], steps: int, warmup: int, microbatches: int) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    out = []
    for seq in seqs:
        gen = torch.Generator().manual_seed(seq)
        tokens = torch.randint(0, SHAPE.vocab, (microbatches, seq), generator=gen)
        targets = torch.randint(0, SHAPE.vocab, (microbatches, seq), generator=gen)
        for family, v, offload in CASES:
            schedule = lower(generate(family, world, microbatches, v), offload=offload)
            layers = llama_layers(SHAPE, seed=0, tie=False)
            counts = even_counts(len(layers), schedule.num_stages)
            runner = PipelineRunner(build_rank_stages(layers, counts, schedule.placement, rank), schedule, rank,
                                    loss_fn=lm_loss, timeout=1800)
            params = [p for st in runner.stages.values() for p in st.module.parameters()]
            times, peaks, host = [], [], []
            for step in range(warmup + steps):  # warm-up steps (allocations, first touch) are not timed
                dist.barrier()
                t0 = time.perf_counter()
                runner.step((tokens, None, 0), targets)
                elapsed = torch.tensor([time.perf_counter() - t0])
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's step
                for p in params:
                    p.grad = None
                if step >= warmup:
                    times.append(float(elapsed))
                    peaks.append(runner.trace.peak_bytes)
                    host.append(runner.trace.peak_host_bytes)
            out.append({"seq": seq, "case": f"{family} v={v} offload {offload}", "schedule": schedule.to_json(),
                        "step_s": statistics.median(times), "peak": max(peaks), "host": max(host),
                        "slots": dict(runner.slot_bytes), "w": dict(runner.w_bytes)})
    return out


def report(results: list[list[dict[str, Any]]], world: int, microbatches: int) -> list[str]:
    lines = [f"{'seq':>5}  {'case':<32} {'tokens/s':>9}  peak MiB per rank (measured = simulated)   host MiB"]
    for k in range(len(results[0])):
        rows = [results[r][k] for r in range(world)]
        units = {s: b for row in rows for s, b in row["slots"].items()}
        kept = {s: b for row in rows for s, b in row["w"].items()}
        sim = simulated_peaks(Schedule.from_json(rows[0]["schedule"]), units, measured_w_fractions(units, kept))
        measured = [row["peak"] for row in rows]
        assert [int(x) for x in sim] == measured, (rows[0]["case"], measured, sim)
        tokens_s = microbatches * rows[0]["seq"] / rows[0]["step_s"]
        peaks = " ".join(f"{b / MIB:6.2f}" for b in measured)
        hosts = " ".join(f"{row['host'] / MIB:6.2f}" for row in rows)
        lines.append(f"{rows[0]['seq']:>5}  {rows[0]['case']:<32} {tokens_s:9.0f}  {peaks}            {hosts}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--steps", type=int, default=1, help="timed steps per case")
    parser.add_argument("--warmup", type=int, default=0, help="untimed steps before them")
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--ranks", type=int, default=4)
    args = parser.parse_args()
    load_before = os.getloadavg()
    t0 = time.time()
    result = spawn(worker, args.ranks, (args.seqs, args.steps, args.warmup, args.microbatches), timeout=1800, deadline=7200)
    if not result.ok:
        raise SystemExit(f"the ranks failed: {result.errors}")
    load_after = os.getloadavg()
    print(f"# benchmarks/llama_long_seq.py --seqs {' '.join(map(str, args.seqs))} --steps {args.steps} --warmup {args.warmup} "
          f"--microbatches {args.microbatches}, "
          f"torch {torch.__version__}, {args.ranks} gloo ranks x 1 thread on CPU, {time.time() - t0:.0f} s")
    print(f"# load average {load_before[0]:.1f} before, {load_after[0]:.1f} after "
          f"(machine: {os.cpu_count()} CPU cores shared with other jobs)")
    print(f"# Llama {SHAPE.layers} blocks, hidden {SHAPE.hidden}, {SHAPE.heads} heads ({SHAPE.n_kv_heads} KV), "
          f"FFN {SHAPE.ffn}, vocab {SHAPE.vocab}; {args.microbatches} microbatches of 1 sequence; fp32")
    print("# tokens/s: the pipeline step (forward + backward, no optimizer), median over the timed steps of "
          "the slowest rank")
    for line in report(result.results, args.ranks, args.microbatches):
        print(line)


if __name__ == "__main__":
    main()
