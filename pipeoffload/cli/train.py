"""``pipeoffload train``: train the reference GPT (or a planned layout) on text with any schedule.

Flags override ``--config run.toml`` (keys = flags with ``-`` as ``_``). The whole configuration is
validated here, before any rank starts; see docs/training.md for every flag.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

FLAGS: list[tuple[str, Any, str]] = [
    # (flag, type, help)
    ("--schedule", str, "schedule family (see `pipeoffload schedules`; default 1f1b)"),
    ("--stages-per-rank", int, "stages per pipeline rank v (default: the family's own)"),
    ("--group-size", int, "group size g of group-interleaved (default: the family's)"),
    ("--offload", str, "offload policy: none | all | first:K | auto | budget:X (default none)"),
    ("--recompute", str, "recompute policy: none | all | first:K | auto [,lgd] (default none)"),
    ("--offload-ratio", float, "k for the offload placement cost model (default: the default cost model)"),
    ("--pp", int, "pipeline-parallel size (default 1)"),
    ("--dp", int, "data-parallel size (default 1)"),
    ("--tp", int, "tensor-parallel size (default 1)"),
    ("--zero", int, "1: shard the optimizer state over the dp group (ZeroRedundancyOptimizer)"),
    ("--microbatches", int, "microbatches per step per replica (default 4)"),
    ("--global-batch", int, "sequences per optimizer step over all dp replicas (default 8)"),
    ("--steps", int, "optimizer steps; also the length of the cosine LR schedule (default 100)"),
    ("--stop-at", int, "save and stop after this step (resume later); 0: run all steps"),
    ("--seed", int, "seeds weights, data order and every random-number generator (default 0)"),
    ("--layers", int, "GPT blocks (default 4)"),
    ("--hidden", int, "GPT hidden size (default 64)"),
    ("--heads", int, "attention heads (default 4)"),
    ("--seq-len", int, "tokens per sequence (default 64)"),
    ("--data", str, "text file, folder of text files, or .npy/.bin tokens (default: stdlib sources)"),
    ("--tokenizer", str, "byte | bpe:N (BPE trained offline on the data, saved in the run; default byte)"),
    ("--nproc", int, "spawn this many local ranks (default: torchrun's env, else one process)"),
    ("--out", str, "run directory (default runs/<timestamp>)"),
    ("--timeout", float, "seconds bounding every wait between ranks (default 120)"),
    ("--eval-every", int, "validation loss every N steps (default 50)"),
    ("--eval-batches", int, "held-out batches per validation (default 2)"),
    ("--save-every", int, "checkpoint every N steps and at the end (default 100)"),
    ("--keep", int, "checkpoints kept (default 2)"),
    ("--lr", float, "peak learning rate of AdamW (default 3e-4)"),
    ("--warmup", int, "linear warm-up steps before the cosine decay (default 20)"),
    ("--clip", float, "gradient clipping by the global norm (default 1.0; 0: off)"),
]


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("train", help="train a GPT on text with any pipeline schedule, offload and layout")
    parser.add_argument("--config", metavar="TOML", help="run.toml (e.g. from `pipeoffload plan --emit`)")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    for flag, kind, text in FLAGS:
        metavar = {int: "N", float: "X"}.get(kind, "TEXT")
        parser.add_argument(flag, type=kind, default=None, metavar=metavar, help=text)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    plan = parser.add_argument_group("planner")
    plan.add_argument("--plan", choices=["auto"], help="auto: ask the planner for the layout and schedule")
    plan.add_argument("--memory", type=float, metavar="GIB", help="per-GPU memory budget for --plan auto")
    plan.add_argument("--gpu", help="GPU preset for --plan auto (default: a100-80g)")
    parser.set_defaults(run=run)


def config_from_args(args: argparse.Namespace) -> Any:
    """The validated ``TrainConfig``: defaults < run dir's config (resume) < --config < flags."""
    from pathlib import Path

    from pipeoffload.errors import ConfigError
    from pipeoffload.train.config import build_config, load_toml, validate

    layers: list[dict[str, Any]] = []
    if args.resume:
        saved = Path(args.resume) / "config.toml"
        if not saved.is_file():
            raise ConfigError(f"--resume {args.resume!r}: no config.toml there; give the run directory of a run")
        layers.append(load_toml(saved))
        layers.append({"out": args.resume})
    if args.config:
        layers.append(load_toml(args.config))
    flags = {flag[2:].replace("-", "_"): getattr(args, flag[2:].replace("-", "_")) for flag, _, _ in FLAGS}
    if args.no_progress:
        flags["progress"] = False
    if flags["schedule"] is not None and flags["stages_per_rank"] is None:
        flags["stages_per_rank"] = 0  # a new family brings its own default v, not the file's
    if flags["schedule"] is not None and flags["group_size"] is None:
        flags["group_size"] = 0
    layers.append(flags)
    cfg = build_config(*layers)
    if args.plan == "auto":
        from pipeoffload.train.plan import planned_config

        cfg = planned_config(cfg, args.memory, args.gpu, explicit={k for k, v in flags.items() if v is not None})
    return validate(cfg)


def run(args: argparse.Namespace) -> int:
    import os

    from pipeoffload.errors import ConfigError
    from pipeoffload.train.config import to_toml

    cfg = config_from_args(args)
    if "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        if not cfg.out:
            raise ConfigError("under torchrun give --out (a folder every node shares): ranks must agree on it")
        world = int(os.environ["WORLD_SIZE"])
        if world != cfg.world:
            raise ConfigError(f"torchrun started {world} processes but dp*pp*tp = {cfg.world}; make them equal")
    elif "RANK" not in os.environ and cfg.world > 1 and not cfg.nproc:
        raise ConfigError(f"dp*pp*tp = {cfg.dp}*{cfg.pp}*{cfg.tp} = {cfg.world} ranks: pass --nproc {cfg.world} "
                          "to spawn them here, or start under torchrun")
    if os.environ.get("RANK", "0") == "0":
        print(to_toml(cfg), end="", flush=True)
    from pipeoffload.train.job import train
    from pipeoffload.train.launch import Interrupted, RankFailure

    try:
        result = train(cfg, args.resume, verbose=args.verbose)
    except Interrupted as err:  # SIGINT/SIGTERM before the ranks could save (start-up, a stuck rank)
        print(f"pipeoffload train: {err}", file=sys.stderr)
        return 128 + err.signum
    except RankFailure as err:
        print(f"pipeoffload train: {'error' if err.config else 'failed'}: {err}", file=sys.stderr)
        return 2 if err.config else 1
    if os.environ.get("RANK", "0") != "0":
        return 0
    history = result.get("history", [])
    last = history[-1] if history else {}
    vals = [h["val_loss"] for h in history if h.get("val_loss") is not None]
    summary = f"run {result['out']}: step {result['step']}"
    if last:
        summary += f", loss {last['loss']:.4f}"
    if vals:
        summary += f", val loss {vals[-1]:.4f}"
    print(summary)
    if result.get("interrupted"):
        print(f"interrupted by signal {result['interrupted']}: saved checkpoint at step {result['saved_at']}; "
              f"continue with: pipeoffload train --resume {result['out']}")
        return 128 + int(result["interrupted"])
    return 0
