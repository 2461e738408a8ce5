"""Per-action dispatch overhead: pipeoffload's executor vs torch.distributed.pipelining.

Same tiny model (one 16x16 Linear per stage, one-row microbatches, so compute is negligible and
what is timed is the runtime itself: dispatch, bookkeeping, gradient hand-off, p2p), same
microbatches, same process group, measured in the same run, alternating the two runtimes.

    .venv/bin/python benchmarks/runtime_overhead.py [--steps 40] [--microbatches 8]

Prints microseconds per compute action (F or B) for Schedule1F1B / ScheduleInterleaved1F1B and
their pipeoffload equivalents, on 1 and 2 ranks (gloo, CPU), and the ratio ours / theirs.
Target: ratio <= 0.7.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeoffload import generate  # noqa: E402
from pipeoffload.runtime import PipelineRunner  # noqa: E402
from pipeoffload.runtime.launch import spawn  # noqa: E402

WIDTH = 16


def _stage(index: int) -> nn.Module:
    torch.manual_seed(index)
    return nn.Linear(WIDTH, WIDTH)


def _loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((out - target) ** 2).mean()


def _ours(rank: int, world: int, name: str, v: int, m: int):  # type: ignore[no-untyped-def]
    schedule = generate(name, world, m, v)
    stages = {s: _stage(s) for s in schedule.placement.stages_of(rank)}
    runner = PipelineRunner(stages, schedule, rank, loss_fn=_loss, timeout=120)
    return runner, lambda x, y: runner.step(x, y)


def _theirs(rank: int, world: int, name: str, v: int, m: int):  # type: ignore[no-untyped-def]
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B

    num_stages = world * v
    stages = [PipelineStage(_stage(s), s, num_stages, torch.device("cpu")) for s in range(rank, num_stages, world)]
    if name == "1f1b":
        sched = Schedule1F1B(stages[0], m, loss_fn=_loss)
    else:
        sched = ScheduleInterleaved1F1B(stages, m, loss_fn=_loss)
    first, last = rank == 0, rank == (num_stages - 1) % world

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        kwargs = {"target": y, "losses": []} if last else {}
        if first:
            sched.step(x, **kwargs)
        else:
            sched.step(**kwargs)

    return sched, step


def _baseline(rank: int, world: int, name: str, v: int, m: int):  # type: ignore[no-untyped-def]
    """The compute alone: this rank's F and B of every microbatch, no runtime, no messages."""
    num_stages = world * v
    local = list(range(rank, num_stages, world))
    mods = {s: _stage(s) for s in local}

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        for xm, ym in zip(x.tensor_split(m), y.tensor_split(m)):
            outs = []
            for s in local:
                inp = xm.clone().requires_grad_(s > 0)
                out = mods[s](inp)
                outs.append(_loss(out, ym) / m if s == num_stages - 1 else out)
            for _s, out in zip(reversed(local), reversed(outs)):
                torch.autograd.backward(out, None if out.dim() == 0 else torch.ones_like(out))

    return mods, step


def worker(rank: int, world: int, steps: int, m: int) -> list[dict]:
    torch.manual_seed(0)
    x, y = torch.randn(m, WIDTH), torch.randn(m, WIDTH)
    rows = []
    for name, v in (("1f1b", 1), ("interleaved-1f1b", 2)):
        _, ours = _ours(rank, world, name, v, m)
        _, theirs = _theirs(rank, world, name, v, m)
        _, base = _baseline(rank, world, name, v, m)
        runs = (("ours", ours), ("theirs", theirs), ("compute", base))
        for _, fn in runs + runs:  # warm up all three
            fn(x, y)
        wall: dict[str, list[float]] = {label: [] for label, _ in runs}
        cpu: dict[str, list[float]] = {label: [] for label, _ in runs}
        for _ in range(steps):
            for label, fn in runs:
                dist.barrier()
                start, start_cpu = time.perf_counter(), time.process_time()
                fn(x, y)
                wall[label].append(time.perf_counter() - start)
                cpu[label].append(time.process_time() - start_cpu)
        actions = 2 * m * v  # F and B of every microbatch on each local stage
        row = {"schedule": name, "ranks": world, "actions": actions}
        for label in wall:
            # The fastest step: on a shared machine the slower ones measure other processes.
            row[f"{label}_us"] = min(wall[label]) / actions * 1e6
            row[f"{label}_cpu_us"] = min(cpu[label]) / actions * 1e6
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    print(f"torch {torch.__version__}, gloo on CPU, {args.microbatches} microbatches, fastest of {args.steps} steps")
    print("us per compute action (F or B). overhead = runtime - the same compute without a runtime;")
    print("wall: elapsed time (includes waiting for the other rank); cpu: this process's CPU time")
    print("(dispatch, bookkeeping, hand-offs and comm work, not waiting). Worst rank shown.")
    head = f"{'schedule':<17} {'ranks':>5} {'clock':>5} {'compute':>8} {'ours':>8} {'torch':>8} {'ours ovh':>9} {'torch ovh':>9} {'ovh ratio':>9}"
    print(head)
    for world in args.ranks:
        result = spawn(worker, world, (args.steps, args.microbatches), deadline=900)
        if not result.ok:
            raise SystemExit(f"benchmark failed: {result.errors}")
        for i, row in enumerate(result.results[0]):
            for clock, suffix in (("wall", "_us"), ("cpu", "_cpu_us")):
                pick = {k: max(r[i][k + suffix] for r in result.results) for k in ("ours", "theirs", "compute")}
                ours_ovh, theirs_ovh = pick["ours"] - pick["compute"], pick["theirs"] - pick["compute"]
                print(f"{row['schedule']:<17} {world:>5} {clock:>5} {pick['compute']:>8.1f} {pick['ours']:>8.1f} "
                      f"{pick['theirs']:>8.1f} {ours_ovh:>9.1f} {theirs_ovh:>9.1f} {ours_ovh / theirs_ovh:>9.2f}")


if __name__ == "__main__":
    main()
