"""train.log on a full disk: one line on stderr, not a traceback per log line."""
from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from pipeoffload.train.launch import setup_logging


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (writes fail with ENOSPC)")
def test_a_train_log_that_cannot_be_written_says_so_once(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "train.log").symlink_to("/dev/full")
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        setup_logging(0, tmp_path)
        for step in range(50):
            logging.getLogger("pipeoffload.train.loop").info("step %d", step)
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
            h.close()
        for h in handlers:
            root.addHandler(h)
        root.setLevel(level)
    err = capsys.readouterr().err
    assert "Logging error" not in err and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "cannot write" in lines[0] and "train.log" in lines[0], err
