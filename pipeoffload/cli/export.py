"""``pipeoffload export RUN_DIR --hf OUT``: a Llama-family run's last checkpoint as a Hugging Face directory."""
from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("export", help="write a run's last checkpoint as a Hugging Face directory")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the --out folder of a `pipeoffload train` run (llama or "
                                                           "hf:DIR)")
    parser.add_argument("--hf", metavar="OUT", required=True,
                        help="new folder to write (config.json, sharded fp32 safetensors with their index, "
                             "tokenizer.json; from an hf:DIR run also DIR's generation_config.json, chat template "
                             "and tokenizer_config.json/special_tokens_map.json where it has them)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pipeoffload.cli.common import require_extra, require_run_dir
    from pipeoffload.fileio import check_new_folder

    check_new_folder(args.hf, f"--hf {args.hf!r}")  # before the run is loaded (seconds), as save_hf would
    require_run_dir(args.run_dir, checkpoint=True)
    require_extra("torch")
    from pipeoffload.train.export import export_hf

    print(f"wrote {export_hf(args.run_dir, args.hf)}")
    return 0
