"""``pipeoffload show NAME``: the schedule as a step x rank text grid (optionally lowered)."""
from __future__ import annotations

import argparse

from pipeoffload.cli.common import add_family_options, add_schedule_args, schedule_from_args
from pipeoffload.passes.lower import lower
from pipeoffload.textgrid import render_grid


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("show", help="print a schedule as a step x rank grid")
    add_schedule_args(parser)
    add_family_options(parser)
    parser.add_argument("--lowered", action="store_true",
                        help="include the SEND/RECV actions (no OFFLOAD/RELOAD: show plans no offload; "
                        "`simulate --offload POLICY --trace FILE` shows the copies)")
    parser.add_argument("--format", choices=("grid", "text", "csv", "json"), default="grid",
                        help="grid (default), text (one line per rank), csv (torch.distributed.pipelining), json")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    schedule = schedule_from_args(args, group_size=args.group_size, backward=args.backward)
    if args.lowered:
        schedule = lower(schedule)
    if args.format == "grid":
        print(f"# {schedule.name}: ranks={schedule.num_ranks} microbatches={schedule.num_microbatches} "
              f"stages_per_rank={schedule.stages_per_rank} placement={schedule.placement.kind}")
        print(render_grid(schedule.actions))
    elif args.format == "text":
        print(schedule.to_text(), end="")
    elif args.format == "csv":
        print(schedule.to_csv(), end="")
    else:
        print(schedule.to_json())
    return 0
