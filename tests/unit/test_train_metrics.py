"""The metrics loggers: a missing tensorboard is refused before any rank starts; metrics.jsonl and the
TensorBoard events drop what came after the checkpoint on resume; history keeps the last records."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pipeoffload.train.metrics import JsonlLogger, TensorBoardLogger, make_loggers, read_metrics


def test_tensorboard_without_the_package_is_one_line_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from pipeoffload.cli import main

    monkeypatch.setitem(sys.modules, "tensorboard", None)  # an import of it fails, as when not installed
    out = tmp_path / "run"
    assert main(["train", "--tensorboard", "--steps", "1", "--out", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "pip install 'pipeoffload[tensorboard]'" in lines[0], lines
    assert not out.exists()


def _record(step: int) -> dict:
    return {"step": step, "loss": 1.0 / step, "val_loss": None, "peak_act_bytes": [10 * step, 20 * step]}


def test_loggers_resume_dropping_what_came_after_the_checkpoint(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def run(steps: range, resume_step: int | None) -> None:
        loggers = make_loggers(tmp_path, True, resume_step)
        assert [type(lg) for lg in loggers] == [JsonlLogger, TensorBoardLogger]
        for step in steps:
            for lg in loggers:
                lg.log(_record(step))
        for lg in loggers:
            lg.close()

    run(range(1, 5), None)  # a run that got to step 4, its checkpoint at step 2
    run(range(3, 6), 2)  # resumed from step 2
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4, 5]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("peak_act_bytes/rank1")] == [(s, 20.0 * s) for s in range(1, 6)]
    assert "val_loss" not in events.Tags()["scalars"]  # null: left out
    run(range(1, 2), None)  # a new run in the folder starts both afresh
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1]
    assert make_loggers(None, True, None) == []
