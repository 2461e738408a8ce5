"""Peak activation memory and added step time of full offload as the offload ratio k grows.

group-interleaved, d = 8, v = 2, m = 32, uniform F = I = W = 1, zero P2P time; k = (D2H + H2D time
of one activation) / (F + I + W time), swept from 0 to 2. Columns, per k: for g = 8 (the issue's
setting) the simulated peak (activation units on the worst rank; 16 without offload), the makespan
increase over the schedule without offload, stalls and the activations the copy lane could not hide;
then the peak with two ranks sharing one host link, with g = 4 (12 units without offload), and with
``auto`` (at most ``all``'s peak, with fewer copies). Last, the zero-bubble families with both offload
windows (F -> I and I -> W), w_fraction = 1 and a forward of 1 t per rank (d = 8, m = 32): peak in
rank units (8 without offload) and the makespan increase. The reference planner accepts full offload only
up to k = 0.4 (its ``--offload-time`` 0.2) and fails at k = 0.5.

    python benchmarks/offload_sweep.py > benchmarks/results/offload_sweep.txt
"""
from __future__ import annotations

import argparse
from dataclasses import replace

from pipeoffload import generate, simulate
from pipeoffload.costs import CostModel
from pipeoffload.passes.lower import lower_with_report


def run(schedule, k: float, policy: str = "all", **options: object):  # type: ignore[no-untyped-def]
    costs = replace(CostModel().with_offload_ratio(k), **options)
    lowered, report = lower_with_report(schedule, costs, offload=policy)
    return simulate(lowered, costs), report


def zero_bubble(name: str, v: int, k: float) -> tuple[float, float]:
    """(peak rank units, makespan increase) of ``name`` with offload all at ratio k."""
    unit = 1.0 / v
    plain = CostModel(time_f=unit, time_i=unit, time_w=unit, w_fraction=1.0)
    schedule = generate(name, 8, 32, v)
    costs = plain.with_offload_ratio(k)
    t = simulate(lower_with_report(schedule, costs, offload="all")[0], costs)
    return t.peak_rank_units, t.makespan - simulate(schedule, plain).makespan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step", type=float, default=0.1)
    parser.add_argument("--max-ratio", type=float, default=2.0)
    args = parser.parse_args()
    full = generate("group-interleaved", 8, 32, 2, group_size=8)
    half = generate("group-interleaved", 8, 32, 2, group_size=4)
    base = simulate(full)
    print("group-interleaved d=8 v=2 m=32, offload all; peak in activation units (no offload: "
          f"{base.peak_activation_units:g} at g=8, {simulate(half).peak_activation_units:g} at g=4); "
          f"makespan without offload {base.makespan:g}")
    print(f"{'k':>4} | {'peak':>4} {'+makespan':>9} {'stall':>5} {'offloaded':>9} {'unhidden':>8} | "
          f"{'shared link':>11} | {'g=4':>4} | {'auto':>4} {'copies':>6} | {'zb-v':>4} {'+mk':>4} | "
          f"{'zb-h1':>5} {'+mk':>4}")
    steps = round(args.max_ratio / args.step)
    for i in range(steps + 1):
        k = round(i * args.step, 10)
        t, report = run(full, k)
        shared, _ = run(full, k, shared_host_link=True)
        small, _ = run(half, k)
        auto, auto_report = run(full, k, "auto")
        zbv, zbh = zero_bubble("zb-v", 2, k), zero_bubble("zb-h1", 1, k)
        print(f"{k:4.2f} | {t.peak_activation_units:4g} {t.makespan - base.makespan:9g} {t.stall:5g} "
              f"{report.offloaded:9d} {len(report.unhidden):8d} | {shared.peak_activation_units:11g} | "
              f"{small.peak_activation_units:4g} | {auto.peak_activation_units:4g} {auto_report.offloaded:6d} | "
              f"{zbv[0]:4g} {zbv[1]:4g} | {zbh[0]:5g} {zbh[1]:4g}")


if __name__ == "__main__":
    main()
