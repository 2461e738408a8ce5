"""``pipeoffload report RUN_DIR``: loss curves and per-rank memory of a training run, as
``report.png`` and a self-contained ``report.html`` in the run directory."""
from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("report", help="draw a training run's loss curves and memory (report.png, report.html)")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the --out folder of `pipeoffload train`")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pipeoffload.train.report import write_report  # imported here: the CLI starts without matplotlib

    png, page = write_report(args.run_dir)
    print(f"wrote {png} and {page}")
    return 0
