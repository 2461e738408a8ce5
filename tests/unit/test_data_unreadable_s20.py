"""Training text that cannot be read is refused by `train`'s preflight, in one line naming the data and the
path, before anything is written: a file whose read fails passed it and failed in the ranks after config.toml
and train.log were written; a sub-folder that cannot be listed was a bare PermissionError (session 20 audit)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeoffload.cli import main


def _refused(capsys: pytest.CaptureFixture, out: Path, *argv: str) -> str:
    assert main(["train", *argv, "--out", str(out), "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and not out.exists(), err
    return err


def test_a_text_file_whose_read_fails(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "good.txt").write_text("some text " * 100)
    (data / "bad.txt").symlink_to("/proc/self/mem")  # a regular file whose first byte cannot be read (EIO)
    err = _refused(capsys, tmp_path / "run", "--data", str(data))
    assert f"data={str(data)!r}: {str(data / 'bad.txt')!r} cannot be read" in err, err


def _listable(path: str) -> bool:
    try:
        os.listdir(path)
    except OSError:
        return False
    return True


@pytest.mark.skipif(_listable("/proc/1/cwd"), reason="/proc/1/cwd can be listed here (it cannot as a user or in a container)")
def test_a_folder_with_a_sub_folder_that_cannot_be_listed(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    err = _refused(capsys, tmp_path / "run", "--data", "/proc/1")
    assert "data='/proc/1': " in err and "cannot be listed" in err and "Traceback" not in err, err
