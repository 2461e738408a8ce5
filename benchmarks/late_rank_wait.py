"""How long the last rank into a gloo all-reduce waits, by what the first rank does right after its own returned.

Two gloo ranks; before each round both leave a barrier, rank 1 computes 8 ms (it is the late rank, as the
compute-bound rank is at the end of a zero-bubble pipeline), then both all-reduce a float64 vector (the
size of the gradient norm's) and compute 5 ms (as AdamW follows the step's last collective). What rank 0
does between its all-reduce and its compute varies round by round: nothing ("computes"), a second
all-reduce of 6 elements (as the measurements' follows the norm's in ``Trainer.train_step``: "blocks"),
or a sleep of 0.2 ms ("sleeps"). Printed: rank 1's all-reduce wall time, median and
quartiles per variant (docs/decisions.md, issue #19).

    python benchmarks/late_rank_wait.py [--rounds 300] [--size 50]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from pipeoffload.runtime.launch import spawn

VARIANTS = ("computes", "blocks", "sleeps")
SLEEP_S = 2e-4


def _compute(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    x = torch.randn(256, 256)
    while time.perf_counter() < end:
        x = (x @ x).tanh_()


def worker(rank: int, world: int, rounds: int, size: int) -> dict[str, list[float]]:
    torch.set_num_threads(1)
    vector = torch.zeros(size, dtype=torch.float64)
    waits: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for i in range(rounds):
        variant = VARIANTS[i % len(VARIANTS)]
        dist.barrier()
        if rank == 1:
            _compute(8)
        start = time.perf_counter()
        dist.all_reduce(vector)
        waits[variant].append(time.perf_counter() - start)
        if variant == "blocks":
            dist.all_reduce(torch.zeros(6, dtype=torch.float64))
        elif variant == "sleeps":
            time.sleep(SLEEP_S)
        _compute(5)
    return waits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--size", type=int, default=50)
    args = parser.parse_args()
    result = spawn(worker, 2, (args.rounds, args.size), timeout=300, deadline=900)
    if not result.ok:
        raise SystemExit("\n".join(e for e in result.errors if e))
    print(f"2 gloo ranks, {args.rounds} rounds, all-reduce of {args.size} float64; rank 1 (late) waits, ms:")
    for variant in VARIANTS:
        waits = result.results[1][variant]
        q = statistics.quantiles(waits)
        print(f"  rank 0 then {variant:8}  median {statistics.median(waits) * 1e3:6.3f}  quartiles "
              f"{q[0] * 1e3:.3f}-{q[2] * 1e3:.3f}")


if __name__ == "__main__":
    main()
