"""``pipeoffload estimate``: the step time, MFU, memory and time breakdown of one exact layout (an adapter:
flags -> ``EstimateRequest`` -> ``service.run`` -> text or strict JSON)."""
from __future__ import annotations

import argparse
import sys
from typing import Any

from pipeoffload import service
from pipeoffload.cli.common import add_max_stall, add_planner_link_args, model_and_hardware, positive_int, show_progress
from pipeoffload.errors import FLAGS, ConfigError, in_words
from pipeoffload.planner.cli_args import add_hardware_args, add_model_args
from pipeoffload.planner.estimate import GRAD_ACCUMULATION, P2P_MODES, RECOMPUTE_MODES, EstimateRequest
from pipeoffload.planner.hardware import GIB
from pipeoffload.planner.split import SPLITS
from pipeoffload.policies import INT_TEXT
from pipeoffload.service.argtypes import default_of
from pipeoffload.service.checks import strict_json


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("estimate", help="cost of one exact layout (no search): step time, MFU, memory")
    add_model_args(parser)
    add_hardware_args(parser)
    job = parser.add_argument_group("layout and training")
    for flag in ("tp", "pp", "dp"):
        job.add_argument(f"--{flag}", type=positive_int, default=_default(flag),
                         help=f"{flag.upper()} size, in GPUs (default %(default)s)")
    job.add_argument("--global-batch", type=positive_int, required=True, help="sequences per optimizer step (required)")
    job.add_argument("--schedule", default=_default("schedule"),
                     help="schedule family (default %(default)s; see `pipeoffload schedules`)")
    job.add_argument("--stages-per-rank", type=positive_int, default=None,
                     help="v for interleaved families (default: the family's own, as simulate: 2 for "
                          "interleaved-1f1b and group-interleaved, 2 for V shapes, else 1); a v the family "
                          "cannot run is refused")
    job.add_argument("--group-size", type=positive_int, default=None, metavar="G",
                     help="g of group-interleaved, 1..PP (default: ceil(PP/2), its lowest memory); plan's g column")
    job.add_argument("--recompute", default=_default("recompute"), metavar="{" + ",".join(RECOMPUTE_MODES) + "}",
                     help="Megatron activation recomputation: none, selective (attention core) or full (every layer) "
                          "(default %(default)s)")
    job.add_argument("--recompute-policy", default=_default("recompute_policy"), metavar="POLICY",
                     help="pipeoffload's recompute policy, plan's recompute column: none, first:K (the K longest-lived "
                          "stages of each rank), all, or auto (what the offload policy could not move); R actions in "
                          "the schedule, on top of --recompute (default %(default)s)")
    job.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction,
                     default=_default("sequence_parallel"),
                     help=f"Megatron's sequence parallelism with TP (default {_on(_default('sequence_parallel'))})")
    job.add_argument("--distributed-optimizer", action=argparse.BooleanOptionalAction,
                     default=_default("distributed_optimizer"),
                     help=f"shard the optimizer state over DP (default {_on(_default('distributed_optimizer'))}, as "
                          "Megatron-LM; plan's default is on: pass it to reproduce a plan row)")
    job.add_argument("--offload", default=_default("offload"),
                     help="offload policy: none, auto, all, first:K, budget:X (activation units), or budget: the "
                          "target --memory leaves, as plan fills it (plan prints that target in GiB; default "
                          "%(default)s)")
    add_max_stall(job)
    add_planner_link_args(job)
    job.add_argument("--split", choices=SPLITS, default=_default("split"),
                     help="layers over stages: even (as plan: as even as possible, the remainder on the earliest "
                          "stages) or balanced (head weighed; the first/last stage may hold only the embedding/head; "
                          "default %(default)s)")
    job.add_argument("--layers-per-stage", type=_counts, default=None, metavar="N,N,...",
                     help="an explicit split, one count per stage (what plan --emit writes as layers_per_stage; "
                          "default: --split's)")
    job.add_argument("--p2p", choices=P2P_MODES, default=_default("p2p"),
                     help="point-to-point timing: eager (sends leave when ready; pipeoffload's runtime) or megatron "
                          "(Megatron-LM's blocking batched exchanges; 1f1b and interleaved-1f1b only; default "
                          "%(default)s)")
    job.add_argument("--grad-accumulation", choices=GRAD_ACCUMULATION, default=_default("grad_accumulation"),
                     help="fused (weight-gradient GEMMs accumulate in place, Megatron's default) or separate (an "
                          "extra pass over the weights per microbatch: plain PyTorch autograd, 2021 Megatron; "
                          "default %(default)s)")
    job.add_argument("--memory", type=float, metavar="GIB", help="per-GPU budget for 'fits' (default 90%% of the GPU)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def _default(name: str) -> Any:
    """``EstimateRequest``'s default of ``name``: the flag's, so the two cannot differ."""
    return default_of(EstimateRequest, name)


def _on(value: object) -> str:
    return "on" if value else "off"


def _counts(text: str) -> tuple[int, ...]:
    parts = [x.strip() for x in text.split(",")]
    if not all(INT_TEXT.fullmatch(x) for x in parts):  # plain ASCII digits, as every number flag
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated layer counts, e.g. 3,3,2,2")
    values = tuple(int(x) for x in parts)
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: every count must be >= 0")
    return values


def request_from_args(args: argparse.Namespace) -> EstimateRequest:
    if args.memory is not None and not args.memory > 0:
        raise ConfigError(f"--memory {args.memory:g}: must be > 0 GiB")
    model, hardware = model_and_hardware(args)  # hf:DIR too (planner.cli_args.model_from_args)
    return EstimateRequest(
        model=model, hardware=hardware, tp=args.tp, pp=args.pp, dp=args.dp,
        global_batch=args.global_batch, schedule=args.schedule, stages_per_rank=args.stages_per_rank,
        group_size=args.group_size, recompute=args.recompute, recompute_policy=args.recompute_policy,
        sequence_parallel=args.sequence_parallel, distributed_optimizer=args.distributed_optimizer,
        offload=args.offload, max_stall=args.max_stall, partial_recompute=args.partial_recompute,
        host_link=args.shared_host_link, split=args.split, layers_per_stage=args.layers_per_stage, p2p=args.p2p,
        grad_accumulation=args.grad_accumulation,
        memory_budget=args.memory * GIB if args.memory is not None else None)


def run(args: argparse.Namespace) -> int:
    request = request_from_args(args)
    show_progress()  # a long simulation (an offload policy over many microbatches) says so after a few seconds
    result = service.run(request)
    print(strict_json(result.as_dict(FLAGS), indent=1) if args.json else result.text(FLAGS))
    for warning in result.warnings:
        print(f"pipeoffload estimate: warning: {in_words(warning, FLAGS)}", file=sys.stderr)
    return 0
