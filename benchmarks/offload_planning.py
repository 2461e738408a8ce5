"""How long the offload placement pass takes, and what it achieves, as the pipeline grows.

group-interleaved, v = 2, m = 4d, g = d, full offload (``--offload all``) at offload ratio k = 0.5
(the reference implementation's planner refuses this setting), for d = 8 ... 64. Per d, process CPU
seconds (best of --repeat) of:
  plan      the offload pass alone (given the compute timeline it plans against)
  lower     everything ``lower`` does: validate, simulate the compute-only schedule, plan, add
            SEND/RECV, validate the result
  simulate  simulating the lowered schedule
and the resulting peak (activation units, per rank), makespan and stalls next to the schedule
without offload. The reference planner took 1.3 s (d=8), 10 s (d=16), 90 s (d=32), growing about
cubically; targets: lower + simulate under 2 s at d = 64 (about 100k compute actions), then under 1 s
with the integer-coded core (issue #11; 3.7 s before it). Peak, makespan, stall, offloaded and
unhidden are simulated figures: speed work must leave them unchanged.
"""
from __future__ import annotations

import argparse
import time

from pipeoffload import generate, simulate
from pipeoffload.costs import CostModel
from pipeoffload.passes.lower import lower_with_report
from pipeoffload.passes.offload import plan_offload


def measure(d: int, k: float, repeat: int) -> dict[str, float]:
    costs = CostModel().with_offload_ratio(k)
    best: dict[str, float] = {}
    for _ in range(repeat):
        # fresh objects each round: what the passes remember on a schedule or timeline must not be reused
        schedule = generate("group-interleaved", d, 4 * d, 2, group_size=d)
        baseline = simulate(schedule, costs)
        clock = time.process_time()
        plan_offload(schedule, costs, "all", timeline=baseline)
        phases = {"plan": time.process_time() - clock}
        schedule = generate("group-interleaved", d, 4 * d, 2, group_size=d)
        clock = time.process_time()
        lowered, report = lower_with_report(schedule, costs, offload="all")
        phases["lower"] = time.process_time() - clock
        clock = time.process_time()
        timeline = simulate(lowered, costs)
        phases["simulate"] = time.process_time() - clock
        for key, value in phases.items():
            best[key] = min(best.get(key, value), value)
    best.update(compute=sum(len(r) for r in schedule.actions), peak=timeline.peak_activation_units,
                base_peak=baseline.peak_activation_units, makespan=timeline.makespan,
                base_makespan=baseline.makespan, stall=timeline.stall, offloaded=report.offloaded,
                unhidden=len(report.unhidden))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 16, 32, 64])
    parser.add_argument("--offload-ratio", type=float, default=0.5)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"group-interleaved v=2 m=4d g=d, offload all, k={args.offload_ratio:g}; seconds are process CPU time")
    print(f"{'d':>4} {'compute':>8} {'plan':>6} {'lower':>6} {'simulate':>8} {'lower+sim':>9} "
          f"{'peak':>5} {'(none)':>6} {'makespan':>8} {'(none)':>7} {'stall':>5} {'offloaded':>9} {'unhidden':>8}")
    for d in args.ranks:
        r = measure(d, args.offload_ratio, args.repeat)
        print(f"{d:4d} {int(r['compute']):8d} {r['plan']:6.2f} {r['lower']:6.2f} {r['simulate']:8.2f} "
              f"{r['lower'] + r['simulate']:9.2f} {r['peak']:5g} {r['base_peak']:6g} {r['makespan']:8g} "
              f"{r['base_makespan']:7g} {r['stall']:5g} {int(r['offloaded']):9d} {int(r['unhidden']):8d}")


if __name__ == "__main__":
    main()
