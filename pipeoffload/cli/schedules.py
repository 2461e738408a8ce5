"""``pipeoffload schedules``: the registered families, one line each."""
from __future__ import annotations

import argparse

from pipeoffload.errors import FLAGS, in_words
from pipeoffload.schedules import schedule_specs


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("schedules", help="list schedule families")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    specs = schedule_specs()
    width = max(len(s.name) for s in specs)
    for spec in specs:
        alias = f" (also: {', '.join(spec.aliases)})" if spec.aliases else ""
        print(f"{spec.name.ljust(width)}  {in_words(spec.summary, FLAGS)}{alias}")
    return 0
