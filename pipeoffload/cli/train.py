"""``pipeoffload train``: train a GPT, Llama or Hugging Face model (or a planned layout) on text with any schedule.

Flags override ``--config run.toml``; both are derived from the sections of ``pipeoffload.train.config``.
The whole configuration is validated here, before any rank starts; see docs/training.md for every flag.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: argparse._SubParsersAction) -> None:
    from pipeoffload.train.config import add_flags
    from pipeoffload.train.plan import DEFAULT_GPU

    parser = sub.add_parser("train", help="train a GPT, Llama or Hugging Face model on text with any pipeline "
                                          "schedule, offload and layout")
    parser.add_argument("--config", metavar="TOML", help="run.toml (e.g. from `pipeoffload plan --emit`)")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    parser.add_argument("--extend", action="store_true",
                        help="with --resume and a new --steps: accept a new cosine LR schedule over the new steps")
    add_flags(parser)
    plan = parser.add_argument_group("planner")
    plan.add_argument("--plan", choices=["auto"], help="auto: ask the planner for the layout and schedule")
    plan.add_argument("--memory", type=float, metavar="GIB",
                      help="per-GPU memory budget for --plan auto, in GiB (needed with it; default: none)")
    plan.add_argument("--gpu", help=f"GPU preset for --plan auto (default: {DEFAULT_GPU}; `pipeoffload plan --help` "
                                    "lists them)")
    parser.set_defaults(run=run)


def config_from_args(args: argparse.Namespace) -> Any:
    """The validated ``TrainConfig``: defaults < run dir's config (resume) < --config < flags."""
    return resolve(args)[0]


def resolve(args: argparse.Namespace) -> tuple[Any, list[str]]:
    """The validated config and notes on what overrode what (printed as TOML comments)."""
    from pathlib import Path

    from pipeoffload.errors import ConfigError
    from pipeoffload.train.config import (
        build_config,
        flags_given,
        load_saved,
        load_toml,
        no_effect_notes,
        overrides,
        validate,
    )

    saved: dict[str, Any] = {}
    notes: list[str] = []
    if args.plan != "auto":  # the planner's inputs: silently ignoring one would train the defaults
        for flag, value in (("--memory", args.memory), ("--gpu", args.gpu)):
            if value is not None:
                shown = f"{value:g}" if isinstance(value, float) else value
                raise ConfigError(f"{flag} {shown}: only for --plan auto (the planner's budget and GPU); add "
                                  f"--plan auto, or leave {flag} out")
    if args.resume:
        if not Path(args.resume).exists():
            raise ConfigError(f"--resume {args.resume!r}: no such folder; give the run directory of a run (its --out)")
        if not (Path(args.resume) / "config.toml").is_file():
            raise ConfigError(f"--resume {args.resume!r}: no config.toml there; give the run directory of a run")
        saved = load_saved(args.resume, "--resume")
        if saved.get("model") == "own":
            raise ConfigError(f"--resume {args.resume!r}: the run trained your own model (train_model), which the "
                              f"CLI cannot rebuild; continue it with train_model(cfg, ..., resume={args.resume!r})")
    elif args.extend:
        raise ConfigError("--extend: only with --resume RUN_DIR (it accepts a new --steps for a resumed run)")
    from_file = load_toml(args.config) if args.config else {}
    given = flags_given(args)
    if args.resume:
        changes = overrides(saved, {**from_file, **given})
        if changes:
            notes.append(f"overriding {Path(args.resume) / 'config.toml'}: {', '.join(changes)}")
        _check_steps(args, saved, {**from_file, **given})
        _check_out(args.resume, {**from_file, **given}.get("out"))
    if args.config:
        changes = overrides(from_file, given)
        if changes:
            notes.append(f"flags overriding {args.config}: {', '.join(changes)}")
    flags = dict(given)
    if "schedule" in flags:  # a new family brings its own v and g, not the file's
        flags.setdefault("stages_per_rank", 0)
        flags.setdefault("group_size", 0)
    layers = [saved, {"out": args.resume} if args.resume else {}, from_file, flags]
    cfg = build_config(*layers)
    _check_hf_tokenizer(cfg, {**from_file, **given})
    if args.resume:
        _check_resumed_hf_folder(Path(args.resume), cfg.model.source)
    if args.plan == "auto":
        from pipeoffload.train.plan import plan_run

        # the keys given for this invocation (flags, --config) constrain the search; a resumed run's are re-planned
        cfg, chosen = plan_run(cfg, args.memory, args.gpu, explicit=set(from_file) | set(flags))
        notes.append(chosen)
    cfg = validate(cfg, resumed=bool(args.resume))
    notes.extend(no_effect_notes(cfg, set(from_file) | set(given)))
    from pipeoffload.train.job import offload_note

    placed = offload_note(cfg)
    if placed:
        notes.append(placed)
    if args.resume:
        old = build_config(saved).model.dtype
        if cfg.model.dtype != old:
            notes.append(f"dtype {old} -> {cfg.model.dtype} changes the arithmetic from this step on: the losses "
                         f"are no longer bitwise those of an uninterrupted {old} run (the checkpoint's fp32 weights "
                         "and optimizer state load either way)")
        notes.extend(_resume_notes(build_config(saved), cfg))
    return cfg, notes


