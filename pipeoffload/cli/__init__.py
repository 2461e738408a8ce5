"""The ``pipeoffload`` command: thin argparse front-ends over the library.

Each subcommand lives in its own module with ``add_parser(subparsers)``; the parser's ``run``
default is a function ``(args) -> exit code``. Bad input exits 2 with one line, never a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from pipeoffload.cli.common import OneLineParser
from pipeoffload.errors import ConfigError, ScheduleError

COMMAND_MODULES = (
    "schedules", "show", "simulate", "k", "plan", "compare", "trace", "playground", "train", "generate", "export",
    "report",
)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="pipeoffload", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for name in COMMAND_MODULES:
        importlib.import_module(f"pipeoffload.cli.{name}").add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except (ConfigError, ScheduleError) as err:
        first = str(err).splitlines()[0]
        print(f"pipeoffload {args.command}: error: {first}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. piped into `head`
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
