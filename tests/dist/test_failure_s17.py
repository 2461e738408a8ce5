"""Faults the review of the seventeenth session found (2 gloo ranks, a few seconds each)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist

HERE = Path(__file__).parent


def test_a_rank_function_whose_result_cannot_be_pickled_fails_naming_it() -> None:
    """``spawn`` pickles each rank's result to send it back. The pickling used to run after the rank had
    registered its exit 0: the error left the rank with code 0 and no result, and torch's agent waited for
    that result for ever (past ``deadline``). Now the rank fails with the pickling error, named in the
    verdict. Run in a subprocess so that the old hang fails the test rather than stopping the suite."""
    code = ("from failure_workers_s17 import returns_an_unpicklable_value as fn\n"
            "from pipeoffload.runtime.launch import spawn\n"
            "r = spawn(fn, 2, timeout=20, deadline=60, grace=5)\n"
            "print('ok', r.ok)\nprint('summary', r.summary())\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=150, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("spawn did not return: a rank's unpicklable result hung the launcher")
    assert "ok False" in done.stdout, done.stdout + done.stderr[-2000:]
    summary = next(line for line in done.stdout.splitlines() if line.startswith("summary"))
    assert "cannot pickle" in summary and "_thread.lock" in summary, summary
