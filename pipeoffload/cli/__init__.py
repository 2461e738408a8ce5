"""The ``pipeoffload`` command: thin argparse front-ends over the library.

Each subcommand lives in its own module with ``add_parser(subparsers)``; the parser's ``run``
default is a function ``(args) -> exit code``. Bad input exits 2 with one line, never a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import math
import sys
from collections.abc import Sequence

from pipeoffload.cli.common import OneLineParser, missing_extra
from pipeoffload.errors import ConfigError, ScheduleError

COMMAND_MODULES = (
    "schedules", "show", "simulate", "k", "plan", "estimate", "compare", "trace", "playground", "train", "generate", "export", "report",
)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="pipeoffload", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log progress to stderr; only before the command (pipeoffload -v compare ...): after "
                             "a command, -v is --stages-per-rank")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for name in COMMAND_MODULES:
        importlib.import_module(f"pipeoffload.cli.{name}").add_parser(sub)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pipeoffload")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        refuse_non_finite(args)
        return int(args.run(args) or 0)
    except (ConfigError, ScheduleError) as err:
        return _fail(args, str(err).splitlines()[0], 2)
    except ModuleNotFoundError as err:
        extra = missing_extra(err)
        if extra is None:
            raise
        return _fail(args, extra, 2)
    except BrokenPipeError:  # e.g. piped into `head`
        return 0
    except KeyboardInterrupt:  # Ctrl-C: files are written atomically, so nothing is left half done
        return _fail(args, "interrupted", 130, prefix="")
    except OSError as err:  # the machine refused (a full disk, a lost file system): not the user's input
        return _fail(args, f"{err.strerror or err}{f': {err.filename}' if err.filename else ''}", 1)


def _fail(args: argparse.Namespace, message: str, code: int, prefix: str = "error: ") -> int:
    print(f"pipeoffload {args.command}: {prefix}{message}", file=sys.stderr)
    return code


def refuse_non_finite(args: argparse.Namespace) -> None:
    """No flag may carry inf or nan (``float()`` accepts both): every number after it would be silently
    wrong. Flags with their own checks refuse them already; this covers every other float flag."""
    for dest, value in vars(args).items():
        values = value if isinstance(value, (list, tuple)) else [value]
        for item in values:
            if isinstance(item, float) and not math.isfinite(item):
                raise ConfigError(f"--{dest.replace('_', '-')} {item}: not a finite number")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
