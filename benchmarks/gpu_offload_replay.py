"""Replay one rank's lowered schedule on one device with real transformer layers.

The rank's action list runs exactly as in a multi-rank job, except that its neighbours are
replaced by local buffers (``LoopbackTransport``: sends go nowhere, receives are filled with small
random values). That isolates what offload costs on one GPU: step time with offload ``all`` vs
``none``, peak ``torch.cuda.max_memory_allocated``, the activation store's own peak, and the D2H /
H2D bandwidth the copy stream achieved.

    # the GPU run (about a minute on an H100/H200)
    python benchmarks/gpu_offload_replay.py --device cuda
    # the tiny CPU run the test suite does, so this script cannot rot
    python benchmarks/gpu_offload_replay.py --device cpu --hidden 32 --seq 16 --heads 2 --dtype float32

Defaults: group-interleaved (default group size), 4 ranks, 2 stages per rank,
2 layers per stage, 8 microbatches of 1 sequence, hidden 4096, seq 4096, bf16, rank 0 replayed.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeoffload import CostModel, generate, lower  # noqa: E402
from pipeoffload.ir import Schedule  # noqa: E402
from pipeoffload.models.gpt import Block, GPTConfig  # noqa: E402
from pipeoffload.models.split import StageModule  # noqa: E402
from pipeoffload.runtime import LoopbackTransport, PipelineRunner, TensorSpec  # noqa: E402
from pipeoffload.runtime.copier import CopyStats  # noqa: E402
from pipeoffload.runtime.spec import Const  # noqa: E402


def build_schedule(args: argparse.Namespace, offload: str) -> Schedule:
    name = args.schedule
    options = {"group_size": args.group_size} if name == "group-interleaved" and args.group_size else {}
    compute = generate(name, args.ranks, args.microbatches, args.stages_per_rank, **options)
    # The offload pass places copies against a cost model: give it the copy/compute ratio k.
    costs = CostModel().with_offload_ratio(args.offload_ratio) if args.offload_ratio else None
    return lower(compute, costs, offload=offload)


def run(args: argparse.Namespace, offload: str) -> dict[str, Any]:
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    schedule = build_schedule(args, offload)
    cfg = GPTConfig(hidden=args.hidden, seq=args.seq, heads=args.heads, flash=device.type == "cuda")
    torch.manual_seed(0)
    stages = {
        s: StageModule(*(Block(cfg) for _ in range(args.layers_per_stage))).to(device=device, dtype=dtype)
        for s in schedule.placement.stages_of(args.rank)
    }
    boundary = (TensorSpec((args.batch, args.seq, args.hidden), dtype, True), Const(None), Const(0))
    runner = PipelineRunner(
        stages, schedule, args.rank, loss_fn=lambda out, target: out[0].float().pow(2).mean(), device=device,
        transport=LoopbackTransport(device), output_specs={s: boundary for s in range(schedule.num_stages)},
        min_offload_bytes=args.min_offload_bytes,
    )
    m = args.microbatches
    inputs = (torch.randn(m * args.batch, args.seq, args.hidden, dtype=dtype) * 0.02, None, 0)
    targets = torch.zeros(m)
    _sync(device)
    times = []
    for step in range(args.warmup + args.steps):
        if step == args.warmup:  # measure steady state: pinned pool filled, allocator warm
            runner.store.copier.stats = CopyStats()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        runner.step(inputs, targets)
        _sync(device)
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
        for module in stages.values():
            module.zero_grad(set_to_none=True)
    stats = runner.store.copier.stats
    return {
        "offload": offload,
        "schedule": schedule.name,
        "actions": len(schedule.actions[args.rank]),
        "step_s": min(times),
        "peak_allocated_mb": torch.cuda.max_memory_allocated(device) / 1e6 if device.type == "cuda" else float("nan"),
        "store_peak_mb": runner.trace.peak_bytes / 1e6 if runner.trace else float("nan"),
        "unit_mb": max(runner.slot_bytes.values(), default=0) / 1e6,
        "d2h_gbps": stats.gbps("d2h"), "h2d_gbps": stats.gbps("h2d"),
        "pinned_mb": runner.store.copier.pool.allocated_bytes / 1e6,
        "end_bytes": runner.trace.end_bytes if runner.trace else -1,
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--batch", type=int, default=1, help="sequences per microbatch")
    p.add_argument("--layers-per-stage", type=int, default=2)
    p.add_argument("--schedule", default="group-interleaved")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--stages-per-rank", type=int, default=2)
    p.add_argument("--group-size", type=int, default=None)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--rank", type=int, default=0, help="which rank's action list to replay")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--offload", nargs="+", default=["none", "all"])
    p.add_argument("--min-offload-bytes", type=int, default=4096)
    p.add_argument("--offload-ratio", type=float, default=0.0,
                   help="k = (D2H + H2D) / (F + B) time of one unit, for the offload pass (0: instant copies)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse(argv)
    rows = [run(args, offload) for offload in args.offload]
    print(f"replay of rank {args.rank} on {args.device}: hidden {args.hidden}, seq {args.seq}, {args.dtype}, "
          f"{args.layers_per_stage} layers/stage, {args.ranks} ranks x {args.stages_per_rank} stages, "
          f"{args.microbatches} microbatches")
    print("memory in MB: max alloc = torch.cuda.max_memory_allocated; store peak = saved activations resident;")
    print("unit = what one (stage, microbatch) forward saves; pinned = host buffers held by the pool")
    print(f"{'offload':<8} {'schedule':<18} {'step s':>8} {'max alloc':>10} {'store peak':>10} "
          f"{'unit':>8} {'D2H GB/s':>9} {'H2D GB/s':>9} {'pinned':>9}")
    for r in rows:
        print(f"{r['offload']:<8} {r['schedule']:<18} {r['step_s']:>8.3f} {r['peak_allocated_mb']:>10.0f} "
              f"{r['store_peak_mb']:>10.2f} {r['unit_mb']:>8.2f} {r['d2h_gbps']:>9.1f} {r['h2d_gbps']:>9.1f} "
              f"{r['pinned_mb']:>9.1f}")
    if len(rows) > 1 and rows[0]["step_s"] > 0:
        print(f"step time ratio {rows[1]['offload']}/{rows[0]['offload']}: {rows[1]['step_s'] / rows[0]['step_s']:.2f}")
    return rows


if __name__ == "__main__":
    main()
