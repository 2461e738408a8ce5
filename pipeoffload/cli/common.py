"""Flags shared by subcommands that build a schedule: sizes, family options and costs."""
from __future__ import annotations

import argparse
import importlib.util
import logging
import math
import sys
from typing import Any

from pipeoffload.errors import EXTRAS, ConfigError, extra_line, missing_extra, renaming
from pipeoffload.ir import Schedule
from pipeoffload.planner.cli_args import SHAPE_HELP, hardware_from_args, model_from_args
from pipeoffload.planner.hardware import HardwareSpec
from pipeoffload.planner.model import ModelSpec
from pipeoffload.planner.stagecosts import HOST_LINK_MODES
from pipeoffload.policies import NUMBER_TEXT
from pipeoffload.schedules import MAX_ACTIONS, check_options, estimated_work, generate, get_spec
from pipeoffload.service.argtypes import OneLineParser, default_of, non_negative_float, positive_int
from pipeoffload.service.checks import checked, int_at_least, plain_hint
from pipeoffload.service.simulate import BACKWARDS, FAMILY_OPTIONS, SCHEDULE_NAMES

__all__ = ["EXTRAS", "OneLineParser", "add_cost_args", "add_family_options", "add_max_stall", "add_planner_link_args", "add_schedule_args", "model_and_hardware",
           "non_negative_float", "missing_extra", "positive_int", "require_extra", "schedule_from_args",
           "show_progress"]


def model_and_hardware(args: argparse.Namespace) -> tuple[ModelSpec, HardwareSpec]:
    """The model and GPU of ``planner.cli_args``'s flags, with every shape flag checked like any other
    whole-number flag first and a bad ``--hw`` value named in one line."""
    for name in SHAPE_HELP:
        value = getattr(args, name, None)
        if value is not None:
            checked(f"--{name.replace('_', '-')}", int_at_least, value)
    hardware = checked_hardware(args)
    return model_from_args(args), hardware


def checked_hardware(args: argparse.Namespace) -> HardwareSpec:
    """The GPU of ``planner.cli_args``'s hardware flags; a non-finite or malformed ``--hw`` value is one line."""
    for item in getattr(args, "hw", None) or ():
        _, _, text = item.partition("=")
        try:
            number = float(text)
        except ValueError:
            continue  # a name or a flag value: the hardware spec checks it
        if not NUMBER_TEXT.fullmatch(text):  # float() reads 1_0 as 10 and Arabic-Indic digits: a typo, refused
            raise ConfigError(f"--hw {item}: {text!r} is not a number{plain_hint(text, float)}")
        if not math.isfinite(number):
            raise ConfigError(f"--hw {item}: not a finite number")
    try:
        return hardware_from_args(args)
    except ConfigError:
        raise
    except (ValueError, TypeError) as err:  # e.g. --hw memory_gib=abc: a number that is not one
        raise ConfigError(f"--hw {' --hw '.join(args.hw)}: {err}") from None


def show_progress() -> None:
    """Send the planner's periodic progress lines (logger ``pipeoffload.planner.progress``: ``plan``'s
    search, ``estimate``'s simulation; each logs one after a few seconds) to stderr."""
    logger = logging.getLogger("pipeoffload.planner.progress")
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    if not logging.getLogger().handlers and not logger.handlers:
        logger.addHandler(logging.StreamHandler(sys.stderr))


def _simulate_default(name: str) -> Any:
    """``SimulateRequest``'s default of ``name``, which ``simulate``, ``compare`` and ``show`` flags take."""
    from pipeoffload.service.simulate import SimulateRequest

    return default_of(SimulateRequest, name)


def add_schedule_args(parser: argparse.ArgumentParser, files: bool = False) -> None:
    """NAME and the sizes; ``files``: NAME may also be a schedule file (``simulate``)."""
    parser.add_argument("name", help="schedule family (see `pipeoffload schedules`)" + (
        ", or a schedule file written as data (.json, .txt or .csv, the forms `pipeoffload show --format` "
        "writes; a .csv may also be torch.distributed.pipelining's), which sets the ranks, microbatches and "
        "stages per rank" if files else ""))
    parser.add_argument("--ranks", "-d", type=positive_int, default=_simulate_default("ranks"),
                        help="pipeline ranks d (default %(default)s)")
    parser.add_argument("--microbatches", "-m", type=positive_int, default=None,
                        help="microbatches per step m (default 2*ranks)")
    parser.add_argument("--stages-per-rank", "-v", type=positive_int, default=None,
                        help="stages per rank v (default: the family's own default); after the command -v is "
                             "this, not --verbose (pipeoffload -v COMMAND)")


