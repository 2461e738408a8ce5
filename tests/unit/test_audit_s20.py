"""A demanding user's audit of one run's whole life (twentieth session): each test failed before its fix."""
from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import refused


@contextmanager
def fifo(path: Path) -> Iterator[Path]:
    """A FIFO at ``path``. Before the fix its read waited for a writer forever; this test's own writer
    opens and closes it, so that such a read ends (with no text) and the test fails instead of hanging."""
    os.mkfifo(path)

    def writer() -> None:
        with open(path, "wb"):
            pass

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        while thread.is_alive():  # no reader came (the fixed code never reads it): be the reader it waits for
            os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
            thread.join(0.05)


NOT_REGULAR = "not a regular file"
PLAN = "plan --model gpt3-13b --gpus 8 --global-batch 8 --memory 40"


@pytest.mark.parametrize(("name", "command", "pieces"), [
    ("mine.json", "simulate {f}", ("schedule file", NOT_REGULAR)),
    ("mine.csv", "compare '1f1b' '{f}'", ("schedule file", NOT_REGULAR)),
    ("costs.json", "simulate 1f1b --costs {f}", (NOT_REGULAR,)),
    ("run.json", "trace compare {f}", ("RUN_TRACE", NOT_REGULAR)),
    ("layers.json", PLAN + " --profile {f}", ("layer-cost file", NOT_REGULAR)),
    ("gpu.toml", PLAN + " --hardware-file {f}", ("hardware file", NOT_REGULAR)),
])
def test_an_input_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path, name: str, command: str,
                                                          pieces: tuple[str, ...]) -> None:
    """``simulate mine.json``, ``trace compare``, ``plan --profile``/``--hardware-file`` on a FIFO (or a
    process substitution, ``<(...)``, with no writer left) waited forever in the read: every wait bounded."""
    with fifo(tmp_path / name) as path:
        refused(command.format(f=path), *pieces)


def test_plan_of_an_hf_folder_whose_config_is_a_fifo_is_refused(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    with fifo(tmp_path / "model" / "config.json"):
        refused(f"plan --model hf:{tmp_path / 'model'} --gpus 2 --global-batch 8 --memory 40", NOT_REGULAR)


def test_train_config_that_is_not_a_file_is_not_called_missing(tmp_path: Path) -> None:
    """``train --config DIR`` (or a FIFO) said "no such file" of a path that exists."""
    err = refused(f"train --config {tmp_path} --out {tmp_path / 'run'}", "is a folder, not a file")
    assert "no such file" not in err
    with fifo(tmp_path / "run.toml") as path:
        refused(f"train --config {path} --out {tmp_path / 'run'}", NOT_REGULAR)
    assert not (tmp_path / "run").exists()


def test_the_memory_bound_counts_the_gpt_attention_scores() -> None:
    """``train --seq-len 100000`` passed the memory check and every file was written, then rank 0 failed at
    step 1 allocating 320 GB: the reference GPT writes out a microbatch's heads x s x s attention scores,
    which the lower bound left out (it counted s x hidden per layer)."""
    from pipeoffload.errors import ConfigError
    from pipeoffload.train.config import TrainConfig, validate
    from pipeoffload.train.preflight import DataFacts, check_memory, memory_parts

    cfg = validate(TrainConfig.build(seq_len=100_000))
    facts = DataFacts(tokens=10**7, vocab=256, resident_bytes=0)
    scores = 2 * 4 * 100_000**2 * 4  # 2 sequences a microbatch, 4 heads, fp32: what the run failed to allocate
    assert memory_parts(cfg, facts, 1)["activations"] >= scores
    with pytest.raises(ConfigError, match=r"activations of one microbatch of 2 sequences 2\d\d\.\d GiB.*lower "
                       r"global_batch or seq_len, or raise microbatches"):
        check_memory(cfg, facts, available=64 * 2**30)
    llama = validate(TrainConfig.build(model="llama", seq_len=100_000))  # SDPA writes no scores out
    assert memory_parts(llama, facts, 1)["activations"] < scores / 100


def test_a_report_of_one_step_does_not_call_it_a_median_after_step_1(tmp_path: Path) -> None:
    """``pipeoffload report`` of a one-step run (``train --steps 1``) read "tokens/s (median, after step 1) 190":
    there is no step after step 1; the figure was step 1's own, warm-up and shape inference included."""
    import json

    from pipeoffload.train.report import RunMetrics, key_figures

    row = {"step": 1, "loss": 5.0, "tokens_per_s": 190.0, "step_s": 2.7, "layout": {"pp": 1, "dp": 1, "tp": 1},
           "peak_act_bytes": [1]}
    figures = dict(key_figures(RunMetrics([row])))
    assert figures["tokens/s (step 1 only, its warm-up included)"] == "190"
    assert not [k for k in figures if "after step 1" in k]
    resumed = dict(key_figures(RunMetrics([row, {**row, "step": 2, "resumed": True, "tokens_per_s": 210.0}])))
    assert resumed["tokens/s (median, steps 1, 2: warm-ups only (the first step and the resumes' first))"] == "200"
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    from pipeoffload.cli import main

    assert main(["report", str(run)]) == 0
    assert "step 1 only, its warm-up included" in (run / "report.html").read_text()


def test_the_docs_name_every_key_a_run_does_not_save() -> None:
    """docs/training.md said "`progress` and `stop_at` ... are not saved"; ``keep_records`` is not saved either."""
    import re

    from pipeoffload.train.config import UNSAVED

    docs = (Path(__file__).parents[2] / "docs" / "training.md").read_text()
    said = re.search(r"((?:`\w+`,?\s+(?:and\s+)?)+)belong to one invocation and are not saved", docs)
    assert said is not None
    assert sorted(re.findall(r"`(\w+)`", said.group(1))) == sorted(UNSAVED)


def test_the_demo_says_what_its_seconds_are() -> None:
    """`make demo` ended each run's line with a bare "2.6 s" (the sum of its steps' times, not the run's
    20 s of wall time with start-up, validation and saves), which read as the run's duration."""
    from pipeoffload.demo import run_line

    rows = [{"loss": 5.0 - s, "val_loss": 5.5 if s in (0, 2) else None, "step_s": 0.25, "peak_act_bytes": [2048, 1024],
             "sim_peak_act_bytes": [2048.0, 1024.0]} for s in range(3)]
    line = run_line("1F1B", rows)
    assert line.endswith("(simulated 2 KiB); its 3 steps took 0.8 s"), line


def test_an_input_file_is_read_as_text_was(tmp_path: Path) -> None:
    """``read_input_text`` keeps what ``open()``/``read_text()`` gave the readers it replaced: UTF-8 with
    universal newlines (a schedule edited on Windows, CRLF, still loads), a decoding error for bytes that are
    not UTF-8, and ``IsADirectoryError`` for a folder."""
    from pipeoffload.fileio import read_input_text

    crlf = tmp_path / "mine.txt"
    crlf.write_bytes(b"rank 0: 0F0 0B0\r\nrank 1: 1F0 1B0\r\n")
    assert read_input_text(crlf) == "rank 0: 0F0 0B0\nrank 1: 1F0 1B0\n"
    (tmp_path / "bad").write_bytes(b"\xff\xfe")
    with pytest.raises(UnicodeDecodeError):
        read_input_text(tmp_path / "bad")
    with pytest.raises(IsADirectoryError):
        read_input_text(tmp_path)
