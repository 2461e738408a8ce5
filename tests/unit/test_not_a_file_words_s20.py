"""A report's metrics.jsonl and a Hugging Face folder's config.json that exist but are not regular files (a
FIFO here) are called what they are, not "does not exist" / "is missing" (session 20 audit)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeoffload.cli import main
from pipeoffload.errors import ConfigError
from pipeoffload.fileio import NOT_REGULAR
from pipeoffload.hfdir import open_hf_dir


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def test_report_of_a_run_whose_metrics_are_a_fifo(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _fifo(tmp_path / "metrics.jsonl")
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert NOT_REGULAR in err and "does not exist" not in err and len(err.splitlines()) == 1, err


def test_an_hf_folder_whose_config_is_a_fifo(tmp_path: Path) -> None:
    _fifo(tmp_path / "config.json")
    with pytest.raises(ConfigError) as info:
        open_hf_dir(tmp_path)
    assert NOT_REGULAR in str(info.value) and "missing" not in str(info.value), info.value
    (tmp_path / "config.json").unlink()
    with pytest.raises(ConfigError, match="config.json is missing"):
        open_hf_dir(tmp_path)