def add_family_options(group: argparse._ArgumentGroup | argparse.ArgumentParser) -> None:
    """group-interleaved's options (``simulate``, ``show``): None where not given, so other families pass."""
    group.add_argument("--group-size", "-g", type=positive_int, default=None,
                       help="group-interleaved: microbatches per group, 1..ranks (default ceil(ranks/2))")
    group.add_argument("--backward", choices=BACKWARDS, default=None,
                       help="group-interleaved: emit I and W (split, default) or one B (full)")


def add_cost_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "costs (per rank and microbatch: all of a rank's layers, split evenly over its stages)")
    # simulate sets these flags' parser defaults to None (given or not): the help shows the request's own
    f, i, w, p2p = (_simulate_default(name) for name in ("time_f", "time_i", "time_w", "p2p_time"))
    group.add_argument("--time-f", type=non_negative_float, default=f,
                       help=f"forward time of one microbatch through a rank's layers (default {f:g}: the time unit t)")
    group.add_argument("--time-i", type=non_negative_float, default=i,
                       help=f"input-gradient backward time, in t (default {i:g})")
    group.add_argument("--time-w", type=non_negative_float, default=w,
                       help=f"weight-gradient backward time, in t (default {w:g})")
    group.add_argument("--p2p-time", type=non_negative_float, default=p2p,
                       help=f"point-to-point transfer time, in t (default {p2p:g}: free)")


def add_max_stall(group: argparse._ArgumentGroup | argparse.ArgumentParser) -> None:
    """``--max-stall``, as ``simulate`` and ``plan`` both take it (one type, one message, one help)."""
    group.add_argument("--max-stall", type=non_negative_float, default=0.0, metavar="PCT",
                       help="let an offload plan make its step up to PCT %% longer than without copies, for a "
                            "lower peak: plans made for faster copies are tried and run at the real ones "
                            "(default 0: copies never make compute wait)")


def add_planner_link_args(group: argparse._ArgumentGroup | argparse.ArgumentParser) -> None:
    """``--partial-recompute`` and ``--shared-host-link``, as ``plan`` and ``estimate`` both take them."""
    group.add_argument("--partial-recompute", action=argparse.BooleanOptionalAction, default=None,
                       help="LGD partial recomputation (LayerNorm/activation/dropout: ~20 instead of 34 sbh saved) "
                            "on every plan / on none (default: on plans that offload, as the reference does)")
    group.add_argument("--shared-host-link", nargs="?", const="alternating", default="private",
                       choices=HOST_LINK_MODES, metavar="MODE",
                       help="model two GPUs sharing one PCIe switch: alternating (the reference's slots; "
                            "the MODE when the flag is given alone) or serialized; private: every GPU has its own "
                            "link (the default without the flag)")


def schedule_from_args(args: argparse.Namespace, **options: object) -> Schedule:
    """The schedule of ``add_schedule_args``' flags; one too big to generate in a moment is refused in the
    flags' words (``generate``'s own refusal names ``max_actions``, which the command line cannot set)."""
    microbatches = args.microbatches if args.microbatches is not None else 2 * args.ranks
    spec = get_spec(args.name)
    v = args.stages_per_rank if args.stages_per_rank is not None else spec.default_stages_per_rank()
    work = estimated_work(spec, args.ranks, microbatches, v)
    if work > MAX_ACTIONS:
        raise ConfigError(f"{spec.name} -d {args.ranks} -m {microbatches} -v {v}: about {work:,} actions of work, "
                          f"above the limit of {MAX_ACTIONS:,}; use fewer ranks (-d) or microbatches (-m)")
    with renaming(SCHEDULE_NAMES):  # show's flags are simulate's
        check_options(spec, options, settable=FAMILY_OPTIONS)
        return generate(args.name, args.ranks, microbatches, args.stages_per_rank, **options)


def require_run_dir(run_dir: str, checkpoint: bool = False) -> None:
    """A run directory has its config.toml (and, with ``checkpoint``, a saved checkpoint): checked before
    torch is imported (seconds), so a typo in RUN_DIR answers at once, naming RUN_DIR (the loader's own
    words name ``train --resume``, a flag export and generate do not have)."""
    from pipeoffload.train.config import check_run_dir

    run = check_run_dir(run_dir)
    if not checkpoint:
        return
    from pipeoffload.train.checkpoint import list_checkpoints  # torch-free: the loader's own rule (step-N)

    folder = run / "checkpoints"
    if not list_checkpoints(run):
        raise ConfigError(f"RUN_DIR {str(run)!r}: no checkpoint under {folder}; the run saved none (train it with "
                          "--save-every N)")


def require_extra(package: str) -> None:
    """Refuse, before anything is written, a command whose extra is not installed (``ConfigError``)."""
    if importlib.util.find_spec(package) is None:
        raise ConfigError(extra_line(package))
