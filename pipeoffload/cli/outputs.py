"""``--plot/--trace/--report`` for commands that simulate: pictures and traces written atomically."""
from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path

from pipeoffload.errors import ConfigError
from pipeoffload.fileio import write_atomic
from pipeoffload.simulator import Timeline
from pipeoffload.units import TIME_UNIT

log = logging.getLogger(__name__)


def add_output_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("pictures and traces")
    group.add_argument("--plot", metavar="FILE", help="Gantt chart with copy lanes and memory curves (.png/.svg/.pdf)")
    group.add_argument("--trace", metavar="FILE", help="Chrome/Perfetto trace JSON (open in ui.perfetto.dev)")
    group.add_argument("--report", metavar="FILE", help="self-contained HTML report")


def write_outputs(args: argparse.Namespace, timelines: Sequence[Timeline], time_unit: str = TIME_UNIT) -> None:
    """``--plot/--trace/--report`` of ``timelines``, their times labelled ``time_unit`` (``t`` or ``s``)."""
    # Check every destination before writing any, so a bad one leaves nothing half done.
    for flag in ("plot", "trace", "report"):
        path = getattr(args, flag, None)
        if path and not Path(path).parent.resolve().is_dir():
            raise ConfigError(f"--{flag} {path}: folder {Path(path).parent} does not exist; create it first")
    fmt = Path(args.plot).suffix.lstrip(".").lower() if args.plot else ""
    if args.plot and fmt not in ("png", "svg", "pdf"):
        raise ConfigError(f"--plot {args.plot}: unknown picture format {fmt!r}; use .png, .svg or .pdf")
    if args.plot:
        from pipeoffload.viz.plot import figure_bytes, timeline_figure

        write_atomic(args.plot, figure_bytes(timeline_figure(timelines[0], time_unit=time_unit), fmt))
        log.info("wrote %s", args.plot)
    if args.trace:
        from pipeoffload.viz.chrome_trace import timeline_trace_json

        write_atomic(args.trace, timeline_trace_json(timelines[0], time_unit))
        log.info("wrote %s", args.trace)
    if args.report:
        from pipeoffload.viz.report import html_report

        write_atomic(args.report, html_report(timelines, time_unit=time_unit))
        log.info("wrote %s", args.report)


def file_slug(label: str) -> str:
    """A file name stem from a label: letters, digits, '.', '-' and '_' only, nothing lost but spacing."""
    out = []
    for word in label.replace("·", " ").split():
        out.append("".join(c if c.isalnum() or c in ".-" else "-" for c in word.replace("=", "")))
    return "_".join(w for w in out if w).strip("-_") or "schedule"
