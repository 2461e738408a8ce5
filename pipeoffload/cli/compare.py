"""``pipeoffload compare A B ...``: several schedules or policies on one self-contained HTML page.

Each argument is one ``simulate`` command line without the ``pipeoffload simulate`` prefix, e.g.
``"group-interleaved -d 8 -m 32 -g 4 --offload all"``, parsed with exactly ``simulate``'s flags.
"""
from __future__ import annotations

import argparse
import json
import logging
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from pipeoffload.cli import simulate as simulate_cli
from pipeoffload.cli.outputs import file_slug, option_label
from pipeoffload.errors import ConfigError
from pipeoffload.fileio import write_atomic
from pipeoffload.simulator import Timeline

log = logging.getLogger(__name__)


class _RaisingParser(argparse.ArgumentParser):
    """Bad flags in one comparison argument become a ConfigError naming that argument."""

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


@dataclass(frozen=True)
class Row:
    label: str  # schedule, sizes and every non-default option
    command: str  # the exact command that reproduces the row
    timeline: Timeline
    result: dict  # simulate --json's object


def run_spec(spec: str, common: str = "") -> Row:
    """Simulate one comparison argument (``common`` flags apply to every argument, before its own)."""
    try:
        tokens = shlex.split(spec)
        extra = shlex.split(common)
    except ValueError as err:
        raise ConfigError(f"{spec!r}: {err}") from None
    if not tokens:
        raise ConfigError("an empty comparison argument: give a schedule, e.g. \"1f1b -d 8\"")
    argv = tokens[:1] + extra + tokens[1:]
    parser = simulate_parser()
    try:
        args = parser.parse_args(argv)
        for flag in ("plot", "trace", "report", "json"):
            if getattr(args, flag, None):
                raise ConfigError(f"--{flag} is not used inside compare; use compare's own -o/--plots/--json")
        timeline, report, unit = simulate_cli.simulate_with_unit(args)
    except ConfigError as err:
        raise ConfigError(f"{spec!r}: {str(err).splitlines()[0]}") from None
    return Row(option_label(parser, args, timeline), shlex.join(["pipeoffload", "simulate", *argv]), timeline,
               simulate_cli.result_dict(timeline, report, unit))


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("compare", help="several schedules or policies on one HTML page",
                            description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="+", metavar="SCHEDULE",
                        help="one `simulate` command line per argument, quoted: \"1f1b -d 8 -m 32\"")
    parser.add_argument("-o", "--output", default="compare.html", metavar="FILE",
                        help="the HTML page (default compare.html)")
    parser.add_argument("--with", dest="common", default="", metavar="FLAGS",
                        help="flags for every schedule, e.g. \"-d 8 -m 32 --offload-ratio 0.5\"")
    parser.add_argument("--plots", metavar="DIR", help="also write one PNG per schedule here, named by its options")
    parser.add_argument("--json", action="store_true", help="print the rows as one JSON list")
    parser.set_defaults(run=run)


def compare_rows(specs: list[str], common: str = "") -> list[Row]:
    rows = [run_spec(spec, common) for spec in specs]
    seen: dict[str, int] = {}
    out = []
    for row in rows:  # the same command twice gets a visible repeat number, not two identical labels
        seen[row.label] = seen.get(row.label, 0) + 1
        label = row.label if seen[row.label] == 1 else f"{row.label} (repeat {seen[row.label]})"
        out.append(Row(label, row.command, row.timeline, row.result))
    return out


def time_unit(rows: list[Row]) -> str:
    """The rows' one time unit (``t``, or ``s`` from measured cost files); they share one time axis."""
    units = sorted({r.result["units"]["time_unit"] for r in rows})
    if len(units) > 1:
        raise ConfigError(f"the schedules mix time units ({' and '.join(units)}): their charts share one time axis; "
                          "give every schedule cost files in the same unit (or none)")
    return units[0]


def run(args: argparse.Namespace) -> int:
    for path, what in ((Path(args.output).parent, "-o"), (Path(args.plots) if args.plots else None, "--plots")):
        if path is not None and not path.resolve().is_dir():
            raise ConfigError(f"{what}: folder {path} does not exist; create it first")
    rows = compare_rows(args.specs, args.common)
    unit = time_unit(rows)
    from pipeoffload.viz.plot import figure_bytes, timeline_figure
    from pipeoffload.viz.report import html_report

    xmax = max(r.timeline.makespan for r in rows)
    pictures = [figure_bytes(timeline_figure(r.timeline, xmax=xmax, time_unit=unit), dpi=100) for r in rows]
    if args.plots:
        for row, png in zip(rows, pictures):
            write_atomic(Path(args.plots) / f"{file_slug(row.label)}.png", png)
    page = html_report([r.timeline for r in rows], title=f"pipeoffload compare: {len(rows)} schedules",
                       pictures=pictures, labels=[r.label for r in rows], commands=[r.command for r in rows], time_unit=unit)
    write_atomic(args.output, page)
    log.info("wrote %s", args.output)
    if args.json:
        print(json.dumps([{"label": r.label, "command": r.command} | r.result for r in rows], indent=1))
    else:
        for index, row in enumerate(rows, 1):
            t = row.timeline
            print(f"{index}. {row.label}: makespan {t.makespan:.4g} {unit}, bubble {t.bubble_ratio:.1%}, "
                  f"device peak {t.peak_rank_units:.3g} rank units")
        print(f"wrote {args.output}")
    return 0
