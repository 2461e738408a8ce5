"""``pipeoffload estimate``: the step time, MFU, memory and time breakdown of one exact layout (an adapter:
flags -> ``EstimateRequest`` -> ``service.run`` -> text or strict JSON)."""
from __future__ import annotations

import argparse
import sys

from pipeoffload import service
from pipeoffload.cli.common import model_and_hardware, positive_int, show_progress
from pipeoffload.errors import ConfigError
from pipeoffload.planner.cli_args import add_hardware_args, add_model_args
from pipeoffload.planner.estimate import GRAD_ACCUMULATION, P2P_MODES, RECOMPUTE_MODES, EstimateRequest
from pipeoffload.planner.hardware import GIB
from pipeoffload.planner.split import SPLITS
from pipeoffload.service.checks import strict_json


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("estimate", help="cost of one exact layout (no search): step time, MFU, memory")
    add_model_args(parser)
    add_hardware_args(parser)
    job = parser.add_argument_group("layout and training")
    for flag in ("tp", "pp", "dp"):
        job.add_argument(f"--{flag}", type=positive_int, default=1, help=f"{flag.upper()} size (default 1)")
    job.add_argument("--global-batch", type=positive_int, required=True, help="sequences per optimizer step")
    job.add_argument("--schedule", default="1f1b", help="schedule family (default 1f1b; see `pipeoffload schedules`)")
    job.add_argument("--stages-per-rank", type=positive_int, default=None,
                     help="v for interleaved families (default: the family's own, as simulate: 2 for "
                          "interleaved-1f1b and group-interleaved, 2 for V shapes, else 1); a v the family "
                          "cannot run is refused")
    job.add_argument("--recompute", choices=RECOMPUTE_MODES, default="none",
                     help="Megatron activation recomputation: none, selective (attention core) or full (every layer)")
    job.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=True,
                     help="Megatron's sequence parallelism with TP (default on)")
    job.add_argument("--distributed-optimizer", action="store_true", help="shard the optimizer state over DP")
    job.add_argument("--offload", default="none", help="offload policy: none, auto, all, first:K, budget:X")
    job.add_argument("--split", choices=SPLITS, default="even",
                     help="layers over stages: even (Megatron: divisible) or balanced (head weighed; the first/last "
                          "stage may hold only the embedding/head)")
    job.add_argument("--p2p", choices=P2P_MODES, default="eager",
                     help="point-to-point timing: eager (sends leave when ready; pipeoffload's runtime) or megatron "
                          "(Megatron-LM's blocking batched exchanges; 1f1b and interleaved-1f1b only)")
    job.add_argument("--grad-accumulation", choices=GRAD_ACCUMULATION, default="fused",
                     help="fused (weight-gradient GEMMs accumulate in place, Megatron's default) or separate (an "
                          "extra pass over the weights per microbatch: plain PyTorch autograd, 2021 Megatron)")
    job.add_argument("--memory", type=float, metavar="GIB", help="per-GPU budget for 'fits' (default 90%% of the GPU)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def request_from_args(args: argparse.Namespace) -> EstimateRequest:
    if args.memory is not None and not args.memory > 0:
        raise ConfigError(f"--memory {args.memory:g}: must be > 0 GiB")
    model, hardware = model_and_hardware(args)  # hf:DIR too (planner.cli_args.model_from_args)
    return EstimateRequest(
        model=model, hardware=hardware, tp=args.tp, pp=args.pp, dp=args.dp,
        global_batch=args.global_batch, schedule=args.schedule, stages_per_rank=args.stages_per_rank,
        recompute=args.recompute, sequence_parallel=args.sequence_parallel,
        distributed_optimizer=args.distributed_optimizer, offload=args.offload, split=args.split, p2p=args.p2p,
        grad_accumulation=args.grad_accumulation,
        memory_budget=args.memory * GIB if args.memory is not None else None)


def run(args: argparse.Namespace) -> int:
    request = request_from_args(args)
    show_progress()  # a long simulation (an offload policy over many microbatches) says so after a few seconds
    result = service.run(request)
    print(strict_json(result.as_dict(), indent=1) if args.json else result.text())
    for warning in result.warnings:
        print(f"pipeoffload estimate: warning: {warning}", file=sys.stderr)
    return 0
