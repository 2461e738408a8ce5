"""``pipeoffload simulate NAME``: makespan, bubbles and memory of one schedule under a cost model."""
from __future__ import annotations

import argparse
import logging
import shlex
from typing import TYPE_CHECKING

from pipeoffload.cli.common import (
    add_cost_args,
    add_family_options,
    add_max_stall,
    add_schedule_args,
    non_negative_float,
)
from pipeoffload.cli.outputs import add_output_args, check_output_args
from pipeoffload.errors import FLAGS, ConfigError
from pipeoffload.fileio import write_atomic
from pipeoffload.policies import OFFLOAD_FORMS, RECOMPUTE_FORMS, RecomputePolicy
from pipeoffload.service import SimulateRequest, SimulateResult, simulate, strict_json
from pipeoffload.service.argtypes import default_of
from pipeoffload.service.simulate import COST_FIELDS, K_DEFAULT_HELP, SCHEDULE_SUFFIXES
from pipeoffload.simulator import Timeline
from pipeoffload.units import MEMORY_UNIT, MEMORY_UNIT_HELP, TIME_UNIT, counted, rank_units, time_unit_help

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

log = logging.getLogger(__name__)
COST_FLAGS = COST_FIELDS  # --time-f/-i/-w and --p2p-time: a costs file gives these


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("simulate", help="simulate a schedule: time, bubbles, memory per rank")
    add_schedule_args(parser, files=True)
    add_cost_args(parser)
    parser.set_defaults(**dict.fromkeys(COST_FLAGS))  # None: not given, so one given beside --costs is refused
    parser.add_argument("--costs", metavar="FILE", help="cost model from a JSON/TOML file (the profiler's "
                        "Profile.save or hand-written CostModel fields); its times are per stage (time_f: one "
                        "microbatch's forward through one stage, so with v stages per rank it is --time-f / v), "
                        "and it cannot be combined with --time-f/-i/-w or --p2p-time; "
                        "its times are in seconds (s) when it says time_unit = \"s\" or is the profiler's; "
                        "without it w_fraction (the part of an activation W still needs after I) is 1.0, "
                        "the conservative default: a costs file's w_fraction replaces it")
    add_memory_args(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object (stable field names)")
    add_output_args(parser)
    parser.set_defaults(run=run)


def add_memory_args(parser: argparse.ArgumentParser) -> None:
    """Group-interleaved options, offload/recompute policies and the host-link model."""
    group = parser.add_argument_group("activation memory (offload, recompute)")
    add_family_options(group)
    group.add_argument("--offload", default=default_of(SimulateRequest, "offload"), metavar="POLICY",
                       help=f"offload policy: {OFFLOAD_FORMS} (default %(default)s)")
    group.add_argument("--recompute", default=default_of(SimulateRequest, "recompute"), metavar="POLICY",
                       help=f"recompute policy: {RECOMPUTE_FORMS} (default %(default)s)")
    group.add_argument("--offload-ratio", type=non_negative_float, default=None, metavar="K",
                       help="the paper's k = (D2H + H2D time of one activation) / (F+I+W time); 0 = instant "
                            f"copies; {K_DEFAULT_HELP}")
    group.add_argument("--plan-ratio", type=non_negative_float, default=None, metavar="K",
                       help="plan the copies for this k instead and run them at --offload-ratio: a host link "
                            "faster (smaller k) or slower than planned (default: plan for the k they take)")
    add_max_stall(group)
    group.add_argument("--shared-host-link", action="store_true",
                       help="ranks 2p and 2p+1 share one host link (GPUs under one PCIe switch)")
    group.add_argument("--separate-copy-engines", action="store_true",
                       help="one copy engine per direction (default: one engine serves D2H and H2D)")


def request_from_args(args: argparse.Namespace) -> SimulateRequest:
    """The service's request for parsed ``simulate`` flags (shared by ``compare``); a cost flag given beside
    ``--costs`` is refused (the file's times are per stage, the flags' per rank: neither may silently win)."""
    given = [f"--{name.replace('_', '-')}" for name in COST_FLAGS if getattr(args, name) is not None]
    if args.costs and given:
        raise ConfigError(f"--costs {args.costs} gives the costs (per stage); {' and '.join(given)} (per rank) "
                          "cannot be combined with it: put the times in the file or leave --costs out")
    times = {name: getattr(args, name) for name in COST_FLAGS if getattr(args, name) is not None}
    is_file = args.name.lower().endswith(SCHEDULE_SUFFIXES)
    return SimulateRequest(
        family="" if is_file else args.name, schedule_file=args.name if is_file else None, ranks=args.ranks, microbatches=args.microbatches, stages_per_rank=args.stages_per_rank,
        **times, costs_file=args.costs,
        group_size=args.group_size, backward=args.backward, offload=args.offload, recompute=args.recompute,
        offload_ratio=args.offload_ratio, plan_ratio=args.plan_ratio, max_stall=args.max_stall,
        shared_host_link=args.shared_host_link, separate_copy_engines=args.separate_copy_engines)


def run(args: argparse.Namespace) -> int:
    request = request_from_args(args)
    fmt = check_output_args(args)
    result = simulate(request)
    command = shlex.join(request.command())
    write_outputs(args, result, command, fmt)
    if args.json:
        print(strict_json(result.as_dict(FLAGS), indent=1))
    else:
        print(format_summary(result.timeline, result.time_unit, request.k, result.planned_k,
                             file_k=result.file_k(), time_help=result.time_help(FLAGS)))
        report = result.report
        if report.policy.kind != "none" or report.recompute != RecomputePolicy():
            print(report.summary())
    return 0


def result_figure(result: SimulateResult) -> Figure:
    """The chart of ``--plot`` and ``--report``: the result's title, and a costs file's time unit named."""
    from pipeoffload.viz.plot import COSTS_FILE_TIME_LABEL, timeline_figure

    label = COSTS_FILE_TIME_LABEL if result.request.costs_file and result.time_unit == TIME_UNIT else None
    return timeline_figure(result.timeline, result.title(), time_unit=result.time_unit, time_label=label)


def write_outputs(args: argparse.Namespace, result: SimulateResult, command: str, fmt: str) -> None:
    """``--plot`` (in ``fmt``), ``--trace`` and ``--report`` of one result (checked before the work by
    ``check_output_args``): its title over the chart, a costs file's time unit named in the chart, the
    trace and the report, the report's row labelled by ``result.label()`` as compare labels it."""
    if args.trace:
        from pipeoffload.viz.chrome_trace import timeline_trace_json

        write_atomic(args.trace, timeline_trace_json(result.timeline, result.time_unit, result.time_help(FLAGS)))
        log.info("wrote %s", args.trace)
    if not (args.plot or args.report):
        return
    from pipeoffload.viz.plot import figure_bytes
    from pipeoffload.viz.report import html_report

    if args.plot:
        write_atomic(args.plot, figure_bytes(result_figure(result), fmt))
        log.info("wrote %s", args.plot)
    if args.report:
        picture = figure_bytes(result_figure(result), dpi=100)
        write_atomic(args.report, html_report([result.timeline], pictures=[picture], labels=[result.label()],
                                              commands=[command], time_unit=result.time_unit,
                                              time_help=result.time_help(FLAGS)))
        log.info("wrote %s", args.report)


def format_summary(timeline: Timeline, time_unit: str = TIME_UNIT, k: float | None = None,
                   planned: float | None = None, file_k: str | None = None, time_help: str | None = None) -> str:
    """The text report; its header names the offload ratio k the copies took (None: a costs file's,
    ``file_k``) and, where it differs, the one they were planned for; ``time_help`` says what the time
    unit is (default ``time_unit_help(time_unit, FLAGS)``)."""
    s = timeline.schedule
    v = max(s.stages_per_rank, 1)
    from_file = f"{file_k} (from the costs file)" if file_k is not None else "from the costs file"
    lines = [
        f"{s.name}: ranks={s.num_ranks} microbatches={s.num_microbatches} stages_per_rank={s.stages_per_rank} "
        f"placement={s.placement.kind} offload_ratio k={from_file if k is None else f'{k:g}'}"
        + (f" (copies planned for k={planned:g})" if planned is not None and planned != k else ""),
        f"makespan {timeline.makespan:g} {time_unit}   bubble {timeline.bubble_ratio:.2%}   "
        f"peak {rank_units(timeline.peak_rank_units)} ({counted(timeline.peak_activation_units, 'activation unit')})"
        + (f"   stall {timeline.stall:g} {time_unit} (summed over ranks)" if timeline.stall else ""),
        f"rank  busy({time_unit})  bubble  peak(device)  peak(host)  stall({time_unit})   [memory in {MEMORY_UNIT}]",
    ]
    for r in timeline.per_rank:
        lines.append(f"{r.rank:4d} {r.busy:8g} {r.bubble_ratio:7.2%} {r.peak_rank_units:13g} "
                     f"{r.peak_host_units / v:11g} {r.stall:9g}")
    lines.append(f"units: {time_help or time_unit_help(time_unit, FLAGS)}; {MEMORY_UNIT_HELP}")
    return "\n".join(lines)