# hyperparameters a resume may change, and what a change does from the resumed step on
_RESUME_CHANGES = {
    "lr": "the learning rate of every later step (the LR schedule is a function of lr, warmup, min_lr_ratio and "
          "steps)",
    "warmup": "the learning rate of every later step still in or near the warm-up",
    "min_lr_ratio": "the learning rate of every later step (the floor of the cosine)",
    "clip": "which gradients are clipped, and by how much",
    "microbatches": "the order of the gradient sums (float rounding only)",
}


def _resume_notes(old: Any, new: Any) -> list[str]:
    """The dtype-style note for each hyperparameter a resume changes: the losses from the resume on are
    not those of an uninterrupted run (bitwise: only the same values on the same layout)."""
    from pipeoffload.train.config import toml_value

    notes = []
    for flat, what in _RESUME_CHANGES.items():
        before, after = old.get(flat), new.get(flat)
        if before != after:
            result = ("equal an uninterrupted run's only up to float rounding" if flat == "microbatches" else
                      "no longer match an uninterrupted run's")
            notes.append(f"{flat} {toml_value(before)} -> {toml_value(after)} changes {what} from this step on: the losses {result}, "
                         "not bitwise")
    return notes


def _check_out(resume: str, out: Any) -> None:
    """``--resume RUN`` continues RUN in RUN: another ``--out`` would fork it, leaving RUN at its checkpoint."""
    from pathlib import Path

    from pipeoffload.errors import ConfigError

    if out is not None and Path(str(out)).resolve() != Path(resume).resolve():
        raise ConfigError(f"out={str(out)!r}: --resume {resume} continues the run in its own folder; drop --out "
                          f"(to branch the run, copy {resume} to a new folder and --resume that copy)")


def _check_hf_tokenizer(cfg: Any, given: dict[str, Any]) -> None:
    """An ``hf:DIR`` model trains with the folder's tokenizer: an explicit other one is refused, not replaced."""
    from pipeoffload.errors import ConfigError
    from pipeoffload.train.family import kind

    tok = given.get("tokenizer")
    if tok is not None and tok != "hf" and kind(cfg.model.source) == "hf":
        raise ConfigError(f"tokenizer={tok!r}: model={cfg.model.source!r} brings its own tokenizer (tokenizer.json); "
                          "leave --tokenizer out")


def _check_resumed_hf_folder(run: Any, source: str) -> None:
    """A resumed ``hf:DIR`` run keeps the shape of its copy of DIR's config.json (``hf_config.json``), but DIR
    is checked again: one that now holds another model is refused saying so (validate would name a shape key
    as if a flag had set it: "layers=5: ... sets layers=3; leave --layers out")."""
    import json

    from pipeoffload.errors import ConfigError
    from pipeoffload.llama_config import LlamaShape
    from pipeoffload.train.family import HF_CONFIG, SHAPE_KEYS, hf_keys, hf_path

    folder, copy = hf_path(source), run / HF_CONFIG
    if folder is None or not copy.is_file():
        return
    try:
        then, now = (hf_keys(LlamaShape.from_hf(json.loads(p.read_text()), str(p)))
                     for p in (copy, folder / "config.json"))
    except (OSError, ValueError, ConfigError):
        return  # validate names what is wrong with the folder
    changed = [f"{key} {then[key]!r} -> {now[key]!r}" for key in SHAPE_KEYS if then[key] != now[key]]
    if changed:
        raise ConfigError(f"--resume {str(run)!r}: {folder / 'config.json'} no longer describes the model the run "
                          f"started from ({copy}): {', '.join(changed)}; restore that folder (the weights come "
                          "from the checkpoint)")


