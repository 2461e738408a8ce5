"""A failed save: ENOSPC is recognised however DCP wraps it, the partial folder is removed, and the
message says "disk full" and names the last complete checkpoint."""
from __future__ import annotations

import errno
from pathlib import Path

import pytest

from pipeoffload.train.checkpoint import _DISK_FULL, SaveError, _check, _disk_full, estimated_bytes


def test_enospc_is_recognised_through_wrapping() -> None:
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("CheckpointException ranks:dict_keys([0, 1])") from inner
    except RuntimeError as outer:
        assert _disk_full(outer)
    assert not _disk_full(RuntimeError("CheckpointException ranks:dict_keys([0])"))


def test_a_failed_save_is_removed_and_named(tmp_path: Path) -> None:
    (tmp_path / "checkpoints" / "step-000002").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step-000002" / "x.distcp").write_bytes(b"0" * 1000)
    partial = tmp_path / "checkpoints" / ".tmp-step-000004"
    partial.mkdir()
    with pytest.raises(SaveError) as info:
        _check(_DISK_FULL, OSError(errno.ENOSPC, "No space left on device"), tmp_path, 4, partial, rank=0)
    assert not partial.exists()
    assert "disk full" in str(info.value) and "step-000002" in str(info.value) and "--resume" in str(info.value)
    assert estimated_bytes(tmp_path, 10) == 1000  # the previous checkpoint's size
