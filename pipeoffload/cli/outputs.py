"""``--plot/--trace/--report``: the flags and their checks before any work (``simulate`` writes them),
and the file names of ``compare --plots``."""
from __future__ import annotations

import argparse
import shlex
from collections.abc import Sequence
from pathlib import Path

from pipeoffload.errors import ConfigError
from pipeoffload.fileio import TRACE_JSON, check_distinct, check_extension, check_writable


def add_output_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("pictures and traces")
    group.add_argument("--plot", metavar="FILE", help="Gantt chart with copy lanes and memory curves (.png/.svg/.pdf)")
    group.add_argument("--trace", metavar="FILE", help="Chrome/Perfetto trace JSON (open in ui.perfetto.dev)")
    group.add_argument("--report", metavar="FILE", help="self-contained HTML report")


# what each output flag writes, and the extensions that say so (the first is the one suggested)
OUTPUT_FORMATS = {"trace": TRACE_JSON,
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


def file_slug(label: str) -> str:
    """A file name stem from a label: letters, digits, '.', '-' and '_' only, nothing lost but spacing."""
    out = []
    for word in label.replace("·", " ").split():
        out.append("".join(c if c.isalnum() or c in ".-" else "-" for c in word.replace("=", "")))
    return "_".join(w for w in out if w).strip("-_") or "schedule"
