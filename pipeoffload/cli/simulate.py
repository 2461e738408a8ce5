"""``pipeoffload simulate NAME``: makespan, bubbles and memory of one schedule under a cost model."""
from __future__ import annotations

import argparse
import json
from dataclasses import replace

from pipeoffload.cli.common import (
    add_cost_args,
    add_schedule_args,
    costs_from_args,
    non_negative_float,
    positive_int,
    schedule_from_args,
)
from pipeoffload.cli.outputs import add_output_args, write_outputs
from pipeoffload.costs import CostModel, load_cost_file
from pipeoffload.passes.lower import lower_with_report
from pipeoffload.policies import OFFLOAD_FORMS, RECOMPUTE_FORMS, OffloadPolicy, RecomputePolicy
from pipeoffload.simulator import Timeline, simulate
from pipeoffload.units import MEMORY_UNIT, MEMORY_UNIT_HELP, TIME_UNIT, time_unit_help, units_dict


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("simulate", help="simulate a schedule: time, bubbles, memory per rank")
    add_schedule_args(parser)
    add_cost_args(parser)
    parser.add_argument("--costs", metavar="FILE", help="cost model from a JSON/TOML file (the profiler's "
                        "Profile.save or hand-written CostModel fields); replaces --time-f/-i/-w and --p2p-time; "
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
    group.add_argument("--group-size", "-g", type=positive_int, default=None,
                       help="group-interleaved: microbatches per group, 1..ranks (default ceil(ranks/2))")
    group.add_argument("--backward", choices=("split", "full"), default=None,
                       help="group-interleaved: emit I and W (split, default) or one B (full)")
    group.add_argument("--offload", default="none", metavar="POLICY", help=f"offload policy: {OFFLOAD_FORMS}")
    group.add_argument("--recompute", default="none", metavar="POLICY", help=f"recompute policy: {RECOMPUTE_FORMS}")
    group.add_argument("--offload-ratio", type=non_negative_float, default=0.0, metavar="K",
                       help="the paper's k = (D2H + H2D time of one activation) / (F+I+W time); 0 = instant copies")
    group.add_argument("--shared-host-link", action="store_true",
                       help="ranks 2p and 2p+1 share one host link (GPUs under one PCIe switch)")
    group.add_argument("--separate-copy-engines", action="store_true",
                       help="one copy engine per direction (default: one engine serves D2H and H2D)")


def memory_costs(args: argparse.Namespace, costs: CostModel) -> CostModel:
    """Apply the host-link flags, the offload ratio and partial recomputation to ``costs``."""
    costs = replace(costs, shared_host_link=args.shared_host_link or costs.shared_host_link,
                    shared_copy_engine=costs.shared_copy_engine and not args.separate_copy_engines)
    if args.offload_ratio:
        costs = costs.with_offload_ratio(args.offload_ratio)
    return RecomputePolicy.parse(args.recompute).apply_to(costs)


def simulate_from_args(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """(timeline, offload report) for parsed ``simulate`` flags; shared by compare and the playground."""
    timeline, report, _ = simulate_with_unit(args)
    return timeline, report


def simulate_with_unit(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """(timeline, offload report, time unit): the unit is the cost file's (``s`` for measured seconds)
    with ``--costs``, else the CLI's ``t``."""
    offload, recompute = OffloadPolicy.parse(args.offload), RecomputePolicy.parse(args.recompute)
    options = {"group_size": args.group_size, "backward": args.backward}
    generated = schedule_from_args(args, **options)
    if getattr(args, "costs", None):
        base, unit = load_cost_file(args.costs)
    else:
        base, unit = costs_from_args(args, generated.stages_per_rank), TIME_UNIT
    costs = memory_costs(args, base)
    schedule, report = lower_with_report(generated, costs, offload=offload, recompute=recompute)
    return simulate(schedule, costs), report, unit


def result_dict(timeline: Timeline, report, time_unit: str = TIME_UNIT) -> dict:  # type: ignore[no-untyped-def]
    """The object ``simulate --json`` prints: the timeline's numbers, their units, the policy report."""
    out = timeline.as_dict()
    v = max(timeline.schedule.stages_per_rank, 1)
    out["peak_host_rank_units"] = timeline.peak_host_units / v  # peak_host_units is in activation units
    for rank in out["per_rank"]:
        rank["peak_host_rank_units"] = rank["peak_host_units"] / v
    out["offload_report"] = report_dict(report)
    out["units"] = units_dict(time_unit)
    return out


def run(args: argparse.Namespace) -> int:
    timeline, report, unit = simulate_with_unit(args)
    write_outputs(args, [timeline], unit)
    if args.json:
        print(json.dumps(result_dict(timeline, report, unit), indent=1))
    else:
        print(format_summary(timeline, unit))
        if report.policy.kind != "none" or report.recompute != RecomputePolicy():
            print(report.summary())
    return 0


def report_dict(report) -> dict:  # type: ignore[no-untyped-def]
    return {
        "policy": str(report.policy),
        "recompute": str(report.recompute),
        "recomputed": len(report.recomputed),
        "unhidden": len(report.unhidden),
        "offloaded_after_i": report.offloaded_after_i,  # the second window (I -> W)
        "unhidden_after_i": len(report.unhidden_after_i),
        "offloaded_units_by_window": list(report.units_by_window),
        "planned_peak_before": report.peak_before,
        "planned_peak_after": report.peak_after,
        "budget": report.budget,
        "budget_met": report.budget_met,
    }


def format_summary(timeline: Timeline, time_unit: str = TIME_UNIT) -> str:
    s = timeline.schedule
    v = max(s.stages_per_rank, 1)
    lines = [
        f"{s.name}: ranks={s.num_ranks} microbatches={s.num_microbatches} stages_per_rank={s.stages_per_rank} "
        f"placement={s.placement.kind}",
        f"makespan {timeline.makespan:g} {time_unit}   bubble {timeline.bubble_ratio:.2%}   "
        f"peak {timeline.peak_rank_units:g} {MEMORY_UNIT} ({timeline.peak_activation_units:g} activation units)"
        + (f"   stall {timeline.stall:g} {time_unit}" if timeline.stall else ""),
        f"rank  busy({time_unit})  bubble  peak(device)  peak(host)  stall({time_unit})   [memory in {MEMORY_UNIT}]",
    ]
    for r in timeline.per_rank:
        lines.append(f"{r.rank:4d} {r.busy:8g} {r.bubble_ratio:7.2%} {r.peak_rank_units:13g} "
                     f"{r.peak_host_units / v:11g} {r.stall:9g}")
    lines.append(f"units: {time_unit_help(time_unit)}; {MEMORY_UNIT_HELP}")
    return "\n".join(lines)
