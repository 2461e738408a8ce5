"""``pipeoffload plan``: the fastest PP x TP x DP layouts and schedules that fit a memory budget."""
from __future__ import annotations

import argparse
import json

from pipeoffload.cli.common import positive_int
from pipeoffload.planner.cli_args import add_hardware_args, add_model_args, hardware_from_args, model_from_args
from pipeoffload.planner.hardware import GIB
from pipeoffload.planner.measured import load_layer_costs
from pipeoffload.planner.report import format_result, result_as_dict
from pipeoffload.planner.search import PlanRequest, find_plans
from pipeoffload.planner.stagecosts import TrainingSetup


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers, e.g. 1,2,4") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: every value must be >= 1")
    return values


def _words(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("plan", help="search layouts, schedules, offload and recompute under a memory budget")
    add_model_args(parser)
    add_hardware_args(parser)
    job = parser.add_argument_group("job")
    job.add_argument("--gpus", type=positive_int, required=True, help="total number of GPUs")
    job.add_argument("--global-batch", type=positive_int, required=True, help="sequences per optimizer step")
    job.add_argument("--memory", type=float, metavar="GIB",
                     help="per-GPU memory budget in GiB (default: 90%% of the GPU's memory)")
    job.add_argument("--host-memory", type=float, metavar="GIB", help="pinned host memory per GPU in GiB")
    job.add_argument("--partial-recompute", action="store_true",
                     help="LGD partial recomputation (LayerNorm/activation/dropout): ~20 instead of 34 sbh saved")
    job.add_argument("--no-distributed-optimizer", action="store_true",
                     help="keep the full optimizer state on every data-parallel replica")
    space = parser.add_argument_group("search space")
    space.add_argument("--schedules", type=_words, help="families to try (default: 1f1b, interleaved-1f1b, "
                       "group-interleaved where available)")
    space.add_argument("--tp", type=_ints, help="tensor-parallel sizes (default: divisors up to GPUs per node)")
    space.add_argument("--pp", type=_ints, help="pipeline sizes (default: all divisors)")
    space.add_argument("--stages-per-rank", type=_ints, default=(2, 4), help="v for multi-stage families (2,4)")
    space.add_argument("--offload", type=_words, help="offload policies, e.g. none,first:1,all (default: all levels)")
    space.add_argument("--recompute", type=_words, help="recompute policies, e.g. none,all (default: all levels)")
    space.add_argument("--profile", metavar="JSON", help="measured per-layer costs from pipeoffload.profiling (TP 1)")
    space.add_argument("--exhaustive", action="store_true",
                       help="try every memory policy on every schedule, not only where nothing cheaper fits")
    space.add_argument("--exact-frontier", action="store_true",
                       help="simulate everything that could join the Pareto frontier (slower)")
    space.add_argument("--jobs", type=positive_int, default=1, help="worker processes (default 1)")
    out = parser.add_argument_group("output")
    out.add_argument("--top", type=positive_int, default=5, help="how many best plans to print (default 5)")
    out.add_argument("--by-tp", action="store_true",
                     help="also find and print the best plan of each TP size (PP + offload vs TP)")
    out.add_argument("--no-pareto", action="store_true", help="do not print the Pareto frontier")
    out.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def request_from_args(args: argparse.Namespace) -> PlanRequest:
    model, hw = model_from_args(args), hardware_from_args(args)
    budget = (args.memory * GIB) if args.memory is not None else 0.9 * hw.memory_bytes
    return PlanRequest(
        model=model, hardware=hw, gpus=args.gpus, global_batch=args.global_batch, memory_budget=budget,
        host_memory_budget=args.host_memory * GIB if args.host_memory is not None else None,
        setup=TrainingSetup(distributed_optimizer=not args.no_distributed_optimizer,
                            partial_recompute=args.partial_recompute),
        schedules=args.schedules, tp_sizes=args.tp, pp_sizes=args.pp, stages_per_rank=args.stages_per_rank,
        offload=args.offload, recompute=args.recompute,
        measured=load_layer_costs(args.profile) if args.profile else None, top=args.top,
        best_per_tp=args.by_tp, exact_frontier=args.exact_frontier, escalate=not args.exhaustive,
        workers=args.jobs,
    )


def run(args: argparse.Namespace) -> int:
    result = find_plans(request_from_args(args))
    if args.json:
        print(json.dumps(result_as_dict(result, args.top), indent=1))
    else:
        print(format_result(result, args.top, pareto=not args.no_pareto))
    return 0
