"""``python -m pipeoffload.runtime --spawn`` waits for the other ranks as `pipeoffload train`'s launcher does
(the same ``GRACE`` and ``SETTLE``): a rank that fails by its own error while its peer is blocked where it
cannot see it (joining the process group) ends the run after ``SETTLE`` seconds, not ``GRACE`` (it gave
5 s). The launcher's own note says which wait it was: no clock is read."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeoffload.runtime import GRACE, SETTLE

pytestmark = pytest.mark.dist


def test_the_demo_launcher_settles_after_a_ranks_own_error(tmp_path: Path) -> None:
    assert SETTLE < GRACE  # else the assertion below could not tell the two waits apart
    site = Path(__file__).with_name("fault_site")
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "PIPEOFFLOAD_TEST_FAULT": "rank_setup:1:raise", "OMP_NUM_THREADS": "1",
           "TMPDIR": str(tmp_path / "tmp"), "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "pipeoffload.runtime", "--spawn", "2", "--steps", "1"],
                          capture_output=True, text=True, timeout=240, env=env)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and lines[-1] == ("python -m pipeoffload.runtime: failed: rank 1: RuntimeError: "
                                                  "injected fault"), done.stderr[-3000:]
    assert f"rank 0 still running: killed {SETTLE:g} s after a rank failed (stuck or stopped?)" in lines, \
        done.stderr[-3000:]
