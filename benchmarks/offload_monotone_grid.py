"""Device peak over a fine grid of k with full offload: is a faster link ever worse? (issue #17)

For one schedule and link model, lower and simulate with ``offload="all"`` at every k of the grid
and print the worst rank's peak (activation units), the makespan and the stall, then every pair
(k, k') with k < k' whose peak at k is above the peak at k'. Run it on two commits to compare:

    python benchmarks/offload_monotone_grid.py --schedule 1f1b --ranks 8 --microbatches 24 --shared-host-link \
        --start 0.1 --stop 2.0 --step 0.05
"""
from __future__ import annotations

import argparse
import subprocess
import time

from pipeoffload import CostModel, generate, lower, simulate


def _grid(start: float, stop: float, step: float) -> list[float]:
    count = int(round((stop - start) / step)) + 1
    return [round(start + i * step, 6) for i in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedule", default="1f1b")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--microbatches", type=int, default=24)
    parser.add_argument("--stages-per-rank", type=int, default=1)
    parser.add_argument("--group-size", type=int, default=None)
    parser.add_argument("--shared-host-link", action="store_true")
    parser.add_argument("--start", type=float, default=0.1)
    parser.add_argument("--stop", type=float, default=2.0)
    parser.add_argument("--step", type=float, default=0.05)
    args = parser.parse_args()
    options = {"group_size": args.group_size} if args.group_size else {}
    schedule = generate(args.schedule, args.ranks, args.microbatches, args.stages_per_rank, **options)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"# {args.schedule} d={args.ranks} m={args.microbatches} v={args.stages_per_rank} {options or ''}"
          f" offload all, {'shared' if args.shared_host_link else 'own'} host links; commit {commit}")
    print("k        peak  makespan   stall  cpu s")
    peaks = []
    grid = _grid(args.start, args.stop, args.step)
    for k in grid:
        costs = CostModel(shared_host_link=args.shared_host_link).with_offload_ratio(k)
        t0 = time.process_time()
        timeline = simulate(lower(schedule, costs, offload="all"), costs)
        cpu = time.process_time() - t0
        peaks.append(timeline.peak_activation_units)
        print(f"{k:<6g} {timeline.peak_activation_units:6g} {timeline.makespan:9g} {timeline.stall:7g} {cpu:6.2f}",
              flush=True)
    inverted = [(grid[i], peaks[i], grid[j], peaks[j]) for i in range(len(grid)) for j in range(i + 1, len(grid))
                if peaks[i] > peaks[j] + 1e-9]
    print(f"inversions (k, peak above the peak at a larger k'): {len(inverted)}")
    for k, p, k2, p2 in inverted:
        print(f"  k={k:g}: {p:g} > k'={k2:g}: {p2:g}")


if __name__ == "__main__":
    main()
