"""Start-up has its own bound, ``--startup-timeout``: a rank slow to join the process group or to load its data
(seconds past ``--timeout``) no longer ends the run, while ``--timeout`` still bounds every wait from the first
step on (``test_train_faults.py``: a stopped rank is found within it under a long start-up bound). The slowness
is real: ``fault_site/sitecustomize.py`` sleeps in the named function of one rank."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from startup_workers_s20 import joined_with

from pipeoffload.runtime.launch import spawn

pytestmark = pytest.mark.dist

SITE = Path(__file__).with_name("fault_site")
TIMEOUT = 4  # --timeout: the steps' waits of a tiny 2-rank model (well under a second at load 10)
SLOW = 2 * TIMEOUT  # each start-up wait the test causes: twice --timeout, far under --startup-timeout
TINY = ["--layers", "2", "--hidden", "32", "--seq-len", "32", "--global-batch", "8", "--microbatches", "2",
        "--warmup", "1", "--no-progress", "--tokenizer", "byte", "--eval-every", "1000", "--nproc", "2", "--pp", "2"]


def test_spawn_joins_the_process_group_with_the_start_up_bound() -> None:
    result = spawn(joined_with, 2, timeout=7, startup_timeout=45, deadline=120)
    assert result.ok, result.summary()
    assert result.results == [45.0, 45.0]
    plain = spawn(joined_with, 2, timeout=7, deadline=120)  # without one, the group's is ``timeout`` as before
    assert plain.results == [7.0, 7.0], plain.summary()


def test_a_start_up_slower_than_timeout_within_startup_timeout_trains(tmp_path: Path) -> None:
    """Rank 1 joins the process group SLOW s late (rank 0 waits in the rendezvous of the group), then rank 0
    loads its data SLOW s late (rank 1 waits in the trainer's first collective): with --timeout alone bounding
    start-up, the waiting rank gave up after --timeout."""
    data = tmp_path / "data.txt"
    data.write_text("".join(p.read_text() for p in sorted(Path(__file__).parent.glob("*.py"))))
    run = tmp_path / "run"
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path / "tmp"),
           "PIPEOFFLOAD_TEST_FAULT": f"init:1:sleep{SLOW},corpus:0:sleep{SLOW}",
           "PYTHONPATH": os.pathsep.join([str(SITE), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "pipeoffload", "train", *TINY, "--data", str(data), "--steps", "3",
                           "--timeout", str(TIMEOUT), "--startup-timeout", "300", "--out", str(run)],
                          capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (1, 0):  # both delays happened
        assert f"[fault_site] rank {rank}: sleep{SLOW} at step 0" in done.stderr, done.stderr[-3000:]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [r["step"] for r in records] == [1, 2, 3]
