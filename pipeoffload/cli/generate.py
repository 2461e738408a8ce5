"""``pipeoffload generate SRC --prompt TEXT``: continue text from a run's last checkpoint or ``hf:DIR``."""
from __future__ import annotations

import argparse

from pipeoffload.cli.common import positive_int


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("generate", help="continue text from a training run's last checkpoint or hf:DIR")
    parser.add_argument("run_dir", metavar="SRC",
                        help="the --out folder of `pipeoffload train`, or hf:DIR (a local Hugging Face directory)")
    parser.add_argument("--prompt", default="", help="text to continue")
    parser.add_argument("--tokens", type=positive_int, default=100, help="tokens to generate (default 100)")
    parser.add_argument("--temperature", type=float, default=0.8, help="sampling temperature; 0: greedy")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    parser.add_argument("--greedy", action="store_true", help="always take the most likely token (no sampling)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pipeoffload.cli.common import require_extra

    require_extra("torch")
    from pipeoffload.train.generate import generate_text

    print(generate_text(args.run_dir, args.prompt, args.tokens, args.temperature, args.seed, args.greedy))
    return 0
