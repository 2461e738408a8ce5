"""``pipeoffload export RUN_DIR --hf OUT``: a run's last checkpoint as a Hugging Face directory."""
from __future__ import annotations

import argparse

from pipeoffload.cli.common import positive_int


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("export", help="write a Llama-family run's last checkpoint as a Hugging Face directory")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the --out folder of `pipeoffload train`")
    parser.add_argument("--hf", metavar="OUT", required=True,
                        help="new folder for config.json, safetensors shards with their index, tokenizer.json")
    parser.add_argument("--shard-mb", type=positive_int, default=2048, help="largest safetensors shard, MiB")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pipeoffload.train.export import export_run

    out = export_run(args.run_dir, args.hf, max_shard_bytes=args.shard_mb << 20)
    print(f"wrote {out}")
    return 0
