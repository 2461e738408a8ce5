"""How long generate + lower + simulate take as the pipeline grows.

interleaved-1f1b, v = 2, m = 4d, for d = 4 ... 64. Prints one row per d with the number of actions
in the lowered schedule and the seconds spent in each phase (process CPU time, best of --repeat).
Targets: d = 64 (about 200k lowered actions) under 1 s (foundation issue), then under 0.4 s with the
integer-coded core (issue #11; 1.2 s before it). The bubble column is the simulated figure: it must not
change with speed work.
"""
from __future__ import annotations

import argparse
import time

from pipeoffload import generate, simulate
from pipeoffload.passes.comms import add_comms
from pipeoffload.validation import validate


def measure(d: int, repeat: int) -> dict[str, float]:
    best: dict[str, float] = {}
    for _ in range(repeat):
        clock = time.process_time()
        schedule = generate("interleaved-1f1b", d, 4 * d, 2)
        phases = {"generate": time.process_time() - clock}
        clock = time.process_time()
        lowered = add_comms(schedule)
        phases["lower"] = time.process_time() - clock
        clock = time.process_time()
        validate(lowered)
        phases["validate"] = time.process_time() - clock
        clock = time.process_time()
        timeline = simulate(lowered)
        phases["simulate"] = time.process_time() - clock
        phases["actions"] = lowered.num_actions()
        phases["bubble"] = timeline.bubble_ratio
        for key, value in phases.items():
            best[key] = min(best.get(key, value), value)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-ranks", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"{'d':>4} {'actions':>8} {'generate':>9} {'lower':>7} {'validate':>9} {'simulate':>9} "
          f"{'total':>7} {'w/o validate':>12} {'bubble':>7}")
    d = 4
    while d <= args.max_ranks:
        r = measure(d, args.repeat)
        total = r["generate"] + r["lower"] + r["validate"] + r["simulate"]
        print(f"{d:4d} {int(r['actions']):8d} {r['generate']:9.3f} {r['lower']:7.3f} {r['validate']:9.3f} "
              f"{r['simulate']:9.3f} {total:7.3f} {total - r['validate']:12.3f} {r['bubble']:7.3f}")
        d *= 2


if __name__ == "__main__":
    main()
