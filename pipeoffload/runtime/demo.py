"""Train the reference GPT with a pipeline schedule: a runnable check of the whole runtime.

Under torchrun (one process per rank; gloo on CPU, NCCL when CUDA is available)::

    torchrun --standalone --nproc_per_node 2 -m pipeoffload.runtime --schedule 1f1b --offload all

Or spawned from Python (gloo on CPU)::

    python -m pipeoffload.runtime --spawn 2 --schedule zb-v --stages-per-rank 2

Each step prints the loss (from the rank holding the last stage) and every rank's peak resident
activation bytes; ``--trace out.json`` writes a Chrome trace of the last step of every rank. Steps are
numbered from 1, as ``pipeoffload train`` numbers them, in the log, in failures and in the trace.
"""
from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from typing import Any

import torch
import torch.distributed as dist

from pipeoffload import generate, lower
from pipeoffload.errors import ConfigError, ScheduleError, in_flags, renaming
from pipeoffload.fileio import TRACE_JSON, check_extension, check_writable
from pipeoffload.models import GPTConfig, build_rank_stages, even_counts, gpt_layers, lm_loss, sample_batch
from pipeoffload.runtime import GRACE, SETTLE
from pipeoffload.runtime.executor import PipelineError, PipelineRunner
from pipeoffload.runtime.launch import exit_rank, init_from_env, spawn
from pipeoffload.runtime.trace import Trace, write_chrome_trace
from pipeoffload.service.argtypes import OneLineParser, positive_int

PROG = "python -m pipeoffload.runtime"
SCHEDULE_NAMES = {"num_ranks": "spawn", "num_microbatches": "microbatches"}  # a generator's refusal in these flags


def _lower(args: argparse.Namespace, world: int) -> Any:
    with renaming(SCHEDULE_NAMES):
        schedule = generate(args.schedule, world, args.microbatches, args.stages_per_rank)
    return lower(schedule, offload=args.offload, recompute=args.recompute)


def train(rank: int, world: int, args: argparse.Namespace, device: torch.device | None = None) -> dict:
    device = device or torch.device("cpu")
    cfg = GPTConfig(layers=args.layers, hidden=args.hidden, seq=args.seq)
    schedule = _lower(args, world)
    layers = [layer.to(device) for layer in gpt_layers(cfg, seed=0)]
    stages = build_rank_stages(layers, even_counts(len(layers), schedule.num_stages), schedule.placement, rank)
    params = [p for m in stages.values() for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-3)
    runner = PipelineRunner(stages, schedule, rank, loss_fn=lm_loss, device=device, timeout=args.timeout)
    losses = []
    for step in range(1, args.steps + 1):  # numbered from 1, as train's: the log, failures and the trace agree
        inputs, targets = sample_batch(cfg, args.batch, seed=step - 1)
        loss = runner.step(inputs, targets, step=step)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if loss is not None:
            losses.append(loss.item())
            logging.info("step %d loss %.4f", step, loss.item())
        trace = runner.trace
        assert trace is not None
        logging.info("step %d peak activation bytes %d (%.3fs)", step, trace.peak_bytes, trace.wall)  # [rank r] prefixes it
    runner.close()  # its heartbeat thread ends before the process group is destroyed (not after a failure:
    # a rank that failed exits at once, and its store may be gone with a dead peer)
    return {"rank": rank, "losses": losses, "trace": trace.as_dict() if trace is not None else {}}


