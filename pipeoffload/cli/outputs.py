"""``--plot/--trace/--report`` for commands that simulate: pictures and traces written atomically."""
from __future__ import annotations

import argparse
import logging
import shlex
from collections.abc import Sequence
from pathlib import Path

from pipeoffload.errors import ConfigError
from pipeoffload.fileio import check_distinct, check_extension, check_writable, write_atomic
from pipeoffload.simulator import Timeline
from pipeoffload.units import TIME_UNIT

log = logging.getLogger(__name__)


def add_output_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("pictures and traces")
    group.add_argument("--plot", metavar="FILE", help="Gantt chart with copy lanes and memory curves (.png/.svg/.pdf)")
    group.add_argument("--trace", metavar="FILE", help="Chrome/Perfetto trace JSON (open in ui.perfetto.dev)")
    group.add_argument("--report", metavar="FILE", help="self-contained HTML report")


# what each output flag writes, and the extensions that say so (the first is the one suggested)
OUTPUT_FORMATS = {"trace": ((".json",), "a Chrome/Perfetto trace (JSON)"),
                  "report": ((".html", ".htm"), "an HTML report")}


def check_outputs(args: argparse.Namespace, flags: Sequence[str]) -> None:
    """Refuse every unwritable destination among ``flags`` (e.g. ``plot``, ``output``) before any work: an
    empty name, a name whose extension contradicts what is written there, two flags on one file."""
    given = [(flag, path) for flag in flags if (path := getattr(args, flag, None)) is not None]
    for flag, path in given:
        check_writable(path, f"--{flag} {shlex.quote(path)}")
    check_distinct([(f"--{flag}", path) for flag, path in given])
    for flag, path in given:
        if flag in OUTPUT_FORMATS:
            check_extension(path, f"--{flag} {path}", *OUTPUT_FORMATS[flag])


def check_output_args(args: argparse.Namespace) -> str:
    """Check ``--plot/--trace/--report`` before any work, so a bad one leaves nothing half done; return the
    picture format."""
    check_outputs(args, ("plot", "trace", "report"))
    fmt = Path(args.plot).suffix.lstrip(".").lower() if args.plot else ""
    if args.plot and fmt not in ("png", "svg", "pdf"):
        raise ConfigError(f"--plot {args.plot}: unknown picture format {fmt!r}; use .png, .svg or .pdf")
    return fmt


def write_outputs(args: argparse.Namespace, timelines: Sequence[Timeline], time_unit: str = TIME_UNIT,
                  commands: Sequence[str] | None = None, title: str | None = None,
                  time_help: str | None = None) -> None:
    """``--plot/--trace/--report`` of ``timelines``, their times labelled ``time_unit`` (``t`` or ``s``;
    ``time_help``, if given, says what one unit is in the trace);
    the report shows ``commands`` (the command line of each timeline) beside its row; ``title`` heads the
    picture (default: the schedule and sizes)."""
    fmt = check_output_args(args)
    if args.plot:
        from pipeoffload.viz.plot import figure_bytes, timeline_figure

        write_atomic(args.plot, figure_bytes(timeline_figure(timelines[0], title, time_unit=time_unit), fmt))
        log.info("wrote %s", args.plot)
    if args.trace:
        from pipeoffload.viz.chrome_trace import timeline_trace_json

        write_atomic(args.trace, timeline_trace_json(timelines[0], time_unit, time_help))
        log.info("wrote %s", args.trace)
    if args.report:
        from pipeoffload.viz.report import html_report

        write_atomic(args.report, html_report(timelines, time_unit=time_unit, commands=commands))
        log.info("wrote %s", args.report)


def file_slug(label: str) -> str:
    """A file name stem from a label: letters, digits, '.', '-' and '_' only, nothing lost but spacing."""
    out = []
    for word in label.replace("·", " ").split():
        out.append("".join(c if c.isalnum() or c in ".-" else "-" for c in word.replace("=", "")))
    return "_".join(w for w in out if w).strip("-_") or "schedule"
