"""Every ``--json`` the CLI prints is strict JSON: a parser that refuses NaN and Infinity reads it."""
from __future__ import annotations

import contextlib
import io
import json
import shlex
from pathlib import Path

import pytest

from pipeoffload.cli import main


def _strict(text: str) -> object:
    def refuse(name: str) -> object:
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("command", [
    "simulate 1f1b --json",
    "simulate group-interleaved -d 4 -m 8 -g 2 --offload all --offload-ratio 0.5 --json",
    "simulate zb-v -d 4 -m 8 --offload auto --offload-ratio 2 --recompute first:1 --json",
    "simulate 1f1b --time-f 0 --time-i 1 --time-w 0 --json",  # a zero forward time: ratios stay finite
    "compare '1f1b -d 2' 'zb-v -d 2 --offload all' --json -o {tmp}/c.html",
    "k --model llama3-8b --json",
    "plan --model llama3-8b --gpus 8 --global-batch 64 --json --top 2",
    "plan --model llama3-8b --gpus 8 --global-batch 64 --compare-tp --json",
    "show 1f1b -d 2 -m 2 --format json",
    "estimate --model gpt3-13b --tp 2 --pp 4 --dp 2 --global-batch 64 --schedule interleaved-1f1b "
    "--stages-per-rank 2 --recompute selective --json",
    "estimate --model gpt3-175b --tp 8 --pp 2 --global-batch 16 --json",  # does not fit: still an answer
])
def test_every_json_output_is_strict(tmp_path: Path, command: str) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(shlex.split(command.format(tmp=tmp_path)))
    assert code == 0
    assert _strict(out.getvalue())


@pytest.mark.parametrize("command", [
    "simulate 1f1b --time-f inf --json", "simulate 1f1b --time-f 1e308 --json", "simulate 1f1b --p2p-time nan --json",
    "simulate 1f1b --offload all --offload-ratio inf --json", "simulate 1f1b --offload budget:1e999 --json",
])
def test_what_would_print_nan_or_infinity_is_refused_in_one_line(command: str) -> None:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(shlex.split(command))
        except SystemExit as exit_:
            code = int(exit_.code or 0)
    assert code == 2 and out.getvalue() == "" and len(err.getvalue().splitlines()) == 1
