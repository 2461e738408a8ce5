"""A plan the offload pass made for slower copies, simulated with faster ones: can its peak rise?

The pass at k keeps the plans of the next ladder point above k only where their simulation at k
says so (docs/offload.md, steps 11-12), because a replay is not safe by construction: with faster
copies a copy queued behind another starts earlier, so an allocation can move before a free it
used to follow. This prints, for one shared-link case, the pass's own plan at each k and the plan
made at ``--at`` simulated at that k (peak in activation units, makespan, stall).

    .venv/bin/python benchmarks/replay_at_smaller_k.py [--at 0.5] [--ks 0.42 0.45 0.47 0.49]
"""
from __future__ import annotations

import argparse

from pipeoffload.costs import CostModel
from pipeoffload.passes.lower import lower
from pipeoffload.schedules import generate
from pipeoffload.simulator import simulate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--at", type=float, default=0.5, help="the k the replayed plan is made for")
    parser.add_argument("--ks", type=float, nargs="+", default=[0.42, 0.45, 0.47, 0.49], help="the k it is replayed at")
    args = parser.parse_args()
    schedule = generate("group-interleaved", 8, 32, 2, group_size=8)
    base = CostModel.uniform(1.0, 1.0, 1.0, shared_host_link=True)
    made = lower(schedule, base.with_offload_ratio(args.at), offload="all")
    own = simulate(made, base.with_offload_ratio(args.at))
    print(f"group-interleaved d=8 v=2 g=8 m=32, offload all, shared host link; the plan made at k={args.at}: "
          f"peak {own.peak_activation_units:g}, makespan {own.makespan:g} t")
    print(f"    k  own plan: peak  makespan  |  plan of k={args.at:g}: peak  makespan  stall")
    for k in args.ks:
        costs = base.with_offload_ratio(k)
        mine = simulate(lower(schedule, costs, offload="all"), costs)
        replay = simulate(made, costs)
        print(f"{k:5.2f}  {mine.peak_activation_units:14g}  {mine.makespan:8g}  |  {replay.peak_activation_units:16g}  "
              f"{replay.makespan:8g}  {replay.stall:5g}")


if __name__ == "__main__":
    main()
