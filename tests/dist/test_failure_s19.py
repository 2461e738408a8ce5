"""A rank that fails with its own error (or dies) while its peers are blocked where they cannot see it (a store
wait, as in building the mesh) ends the run after ``settle`` seconds, not the full ``grace`` (train: 1 s, not
5 s): the others could only report the loss of it. Where the first failure is itself a lost peer, the full
grace still lets the rank that caused it be seen to. The verdict says which wait it was (no clock is read)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from failure_workers_s19 import fails_while_its_peer_waits_in_the_store

from pipeoffload.runtime.launch import spawn
from pipeoffload.train.launch import GRACE, SETTLE

pytestmark = pytest.mark.dist


def test_an_own_error_ends_the_run_after_the_settle_time() -> None:
    result = spawn(fails_while_its_peer_waits_in_the_store, 2, ("bad batch",), timeout=60, deadline=120,
                   grace=GRACE, settle=SETTLE)
    assert result.summary() == "rank 1: ValueError: bad batch", result.errors
    assert (result.errors[0] or "").endswith(f"rank 0 still running: killed {SETTLE:g} s after a rank failed "
                                             "(stuck or stopped?)"), result.errors


def test_a_lost_peer_first_still_gets_the_grace() -> None:
    result = spawn(fails_while_its_peer_waits_in_the_store, 2, ("Connection closed by peer",), timeout=60,
                   deadline=120, grace=3, settle=SETTLE)
    assert "killed 3 s after a rank failed" in (result.errors[0] or ""), result.errors


def test_a_rank_failing_to_build_the_mesh_is_named_with_its_action(tmp_path: Path) -> None:
    """The rule the settle time keeps: every rank ends, and the last line names the rank and what it was doing."""
    site = Path(__file__).with_name("fault_site")
    data = tmp_path / "data.txt"
    data.write_text("".join(p.read_text() for p in sorted(Path(__file__).parent.glob("*.py"))))
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "PIPEOFFLOAD_TEST_FAULT": "mesh:1:raise", "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path / "tmp"),
           "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    argv = ["train", "--layers", "2", "--hidden", "32", "--seq-len", "32", "--global-batch", "8", "--microbatches", "2",
            "--no-progress", "--tokenizer", "byte", "--nproc", "2", "--pp", "2", "--steps", "2", "--data", str(data),
            "--out", str(tmp_path / "run")]
    done = subprocess.run([sys.executable, "-m", "pipeoffload", *argv], capture_output=True, text=True, timeout=240,
                          env=env)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1 and last.startswith("pipeoffload train: failed: rank 1: RankError: rank 1 failed "
                                                    "while building the device mesh"), done.stderr[-3000:]