def _spawned(rank: int, world: int, args: argparse.Namespace) -> dict:
    logging.basicConfig(level=logging.INFO, format=f"[rank {rank}] %(message)s")
    return train(rank, world, args)


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be >= 0 (0: read torchrun's environment)")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value} must be > 0")
    return value


def build_parser() -> OneLineParser:
    """The module's flags; each default is written once, as argparse's, and its help shows it (%(default))."""
    p = OneLineParser(prog=PROG, description=(__doc__ or "").splitlines()[0])
    p.add_argument("--schedule", default="1f1b",
                   help="schedule family (see `pipeoffload schedules`; default %(default)s)")
    p.add_argument("--stages-per-rank", type=positive_int, default=None,
                   help="stages per rank v (default: the family's own default)")
    p.add_argument("--microbatches", type=positive_int, default=4,
                   help="microbatches per step m; must divide --batch (default %(default)s)")
    p.add_argument("--offload", default="none",
                   help="offload policy passed to lower(): none, all, first:K, ... (default %(default)s)")
    p.add_argument("--recompute", default="none",
                   help="recompute policy passed to lower(): none, first:K, ... (default %(default)s)")
    p.add_argument("--steps", type=positive_int, default=3, help="optimizer steps (AdamW) (default %(default)s)")
    p.add_argument("--batch", type=positive_int, default=8,
                   help="sequences per step, split into --microbatches equal microbatches (default %(default)s)")
    p.add_argument("--layers", type=positive_int, default=6,
                   help="transformer blocks of the reference GPT, besides its embedding and head (default "
                        "%(default)s)")
    p.add_argument("--hidden", type=positive_int, default=32,
                   help=f"hidden size, in elements; a multiple of the {GPTConfig().heads} attention heads "
                        "(default %(default)s)")
    p.add_argument("--seq", type=positive_int, default=16, help="tokens per sequence (default %(default)s)")
    p.add_argument("--spawn", type=_non_negative_int, default=0,
                   help="spawn this many ranks (gloo on CPU) instead of reading torchrun's environment (default "
                        "%(default)s: torchrun's)")
    p.add_argument("--timeout", type=_positive_float, default=300.0,
                   help="seconds any rank waits for a peer before failing (default %(default)g)")
    p.add_argument("--trace", default=None,
                   help="write a Chrome trace (.json) of every rank's last step to this file (default: none)")
    return p


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def check(args: argparse.Namespace, world: int) -> None:
    """Raise ``ConfigError``/``ScheduleError`` for flags no rank could run (checked before any start)."""
    schedule = _lower(args, world)
    stages = schedule.num_stages
    if args.layers + 2 < stages:  # the embedding and the head are layers of their own (gpt_layers)
        raise ConfigError(f"--layers {args.layers}: {schedule.name} on {world} ranks has {stages} stages, each "
                          f"needing a layer, and the embedding and the head are two of them; use --layers "
                          f"{stages - 2} or more")
    even_counts(args.layers + 2, stages)
    heads = GPTConfig().heads
    if args.hidden % heads:
        raise ConfigError(f"--hidden {args.hidden}: must be a multiple of the {heads} attention heads")
    if args.batch % args.microbatches:  # equal microbatches, each a 1/m share of the loss (spec.split_microbatches)
        raise ConfigError(f"--batch {args.batch}: must be a multiple of --microbatches {args.microbatches} (equal "
                          f"microbatches of at least one row); use --batch "
                          f"{max(1, args.batch // args.microbatches) * args.microbatches}")
    if args.trace is not None:  # written after the run: a bad place must not cost the run first
        check_writable(args.trace, f"--trace {shlex.quote(args.trace)}")
        check_extension(args.trace, f"--trace {args.trace}", *TRACE_JSON)  # as simulate --trace


def _world(args: argparse.Namespace) -> int:
    if args.spawn:
        return int(args.spawn)
    if "WORLD_SIZE" not in os.environ:
        raise ConfigError("no WORLD_SIZE in the environment: run under torchrun or pass --spawn N")
    return int(os.environ["WORLD_SIZE"])


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    try:
        check(args, _world(args))
    except (ConfigError, ScheduleError) as err:
        if os.environ.get("RANK", "0") == "0":  # under torchrun every rank checks; one prints
            print(f"{PROG}: error: {in_flags(err).splitlines()[0]}", file=sys.stderr)
        raise SystemExit(2) from None
    if args.spawn:
        # as `pipeoffload train`'s launcher: a failed rank's peers learn of it from their lost connections at once,
        # or name a stuck peer after --timeout themselves; a rank still running SETTLE s after another failed by
        # its own error (GRACE s after one that only lost a peer) is stuck in its own code or blocked where it
        # cannot see the failure (joining the process group)
        result = spawn(_spawned, args.spawn, (args,), timeout=args.timeout, deadline=3600, grace=GRACE,
                       settle=SETTLE)
        if not result.ok:
            for e in result.errors:
                if e:
                    print(e.split("\n\n")[0], file=sys.stderr)
            # last, the verdict blaming the rank where the failure started (a killed rank, not the peer that lost it)
            print(f"{PROG}: failed: {result.summary()}", file=sys.stderr)
            raise SystemExit(1)
        traces = [Trace.from_dict(r["trace"]) for r in result.results]
    else:
        rank, world, device = init_from_env(timeout=args.timeout)
        logging.basicConfig(level=logging.INFO, format=f"[rank {rank}] %(message)s")
        try:
            out = train(rank, world, args, device)
        except PipelineError:  # already logged with its rank, step and action: no traceback per rank
            sys.stderr.flush()
            os._exit(1)  # skip process-group teardown, which may wait on a dead or stopped peer
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, out)
        dist.destroy_process_group()
        if rank != 0:
            exit_rank(0)
        traces = [Trace.from_dict(r["trace"]) for r in gathered]
    if args.trace:
        write_chrome_trace(traces, args.trace)
    if os.environ.get("RANK", "0") == "0":
        print("peak activation bytes per rank:", [t.peak_bytes for t in traces])
        if args.trace:  # as simulate and trace compare say what they wrote
            print(f"wrote {args.trace} (open in https://ui.perfetto.dev; pipeoffload trace compare "
                  f"{shlex.quote(args.trace)} lays it above its simulation)")
    if not args.spawn:
        exit_rank(0)
