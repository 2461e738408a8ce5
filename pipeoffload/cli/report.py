"""``pipeoffload report RUN_DIR``: loss curves and per-rank memory of a training run, as
``report.png`` and a self-contained ``report.html`` in the run directory."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from pipeoffload.errors import ConfigError


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("report", help="draw a training run's loss curves and memory (report.png, report.html)")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the --out folder of `pipeoffload train`")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pipeoffload.train.report import write_report  # imported here: the CLI starts without matplotlib

    check_outputs(Path(args.run_dir))

    png, page = write_report(args.run_dir)
    print(f"wrote {png} and {page}")
    return 0


OUTPUTS = ("report.png", "report.html")


def check_outputs(folder: Path) -> None:
    """RUN_DIR is a folder and both outputs can be written there, checked before either is: a failure
    leaves no new report.png beside a stale report.html. ``report`` has no output option, so the fix
    named is the one in RUN_DIR."""
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"RUN_DIR {str(folder)!r} is a file, not a folder; give the --out folder of a training run")
    if not folder.is_dir():
        raise ConfigError(f"RUN_DIR {str(folder)!r} does not exist; give the --out folder of a training run")
    for name in OUTPUTS:
        path = folder / name
        if path.is_dir():
            raise ConfigError(f"{path}: is a folder, where report writes its {name}; move or remove that folder")
    if not os.access(folder, os.W_OK | os.X_OK):  # each output is a new file renamed into place
        raise ConfigError(f"RUN_DIR {str(folder)!r} is not writable, and report writes {' and '.join(OUTPUTS)} "
                          "there; make it writable")
