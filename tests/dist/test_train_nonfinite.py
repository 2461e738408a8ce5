"""A run that diverges (a learning rate of 1e30) stops at the step where the loss, the gradient
norm or the parameters stop being finite, naming it, and saves no non-finite checkpoint."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeoffload.train.checkpoint import list_checkpoints

pytestmark = pytest.mark.dist

SMALL = ["--layers", "2", "--hidden", "32", "--seq-len", "32", "--global-batch", "8", "--microbatches", "2",
         "--warmup", "1", "--no-progress"]


def test_a_diverging_run_stops_naming_the_step_and_saves_nothing_non_finite(tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "pipeoffload", "train", *SMALL, "--lr", "1e30", "--steps", "6",
                           "--save-every", "1", "--out", str(run)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "not finite" in last and "step 1" in last and "Traceback" not in done.stderr, done.stderr
    assert list_checkpoints(run) == []
