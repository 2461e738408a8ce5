"""Compare PipeOffload's selective and full offload with 1F1B and ZB-V on one pipeline, and draw them.

    .venv/bin/python examples/compare_offload.py --ranks 8 --offload-ratio 0.8 --out out/
"""
from __future__ import annotations

import argparse
from pathlib import Path

from pipeoffload import ConfigError, CostModel, generate, lower, simulate
from pipeoffload.fileio import write_atomic
from pipeoffload.viz.plot import figure_bytes, timeline_figure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--offload-ratio", type=float, default=0.8, help="the paper's k")
    parser.add_argument("--out", default="out")
    args = parser.parse_args()
    d, m = args.ranks, 4 * args.ranks
    try:  # a bad --ranks or --offload-ratio: one line, before anything is written
        generate("1f1b", d, m)
        CostModel.uniform(1, 1, 1).with_offload_ratio(args.offload_ratio)
    except ConfigError as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    cases = [("1f1b", 1, {}, "none"), ("zb-v", 2, {}, "none"), ("group-interleaved", 2, {"group_size": (d + 1) // 2}, "none"),
             ("group-interleaved", 2, {"group_size": (d + 1) // 2}, "first:1"),
             ("group-interleaved", 2, {"group_size": (d + 1) // 2}, "all")]
    print(f"d={d} m={m} k={args.offload_ratio}   (memory: worst rank, rank units)")
    for name, v, options, offload in cases:
        costs = CostModel.uniform(1 / v, 1 / v, 1 / v).with_offload_ratio(args.offload_ratio)
        timeline = simulate(lower(generate(name, d, m, v, **options), costs, offload=offload), costs)
        print(f"{name:18} offload={offload:8} makespan {timeline.makespan:7.1f}  bubble {timeline.bubble_ratio:6.1%}  "
              f"memory {timeline.peak_rank_units:5.2f}  stall {timeline.stall:.2f}")
        picture = Path(args.out) / f"{name}-{offload.replace(':', '')}.png"
        write_atomic(picture, figure_bytes(timeline_figure(timeline, title=f"{name}, offload {offload}")))


if __name__ == "__main__":
    main()
