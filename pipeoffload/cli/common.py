"""Flags shared by subcommands that build a schedule: sizes, family options and costs."""
from __future__ import annotations

import argparse
from typing import NoReturn

from pipeoffload.costs import CostModel
from pipeoffload.errors import ConfigError
from pipeoffload.ir import Schedule
from pipeoffload.schedules import generate
from pipeoffload.units import rank_costs


class OneLineParser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line and exit 2 (argparse would print the usage too)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0:  # also rejects nan
        raise argparse.ArgumentTypeError(f"{value} must be >= 0")
    return value


def add_schedule_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="schedule family (see `pipeoffload schedules`)")
    parser.add_argument("--ranks", "-d", type=positive_int, default=4, help="pipeline ranks d (default 4)")
    parser.add_argument("--microbatches", "-m", type=positive_int, default=None,
                        help="microbatches per step m (default 2*ranks)")
    parser.add_argument("--stages-per-rank", "-v", type=positive_int, default=None,
                        help="stages per rank v (default: the family's own default)")


def add_cost_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "costs (per rank and microbatch: all of a rank's layers, split evenly over its stages)")
    group.add_argument("--time-f", type=non_negative_float, default=1.0,
                       help="forward time of one microbatch through a rank's layers (default 1: the time unit t)")
    group.add_argument("--time-i", type=non_negative_float, default=1.0, help="input-gradient backward time (default 1)")
    group.add_argument("--time-w", type=non_negative_float, default=1.0, help="weight-gradient backward time (default 1)")
    group.add_argument("--p2p-time", type=non_negative_float, default=0.0, help="point-to-point transfer time")


def schedule_from_args(args: argparse.Namespace, **options: object) -> Schedule:
    microbatches = args.microbatches if args.microbatches is not None else 2 * args.ranks
    return generate(args.name, args.ranks, microbatches, args.stages_per_rank, **options)


def costs_from_args(args: argparse.Namespace, stages_per_rank: int = 1) -> CostModel:
    """The per-rank times of the flags split evenly over a rank's stages (docs/decisions.md, "Units")."""
    if args.time_f + args.time_i + args.time_w <= 0:
        raise ConfigError("--time-f + --time-i + --time-w is 0: at least one compute time must be positive")
    return rank_costs(args.time_f, args.time_i, args.time_w, stages_per_rank, args.p2p_time)