def _check_steps(args: argparse.Namespace, saved: dict[str, Any], given: dict[str, Any]) -> None:
    """``steps`` also sets the cosine LR schedule: changing it on resume is a new schedule, so only with --extend."""
    from pipeoffload.errors import ConfigError
    from pipeoffload.train.config import build_config

    old, new = build_config(saved).run.steps, build_config(saved, given).run.steps
    if new != old and not args.extend:
        raise ConfigError(f"steps={new}: the run was made with steps={old}, which also sets its cosine LR schedule; "
                          f"a new value is a new LR schedule (the learning rate jumps at the resume): add --extend "
                          f"to accept that, or --stop-at N to stop early on the same schedule")


def run(args: argparse.Namespace) -> int:
    import os
    import signal
    import threading

    from pipeoffload.train.launch import Interrupted, interrupted_text

    def stop(signum: int, frame: Any) -> None:  # before the ranks start (spawn then forwards it to them)
        raise Interrupted(signum, "")

    early = "RANK" not in os.environ and threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, stop) if early else None
    try:
        code = _run(args)
    except Interrupted as err:  # SIGTERM while the input was checked or the run folder prepared
        out = args.resume or getattr(args, "out", None)
        print(f"pipeoffload train: {err or interrupted_text(err.signum, out, started=False)}", file=sys.stderr)
        code = 128 + err.signum
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if "RANK" in os.environ:  # a torchrun rank: its process group is destroyed; skip interpreter teardown
        from pipeoffload.runtime.launch import exit_rank

        exit_rank(code)
    return code


def _run(args: argparse.Namespace) -> int:
    import os

    from pipeoffload.cli.common import require_extra
    from pipeoffload.errors import ConfigError

    require_extra("torch")
    from pipeoffload.train.config import to_toml

    cfg, notes = resolve(args)
    if "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        if not cfg.run.out:
            raise ConfigError("under torchrun give --out (a folder every node shares): ranks must agree on it")
        world = int(os.environ["WORLD_SIZE"])
        if world != cfg.world:
            raise ConfigError(f"torchrun started {world} processes but dp*pp*tp = {cfg.world}; make them equal")
    elif "RANK" not in os.environ and cfg.world > 1 and not cfg.parallel.nproc:
        p = cfg.parallel
        raise ConfigError(f"dp*pp*tp = {p.dp}*{p.pp}*{p.tp} = {cfg.world} ranks: pass --nproc {cfg.world} "
                          "to spawn them here, or start under torchrun")
    from pipeoffload.train.preflight import check_out

    check_out(cfg.run.out, cfg.metrics.tensorboard)  # a bad --out is one line, not the configuration and then the error

    def announce(checked: Any) -> None:  # once the data, memory and checkpoint checks have passed
        if os.environ.get("RANK", "0") == "0":
            print(to_toml(checked, notes), end="", flush=True)  # the header first, then the notes on it

    from pipeoffload.train.job import train
    from pipeoffload.train.launch import Interrupted, RankFailure, interrupted_text

    try:
        result = train(cfg, args.resume, verbose=args.verbose, announce=announce)
    except Interrupted as err:  # SIGINT/SIGTERM before the ranks could report (start-up, a stuck rank)
        message = str(err) or interrupted_text(err.signum, cfg.run.out, started=False)
        print(f"pipeoffload train: {message}", file=sys.stderr)
        return 128 + err.signum
    except RankFailure as err:
        print(f"pipeoffload train: {'error' if err.config else 'failed'}: {err}", file=sys.stderr)
        return 2 if err.config else 1
    if os.environ.get("RANK", "0") != "0":
        return 0
    from pipeoffload.train.report import summary_line

    print(summary_line(result["out"], result["step"], result.get("history", [])))  # a loss's step if earlier
    if result.get("interrupted"):
        print(f"interrupted ({_signal_name(int(result['interrupted']))}): saved checkpoint at step {result['saved_at']}; "
              f"continue with: pipeoffload train --resume {result['out']}")
        return 128 + int(result["interrupted"])
    return 0


def _signal_name(number: int) -> str:
    """``SIGINT`` for 2, as the other commands' "interrupted (SIGTERM)" name theirs."""
    import signal

    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
