"""``pipeoffload simulate NAME``: makespan, bubbles and memory of one schedule under a cost model."""
from __future__ import annotations

import argparse
import json

from pipeoffload.cli.common import add_cost_args, add_schedule_args, costs_from_args, schedule_from_args
from pipeoffload.cli.outputs import add_output_args, write_outputs
from pipeoffload.passes.lower import lower
from pipeoffload.simulate import Timeline, simulate


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("simulate", help="simulate a schedule: time, bubbles, memory per rank")
    add_schedule_args(parser)
    add_cost_args(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object (stable field names)")
    add_output_args(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    costs = costs_from_args(args)
    schedule = lower(schedule_from_args(args), costs)
    timeline = simulate(schedule, costs)
    write_outputs(args, [timeline])
    if args.json:
        print(json.dumps(timeline.as_dict(), indent=1))
    else:
        print(format_summary(timeline))
    return 0


def format_summary(timeline: Timeline) -> str:
    s = timeline.schedule
    lines = [
        f"{s.name}: ranks={s.num_ranks} microbatches={s.num_microbatches} stages_per_rank={s.stages_per_rank} "
        f"placement={s.placement.kind}",
        f"makespan {timeline.makespan:g}   bubble {timeline.bubble_ratio:.2%}   "
        f"peak {timeline.peak_activation_units:g} activation units ({timeline.peak_rank_units:g} rank units)"
        + (f"   stall {timeline.stall:g}" if timeline.stall else ""),
        "rank   busy   bubble   peak(act)  peak(rank)  peak(host)  stall",
    ]
    for r in timeline.per_rank:
        lines.append(f"{r.rank:4d} {r.busy:6g} {r.bubble_ratio:8.2%} {r.peak_activation_units:10g} "
                     f"{r.peak_rank_units:11g} {r.peak_host_units:11g} {r.stall:6g}")
    return "\n".join(lines)
