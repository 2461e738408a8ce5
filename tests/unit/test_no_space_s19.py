"""An ENOSPC while writing says what is true of it: "disk full" with the free space only where the file system is
full; where it has room (some file systems report a spent quota, or no free inode, as ENOSPC) it says so, not
"disk full (5120.0 MiB free)"; after a failed checkpoint save, whose partial output is gone, it may be either."""
from __future__ import annotations

import errno
import os
import shutil
from collections import namedtuple
from pathlib import Path

import pytest

from pipeoffload.fileio import FULL_BELOW, no_space_text

Usage = namedtuple("Usage", "total used free")
ROOMY, FULL = 5 << 30, FULL_BELOW // 4


def _free(monkeypatch: pytest.MonkeyPatch, free: int) -> None:
    monkeypatch.setattr(shutil, "disk_usage", lambda _path: Usage(10 << 30, (10 << 30) - free, free))


def _metrics_write_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, free: int) -> str:
    from pipeoffload.train import metrics

    run = tmp_path / "run"
    run.mkdir()
    logger = metrics.JsonlLogger(run / "metrics.jsonl", None)

    def no_space(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(metrics.os, "write", no_space)
    _free(monkeypatch, free)
    with pytest.raises(metrics.MetricsError) as caught:
        logger.log({"step": 3, "loss": 1.0})
    monkeypatch.undo()
    assert len(str(caught.value).splitlines()) == 1
    return str(caught.value)


def test_metrics_on_a_roomy_file_system_names_a_quota_not_a_full_disk(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    text = _metrics_write_fails(tmp_path, monkeypatch, ROOMY)
    assert "disk full" not in text and "5120.0 MiB are free" in text and "quota" in text and "inodes" in text, text
    assert "appending the record of step 3" in text and "nothing of it was written" in text, text


def test_metrics_on_a_full_file_system_says_disk_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = _metrics_write_fails(tmp_path, monkeypatch, FULL)
    assert "disk full while appending the record of step 3" in text and "(0.2 MiB free)" in text, text
    assert "quota" not in text, text


@pytest.mark.parametrize(("free", "says", "not_said"), [
    (ROOMY, "disk full or a quota spent while saving the checkpoint of step 4", "(5120.0 MiB free)"),
    (FULL, "disk full while saving the checkpoint of step 4", "quota"),
])
def test_a_failed_save_says_what_is_true_of_the_room_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           free: int, says: str, not_said: str) -> None:
    from pipeoffload.train.checkpoint import _DISK_FULL, SaveError, _check

    partial = tmp_path / "checkpoints" / ".tmp-step-000004"
    partial.mkdir(parents=True)
    _free(monkeypatch, free)
    with pytest.raises(SaveError) as caught:
        _check(_DISK_FULL, OSError(errno.ENOSPC, "No space left on device"), tmp_path, 4, partial, rank=0)
    text = str(caught.value)
    assert says in text and not_said not in text and "the partial save was removed" in text, text


def test_the_words_of_each_case() -> None:
    assert no_space_text("x", FULL_BELOW - 1).startswith("disk full while x (")
    assert no_space_text("x", FULL_BELOW).startswith("no space left on device while x, although 1.0 MiB are free")
    assert no_space_text("x", FULL_BELOW, removed=True).startswith("disk full or a quota spent while x")
