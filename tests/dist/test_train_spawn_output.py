"""What a spawned run leaves on the terminal and in train.log: what the launcher is doing while the
BPE trains and the ranks start, no leaked-semaphore warning at the end, one line per step in
train.log, each rank's pid logged at start-up."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist


def test_a_spawned_run_ends_cleanly_and_logs_one_line_per_step(tmp_path: Path) -> None:
    run, data = tmp_path / "run", tmp_path / "text.txt"
    data.write_text("the quick brown fox jumps over the lazy dog; " * 400)
    done = subprocess.run([sys.executable, "-m", "pipeoffload", "train", "--layers", "2", "--hidden", "32",
                           "--seq-len", "32", "--global-batch", "8", "--microbatches", "2", "--steps", "3",
                           "--nproc", "2", "--pp", "2", "--out", str(run), "--data", str(data),
                           "--tokenizer", "bpe:300"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "leaked semaphore" not in done.stderr and "Warning" not in done.stderr, done.stderr[-2000:]
    said = [line for line in done.stderr.splitlines() if line.startswith("pipeoffload train: ")]
    assert "training a byte-level BPE with 300 tokens" in said[0] and "starting 2 ranks" in said[-1], done.stderr
    assert sum("starting 2 ranks" in line for line in done.stderr.splitlines()) == 1, done.stderr  # not echoed by the root logger
    log = (run / "train.log").read_text()
    assert [int(s) for s in re.findall(r"\] INFO \S+: step (\d+) loss", log)] == [1, 2, 3], log
    assert sorted(int(r) for r in re.findall(r"rank (\d+) of 2: pid \d+", log)) == [0, 1], log
