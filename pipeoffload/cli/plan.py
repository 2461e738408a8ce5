"""``pipeoffload plan``: the fastest PP x TP x DP layouts and schedules that fit a memory budget."""
from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace
from typing import Any

from pipeoffload.cli.common import add_max_stall, add_planner_link_args, model_and_hardware, positive_int, show_progress
from pipeoffload.errors import FLAGS, ConfigError, in_words
from pipeoffload.fileio import check_extension, check_writable
from pipeoffload.planner.cli_args import add_hardware_args, add_model_args
from pipeoffload.planner.compare_tp import BASELINES
from pipeoffload.planner.emit import DTYPES, check_emit_setup, train_model, train_setup
from pipeoffload.planner.hardware import GIB
from pipeoffload.planner.measured import load_layer_costs
from pipeoffload.planner.model import ModelSpec
from pipeoffload.planner.plans import InfeasibleError, default_families
from pipeoffload.planner.report import plan_warnings
from pipeoffload.planner.stagecosts import TrainingSetup
from pipeoffload.policies import INT_TEXT
from pipeoffload.service import CompareTPRequest, PlanRequest, compare_tp, plan, strict_json
from pipeoffload.service.argtypes import default_of

log = logging.getLogger(__name__)


def _ints(text: str) -> tuple[int, ...]:
    parts = text.split(",")
    if not all(INT_TEXT.fullmatch(x.strip()) for x in parts):  # plain ASCII digits, as every number flag
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers, e.g. 1,2,4")
    values = tuple(int(x) for x in parts)
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: every value must be >= 1")
    return values


MIN_MEMORY_GIB = 2.0 ** -10


