"""What one ``runtime.launch.spawn`` costs: start the ranks, join the process group, one barrier,
collect the results. The test suite launches many process groups, so this is its per-launch tax.

    .venv/bin/python benchmarks/launch_overhead.py [--ranks 2] [--launches 3] [--root PATH]

``--root`` imports ``pipeoffload`` from another checkout (e.g. an older commit's worktree) to compare
launchers on the same machine. Prints, per launch, the wall time and the CPU time of the launcher
and its ranks together (user + system; less sensitive than wall time to other load on a shared
machine), then the medians.
"""
from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path


def barrier(rank: int, world: int) -> int:
    import torch.distributed as dist

    dist.barrier()
    return rank


def cpu_seconds() -> float:
    """CPU time of this process and of its children that have been waited for."""
    return sum(getattr(resource.getrusage(who), field) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for field in ("ru_utime", "ru_stime"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--root", default=str(Path(__file__).resolve().parents[1]))
    args = parser.parse_args()
    sys.path.insert(0, args.root)
    from pipeoffload.runtime.launch import spawn

    walls, cpus = [], []
    for i in range(args.launches):
        wall, cpu = time.perf_counter(), cpu_seconds()
        result = spawn(barrier, args.ranks, timeout=60, deadline=300)
        wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
        assert result.ok and result.results == list(range(args.ranks)), result
        walls.append(wall)
        cpus.append(cpu)
        print(f"launch {i}: wall {wall:.2f} s, cpu {cpu:.2f} s")
    print(f"{args.root}: {args.ranks} ranks, median of {args.launches}: wall {statistics.median(walls):.2f} s, "
          f"cpu {statistics.median(cpus):.2f} s")


if __name__ == "__main__":
    main()
