"""The ``pipeoffload`` command: thin argparse front-ends over the library.

Each subcommand lives in its own module with ``add_parser(subparsers)``; the parser's ``run``
default is a function ``(args) -> exit code``. Bad input exits 2 with one line, never a traceback.

This module imports only ``sys`` at its top (and ``pipeoffload/__init__`` nothing): ``main`` is running
before the subcommands, the planner and numpy load, so a Ctrl-C during those imports is its one line
"interrupted" and exit 130, not a KeyboardInterrupt traceback.
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence

COMMAND_MODULES = (
    "schedules", "show", "simulate", "k", "plan", "estimate", "compare", "trace", "playground", "train", "generate", "export", "report",
)


def build_parser() -> argparse.ArgumentParser:
    import importlib

    from pipeoffload.cli.common import OneLineParser

    parser = OneLineParser(prog="pipeoffload", description=__doc__.splitlines()[0].replace("``", ""))  # no reST markup in --help
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log progress to stderr; only before the command (pipeoffload -v compare ...): after "
                             "a command, -v is --stages-per-rank")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for name in COMMAND_MODULES:
        importlib.import_module(f"pipeoffload.cli.{name}").add_parser(sub)
    for listed in sub._choices_actions:  # a command's own --help opens with the line the list shows for it
        command = sub.choices[listed.dest]
        if command.description is None:
            command.description = listed.help
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pipeoffload")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


class _Terminated(BaseException):
    """SIGTERM while the subcommands are imported (``_stopped_by_sigterm``)."""


def _raise_terminated(signum: int, _frame: object) -> None:
    raise _Terminated(signum)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C while the subcommands were imported, before a command ran
        print("pipeoffload: interrupted", file=sys.stderr)
        return 130
    except _Terminated:
        print("pipeoffload: interrupted (SIGTERM)", file=sys.stderr)
        return 143


def _main(argv: Sequence[str] | None) -> int:
    import signal
    import threading

    # SIGTERM's default ends the process without a word: while the subcommands load (up to 1.4 s on a
    # loaded machine), it says "interrupted" as a Ctrl-C does; `train` then installs its own handler
    ours = threading.current_thread() is threading.main_thread() and \
        signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    if ours:
        signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        import logging

        from pipeoffload.cli.common import missing_extra
        from pipeoffload.errors import ConfigError, ScheduleError, in_flags

        parser = build_parser()
    finally:
        if ours:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        refuse_non_finite(args)
        return int(args.run(args) or 0)
    except (ConfigError, ScheduleError) as err:
        return _fail(args, in_flags(err).splitlines()[0], 2)  # a message naming what was set names the flags
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
    import math

    from pipeoffload.errors import ConfigError

    for dest, value in vars(args).items():
        values = value if isinstance(value, (list, tuple)) else [value]
        for item in values:
            if isinstance(item, float) and not math.isfinite(item):
                raise ConfigError(f"--{dest.replace('_', '-')} {item}: not a finite number")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
