"""The metrics loggers: a missing tensorboard is refused before any rank starts; metrics.jsonl and the
TensorBoard events drop what came after the checkpoint on resume; history keeps the last records."""
from __future__ import annotations

import json
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


# ---- a full disk and torn lines (probe D, finding 2) ---------------------------------------------
def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_a_write_cut_short_by_a_full_disk_leaves_no_torn_line_and_stops_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The record is written whole or not at all: ENOSPC part-way removes the part, and the error names
    metrics.jsonl, the step, "no space left", the last complete checkpoint and the resume command."""
    import errno
    import os

    from pipeoffload.train import metrics

    run = tmp_path / "run"
    (run / "checkpoints" / "step-000002").mkdir(parents=True)
    logger = JsonlLogger(run / "metrics.jsonl", None)
    logger.log(_record(1))
    real_write = os.write
    calls = []

    def short_then_full(fd: int, data: bytes) -> int:  # the disk fills mid-record
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, data[:7])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(metrics.os, "write", short_then_full)
    with pytest.raises(metrics.MetricsError) as caught:
        logger.log(_record(2))
    monkeypatch.undo()
    text = str(caught.value)
    assert len(text.splitlines()) == 1, text
    # ENOSPC on this roomy file system: a quota's or the inodes', which it says (test_no_space_s19.py: a full disk)
    assert "no space left on device" in text and str(run / "metrics.jsonl") in text and "step 2" in text, text
    assert "step-000002" in text and f"pipeoffload train --resume {run}" in text, text
    assert [json.loads(line)["step"] for line in _lines(run / "metrics.jsonl")] == [1]
    assert (run / "metrics.jsonl").read_text().endswith("\n")


def test_any_other_write_error_names_the_file_and_the_error(tmp_path: Path) -> None:
    """A real ENOSPC (metrics.jsonl pointing at /dev/full) and an error that is not a full disk."""
    from pipeoffload.train.metrics import MetricsError

    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    path = tmp_path / "metrics.jsonl"
    logger = JsonlLogger(path, None)
    path.symlink_to("/dev/full")
    with pytest.raises(MetricsError, match="no space left on device") as caught:
        logger.log(_record(1))
    assert "no checkpoint was saved yet" in str(caught.value) and str(path) in str(caught.value)
    path.unlink()
    path.mkdir()  # a folder where the file should be: not a full disk
    with pytest.raises(MetricsError) as caught:
        logger.log(_record(1))
    text = str(caught.value)
    assert "no space" not in text and str(path) in text and "Is a directory" in text, text


def test_on_resume_a_torn_last_line_is_dropped_with_a_warning(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(_record(s)) + "\n" for s in (1, 2, 3)) + '{"step": 4, "lo')
    with caplog.at_level("WARNING"):
        JsonlLogger(path, 3)
    assert [json.loads(line)["step"] for line in _lines(path)] == [1, 2, 3]
    assert any(f"{path}:4" in r.getMessage() and "incomplete" in r.getMessage() for r in caplog.records), \
        caplog.text


@pytest.mark.parametrize("bad", [b'{"step": 2, "lo', b"[1, 2]", b'{"step": "two"}', b"\xff\xfe"])
def test_on_resume_a_corrupt_line_before_the_last_is_refused_naming_file_and_line(tmp_path: Path,
                                                                                 bad: bytes) -> None:
    from pipeoffload.errors import ConfigError

    path = tmp_path / "metrics.jsonl"
    before = json.dumps(_record(1)).encode() + b"\n" + bad + b"\n" + json.dumps(_record(3)).encode() + b"\n"
    path.write_bytes(before)
    with pytest.raises(ConfigError) as caught:
        JsonlLogger(path, 3)
    text = str(caught.value)
    assert len(text.splitlines()) == 1 and text.startswith(f"{path}:2: "), text
    assert path.read_bytes() == before  # left as it was for the user to fix


def test_a_line_that_parses_but_lacks_its_newline_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps(_record(1)) + "\n" + json.dumps(_record(2)))
    JsonlLogger(path, 5).log(_record(3))
    assert [json.loads(line)["step"] for line in _lines(path)] == [1, 2, 3]


def test_a_new_run_replacing_an_earlier_runs_metrics_says_so(tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """An --out whose earlier run saved no checkpoint (so a new run may start there): its metrics.jsonl
    is replaced, with a warning naming the file and the records dropped (probe D 12: silently)."""
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(_record(s)) + "\n" for s in range(1, 131)))
    with caplog.at_level("WARNING"):
        JsonlLogger(path, None).log(_record(1))
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1]
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and str(path) in warned[0] and "130 records of an earlier run" in warned[0], warned
    caplog.clear()
    path.write_text("")
    with caplog.at_level("WARNING"):
        JsonlLogger(path, None)
    assert not caplog.records and not path.exists()  # nothing was replaced: nothing said
