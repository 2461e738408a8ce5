"""``pipeoffload generate RUN_DIR --prompt TEXT``: sample from a run's last checkpoint in one process."""
from __future__ import annotations

import argparse

from pipeoffload.cli.common import positive_int


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("generate", help="sample text from the last checkpoint of a training run")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the --out folder of `pipeoffload train`")
    parser.add_argument("--prompt", default="", help="text to continue")
    parser.add_argument("--tokens", type=positive_int, default=100, help="tokens to generate (default 100)")
    parser.add_argument("--temperature", type=float, default=0.8, help="sampling temperature; 0: greedy")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pipeoffload.train.generate import generate_text

    print(generate_text(args.run_dir, args.prompt, args.tokens, args.temperature, args.seed))
    return 0
