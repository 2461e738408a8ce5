"""Process CPU of ``simulate`` alone (the schedules lowered beforehand, untimed), best of ``--repeat``
calls per case: the event loop's cost without generate, lower or the validator around it. Compare
two checkouts by running this file of one with PYTHONPATH set to each, alternating.

    .venv/bin/python benchmarks/simulate_only.py [--repeat 7]
"""
from __future__ import annotations

import argparse
import time

from pipeoffload.costs import CostModel
from pipeoffload.passes.lower import lower
from pipeoffload.schedules import generate
from pipeoffload.simulator import simulate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    costs = CostModel.uniform(1.0, 1.0, 1.0, p2p=0.1).with_offload_ratio(0.5)
    cases = {"interleaved-1f1b d=64 m=256": lower(generate("interleaved-1f1b", 64, 256, 2), costs),
             "group-interleaved d=16 m=64 g=8, offload all": lower(generate("group-interleaved", 16, 64, 2, group_size=8),
                                                                   costs, offload="all"),
             "zb-v d=32 m=128": lower(generate("zb-v", 32, 128, 2), costs)}
    cells = []
    for name, schedule in cases.items():
        best = float("inf")
        for _ in range(args.repeat):
            start = time.process_time()
            simulate(schedule, costs)
            best = min(best, time.process_time() - start)
        cells.append(f"{name} {best * 1e3:.1f} ms")
    print(" | ".join(cells))


if __name__ == "__main__":
    main()
