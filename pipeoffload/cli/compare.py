"""``pipeoffload compare A B ...``: several schedules or policies on one self-contained HTML page.

Each argument is one ``simulate`` command line without the ``pipeoffload simulate`` prefix, e.g.
``"group-interleaved -d 8 -m 32 -g 4 --offload all"``, parsed with exactly ``simulate``'s flags.
"""
from __future__ import annotations

import argparse
import logging
import shlex
import sys
from pathlib import Path
from typing import NoReturn

from pipeoffload.cli import simulate as simulate_cli
from pipeoffload.cli.outputs import file_slug
from pipeoffload.errors import FLAGS, ConfigError
from pipeoffload.fileio import check_extension, check_writable, write_atomic
from pipeoffload.service import CompareRequest, SimulateRequest, compare, strict_json
from pipeoffload.service.argtypes import OneLineParser
from pipeoffload.service.compare import CompareRow
from pipeoffload.units import TIME_UNIT, counted, rank_units

log = logging.getLogger(__name__)


class _RaisingParser(OneLineParser):
    """Bad flags in one comparison argument (an unknown one, one given twice) become a ConfigError naming
    that argument."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise ConfigError(message or f"{self.prog} exited (status {status})")


def simulate_parser() -> argparse.ArgumentParser:
    """A parser with exactly the flags of ``pipeoffload simulate``, raising ConfigError on bad input."""
    root = _RaisingParser(prog="pipeoffload", add_help=False)
    sub = root.add_subparsers(parser_class=_RaisingParser)
    simulate_cli.add_parser(sub)
    return sub.choices["simulate"]


def parse_spec(spec: str, common: str = "") -> tuple[SimulateRequest, str]:
    """One comparison argument (``common`` flags apply to it, before its own) as a request, and the
    ``pipeoffload simulate`` command that reproduces it."""
    try:
        tokens = shlex.split(spec)
        extra = shlex.split(common)
    except ValueError as err:
        raise ConfigError(f"{spec!r}: {err}") from None
    if not tokens:
        raise ConfigError("an empty comparison argument: give a schedule, e.g. \"1f1b -d 8\"")
    argv = tokens[:1] + extra + tokens[1:]
    try:
        args = simulate_parser().parse_args(argv)
        for flag in ("plot", "trace", "report", "json"):
            if getattr(args, flag, None):
                raise ConfigError(f"--{flag} is not used inside compare; use compare's own -o/--plots/--json")
        request = simulate_cli.request_from_args(args)
    except ConfigError as err:
        raise err.prefixed(repr(spec)) from None
    return request, shlex.join(["pipeoffload", "simulate", *argv])


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("compare", help="several schedules or policies on one HTML page",
                            description=__doc__.splitlines()[0].replace("``", ""))  # no reST markup in --help
    parser.add_argument("specs", nargs="+", metavar="SCHEDULE",
                        help="one `simulate` command line per argument, quoted: \"1f1b -d 8 -m 32\"")
    parser.add_argument("-o", "--output", default=None, metavar="FILE.html",
                        help=f"the HTML page (default {DEFAULT_PAGE}; with --json, no page unless -o is given)")
    parser.add_argument("--with", dest="common", default="", metavar="FLAGS",
                        help="flags for every schedule, e.g. \"-d 8 -m 32 --offload-ratio 0.5\"; give it once, "
                             "with all of them (a second --with is refused)")
    parser.add_argument("--plots", metavar="DIR",
                        help="also write one PNG per schedule here, named by its options (created if missing)")
    parser.add_argument("--json", action="store_true",
                        help="print the rows as one JSON list (and write no page unless -o is given)")
    parser.set_defaults(run=run)


DEFAULT_PAGE = "compare.html"


def run(args: argparse.Namespace) -> int:
    output = args.output if args.output is not None or args.json else DEFAULT_PAGE
    if output is not None:
        check_writable(output, f"-o {shlex.quote(output)}")
        check_extension(output, f"-o {output}", (".html", ".htm"), "an HTML page")
    if args.plots is not None and not args.plots.strip():
        raise ConfigError("--plots '': an empty folder name; give a folder (it is created if missing)")
    if args.plots and Path(args.plots).exists() and not Path(args.plots).is_dir():
        raise ConfigError(f"--plots {args.plots}: is a file, not a folder; give a folder (it is created if missing)")
    parsed = [parse_spec(spec, args.common) for spec in args.specs]
    result = compare(CompareRequest(tuple(req for req, _ in parsed)), names=[repr(spec) for spec in args.specs])
    rows, commands, unit = result.rows, [command for _, command in parsed], result.time_unit
    from pipeoffload.viz.plot import COSTS_FILE_TIME_LABEL, figure_bytes, timeline_figure
    from pipeoffload.viz.report import html_report

    timelines = [r.result.timeline for r in rows]
    top = max(t.peak_rank_units for t in timelines)  # one memory scale, as one time axis, across the rows
    def axis(row: CompareRow) -> str | None:  # a costs file's times are per stage: its chart says so, as simulate's
        return COSTS_FILE_TIME_LABEL if row.result.request.costs_file and unit == TIME_UNIT else None

    pictures = [figure_bytes(timeline_figure(r.result.timeline, r.result.title(), xmax=result.makespan, ymax=top,
                                             time_unit=unit, time_label=axis(r)), dpi=100)
                for r in rows] if output or args.plots else []
    if args.plots:
        try:
            Path(args.plots).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ConfigError(f"--plots {args.plots}: cannot create the folder ({err.strerror})") from None
        for row, png in zip(rows, pictures):
            write_atomic(Path(args.plots) / f"{file_slug(row.label)}.png", png)
    shared = f" (every row: {result.shared})" if result.shared else ""
    if output is not None:
        page = html_report(timelines, title=f"pipeoffload compare: {counted(len(rows), 'schedule')}{shared}",
                           pictures=pictures, labels=[r.label for r in rows], commands=commands, time_unit=unit)
        write_atomic(output, page)
        log.info("wrote %s", output)
    if args.json:
        if output is not None:  # stdout is the JSON; say on stderr what was written
            print(f"wrote {output}", file=sys.stderr)
        print(strict_json(result.as_dict(commands, FLAGS), indent=1))
    else:
        for index, (row, t) in enumerate(zip(rows, timelines), 1):
            note = row.result.budget_note()  # a budget the plan could not meet, named on its row
            print(f"{index}. {row.label}: makespan {t.makespan:.4g} {unit}, bubble {t.bubble_ratio:.1%}, "
                  f"device peak {rank_units(t.peak_rank_units, 3)}" + (f"; {note}" if note else ""))
        if result.shared:
            print(f"every row: {result.shared}")
        print(f"wrote {output}")
    return 0