def _words(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("plan", help="search layouts, schedules, offload and recompute under a memory budget")
    add_model_args(parser)
    add_hardware_args(parser)
    job = parser.add_argument_group("job")
    job.add_argument("--gpus", type=positive_int, required=True, help="total number of GPUs (required)")
    job.add_argument("--global-batch", type=positive_int, required=True,
                     help="sequences per optimizer step (required)")
    job.add_argument("--memory", type=float, metavar="GIB",
                     help="per-GPU memory budget in GiB (default: 90%% of the GPU's memory)")
    job.add_argument("--host-memory", type=float, metavar="GIB",
                     help="pinned host memory per GPU in GiB (default: no limit)")
    add_planner_link_args(job)
    job.add_argument("--dtype", choices=tuple(DTYPES), default="bf16",
                     help="the run's activations: bf16 (2 bytes; with --emit, train's bf16 autocast) or fp32 "
                          "(default %(default)s); --emit writes it")
    job.add_argument("--no-sequence-parallel", action="store_true",
                     help="tensor parallelism without Megatron's sequence parallelism")
    job.add_argument("--no-distributed-optimizer", action="store_true",
                     help="keep the full optimizer state on every data-parallel replica")
    space = parser.add_argument_group("search space")
    space.add_argument("--schedules", type=_words,
                       help=f"families to try, comma-separated (default: {', '.join(default_families())})")
    space.add_argument("--tp", type=_ints, help="tensor-parallel sizes (default: divisors up to GPUs per node)")
    space.add_argument("--pp", type=_ints, help="pipeline sizes (default: all divisors)")
    space.add_argument("--stages-per-rank", type=_ints, default=_default("stages_per_rank"), metavar="V",
                       help=f"v for multi-stage families, comma-separated (default "
                            f"{','.join(map(str, _default('stages_per_rank')))})")
    space.add_argument("--group-sizes", type=_ints, metavar="G",
                       help="g for group-interleaved, comma-separated: only the families with a g are searched, "
                            "and a g above PP is skipped (default: every family; g = ceil(PP/2) and PP)")
    space.add_argument("--offload", type=_words, help="offload policies, e.g. none,first:1,all (default: all levels)")
    space.add_argument("--recompute", type=_words,
                       help="recompute policies, e.g. none,all (default: all levels); 'selective' adds Megatron's "
                            "selective recomputation of the attention core to every plan")
    add_max_stall(space)
    space.add_argument("--split", choices=("even", "balanced"), default=_default("split"),
                       help="layers over stages: even or balanced (head weighed; the first/last stage may hold only "
                            "the embedding/head; default %(default)s)")
    space.add_argument("--profile", metavar="JSON",
                       help="measured per-layer costs from pipeoffload.profiling (used for the TP size it was "
                            "measured at; default: the cost model's)")
    space.add_argument("--exhaustive", action="store_true",
                       help="try every memory policy on every schedule, not only where nothing cheaper fits")
    space.add_argument("--exact-frontier", action="store_true",
                       help="simulate everything that could join the Pareto frontier (slower)")
    space.add_argument("--jobs", type=positive_int, default=_default("workers"),
                       help="worker processes (default %(default)s)")
    out = parser.add_argument_group("output")
    out.add_argument("--top", type=positive_int, default=_default("top"),
                     help="how many best plans to print (default %(default)s)")
    out.add_argument("--by-tp", action="store_true",
                     help="also find and print the best plan of each TP size (PP + offload vs TP)")
    out.add_argument("--no-pareto", action="store_true", help="do not print the Pareto frontier")
    out.add_argument("--json", action="store_true", help="print one JSON object")
    out.add_argument("--emit", metavar="TOML",
                     help="write the best plan as a train config (run.toml; default: none written)")
    out.add_argument("--compare-tp", action="store_true",
                     help="PP + offload (TP 1) against --baseline, same GPUs, batch and budget")
    out.add_argument("--baseline", choices=BASELINES, default=None,
                     help="tp8-interleaved (default): interleaved 1F1B + TP8 + SP, the paper's; best: any TP 2-8")
    out.add_argument("--match-memory", action="store_true",
                     help="with --compare-tp: PP + offload may use no more activation memory than the baseline plan")
    parser.set_defaults(run=run)


def _default(name: str) -> Any:
    """``PlanRequest``'s default of ``name``: the flag's, so the two cannot differ."""
    return default_of(PlanRequest, name)


def memory_budget(args: argparse.Namespace, capacity: float) -> float:
    """``--memory`` in bytes, never above the device (a larger value is capped; ``PlanRequest.memory_asked``
    keeps it for the warning)."""
    if args.memory is None:
        return 0.9 * capacity
    if not args.memory > 0:
        raise ConfigError(f"--memory {args.memory:g}: must be > 0 GiB")
    if args.memory < MIN_MEMORY_GIB:  # below a MiB no model fits; the API's bytes hint would not apply
        raise ConfigError(f"--memory {args.memory:g}: is in GiB per GPU and holds no model below "
                          f"{MIN_MEMORY_GIB:g} GiB (1 MiB); give e.g. --memory 40")
    return min(args.memory * GIB, capacity)


def check_tp_flag(args: argparse.Namespace, model: ModelSpec, per_node: int) -> None:
    heads, kv_heads, ffn = model.heads, model.num_kv_heads, model.ffn_size
    for tp in args.tp or ():
        if args.gpus % tp or heads % tp or kv_heads % tp or ffn % tp:
            raise ConfigError(f"--tp {tp}: must divide --gpus {args.gpus}, the model's heads ({heads}), KV heads "
                              f"({kv_heads}) and FFN width ({ffn}); use --tp {model.tp_sizes(per_node, args.gpus)}")
        if tp > per_node:
            raise ConfigError(f"--tp {tp}: above the {per_node} GPUs per node (tensor parallelism stays inside "
                              "a node); use a smaller --tp or --hw gpus_per_node=N")


def request_from_args(args: argparse.Namespace) -> PlanRequest:
    recompute = args.recompute
    selective = recompute is not None and "selective" in recompute
    if selective:
        recompute = tuple(r for r in recompute if r != "selective") or None
    model, hw = model_and_hardware(args)
    model = model.with_(dtype_bytes=DTYPES[args.dtype])
    setup = TrainingSetup(distributed_optimizer=not args.no_distributed_optimizer,
                          partial_recompute=args.partial_recompute, host_link=args.shared_host_link,
                          sequence_parallel=not args.no_sequence_parallel, selective_recompute=selective)
    if args.emit:  # the run the file starts, as `train --plan auto` plans it: train's blocks and state
        check_emit_setup(setup)  # a flag --emit could only ignore is refused, as the service's emit() does
        model = train_model(model, args.dtype)
        setup = replace(train_setup(), host_link=args.shared_host_link)
    check_tp_flag(args, model, hw.gpus_per_node)
    budget = memory_budget(args, hw.memory_bytes)
    if args.host_memory is not None and not args.host_memory > 0:
        raise ConfigError(f"--host-memory {args.host_memory:g}: must be > 0 GiB (omit it for no limit)")
    return PlanRequest(
        model=model, hardware=hw, gpus=args.gpus, global_batch=args.global_batch, memory_budget=budget,
        host_memory_budget=args.host_memory * GIB if args.host_memory is not None else None,
        setup=setup,
        schedules=args.schedules, tp_sizes=args.tp, pp_sizes=args.pp, stages_per_rank=args.stages_per_rank,
        group_sizes=args.group_sizes, offload=args.offload, recompute=recompute,
        measured=load_layer_costs(args.profile) if args.profile else None, top=args.top,
        best_per_tp=args.by_tp, exact_frontier=args.exact_frontier, escalate=not args.exhaustive,
        workers=args.jobs, split=args.split, max_stall=args.max_stall,
        memory_asked=args.memory * GIB if args.memory is not None and args.memory * GIB > budget else None,
    )


def run(args: argparse.Namespace) -> int:
    if not args.compare_tp and (args.baseline is not None or args.match_memory):
        raise ConfigError(f"{'--baseline' if args.baseline is not None else '--match-memory'} only applies "
                          "with --compare-tp; add --compare-tp")
    req = request_from_args(args)
    if args.emit:
        check_writable(args.emit, f"--emit {args.emit}")
        check_extension(args.emit, f"--emit {args.emit}", (".toml",), "a train config (TOML)")
    show_progress()
    if args.compare_tp:
        cmp = compare_tp(CompareTPRequest(req, args.baseline or "tp8-interleaved", match_memory=args.match_memory))
        for line in cmp.warnings:
            print(f"pipeoffload plan: warning: {in_words(line, FLAGS)}", file=sys.stderr)
        print(strict_json(cmp.as_dict(FLAGS), indent=1) if args.json else cmp.text(FLAGS))
        command = cmp.emit(args.emit) if args.emit else None
        if command is not None:
            print(f"wrote {args.emit} (the PP + offload plan); run it with: {command}")
        return 0
    try:
        result = plan(req)
    except InfeasibleError:
        for note in req.notes():  # the smallest feasible memory rests on the model as read too
            print(f"pipeoffload plan: warning: {in_words(note, FLAGS)}", file=sys.stderr)
        raise
    for warning in plan_warnings(result.search):
        print(f"pipeoffload plan: warning: {in_words(warning, FLAGS)}", file=sys.stderr)
    print(strict_json(result.as_dict(FLAGS), indent=1) if args.json else result.text(not args.no_pareto, FLAGS))
    if args.emit:
        command = result.emit(args.emit)
        print(f"wrote {args.emit}; run it with: {command}", file=sys.stderr if args.json else sys.stdout)
    return 0
