"""The run lock where its folder is removed between ``mkdir``'s "exists" and its own check that the path is a
folder (the last launcher of a folder releasing it at that instant: found by the four-process stress test,
which then failed with a FileExistsError traceback), and where a file stands where the folder must be."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeoffload.errors import ConfigError
from pipeoffload.train.runlock import RunLock


def test_a_folder_removed_right_after_mkdir_found_it_is_made_again(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "a" / "run"
    holder = RunLock(run)
    holder.acquire()  # made a/, a/run/ and a/run/.lock: its release removes them
    real_mkdir = os.mkdir

    def mkdir(path: os.PathLike[str] | str, mode: int = 0o777) -> None:
        try:
            real_mkdir(path, mode)
        except FileExistsError:
            if holder._fd is not None:
                holder.release()  # the holder ends at this instant, before pathlib's is_dir() check
            raise

    monkeypatch.setattr(os, "mkdir", mkdir)
    with RunLock(run):
        assert (run / ".lock").read_text().split()[0] == str(os.getpid())
    assert not (tmp_path / "a").exists()  # what the second lock made again went with it


@pytest.mark.parametrize("where", ["run", "parent"])
def test_a_file_where_the_run_folder_must_be_is_one_line(tmp_path: Path, where: str) -> None:
    (tmp_path / "x").write_text("")
    run = tmp_path / "x" if where == "run" else tmp_path / "x" / "run"
    with pytest.raises(ConfigError, match=r"'.*x' exists and is not a folder; give a folder for the run \(--out DIR\)"):
        RunLock(run).acquire()
    assert (tmp_path / "x").read_text() == "" and sorted(p.name for p in tmp_path.iterdir()) == ["x"]
