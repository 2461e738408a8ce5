"""A rank that stops (SIGSTOP) or dies (SIGKILL) mid-training: every other rank exits within the
timeout plus a few seconds, with a message naming that rank."""
from __future__ import annotations

import time

import pytest
from runtime_workers import stuck_worker

from pipeoffload.runtime.launch import spawn

pytestmark = pytest.mark.dist

TIMEOUT = 5.0


@pytest.mark.parametrize("how,bad_rank", [("stop", 1), ("kill", 2)])
def test_stopped_or_killed_rank_is_named_by_every_peer(tmp_path, how, bad_rank):
    world, stamp = 3, tmp_path / "stopped_at"
    start = time.time()
    result = spawn(stuck_worker, world, (bad_rank, how, TIMEOUT, str(stamp)), timeout=60, deadline=120,
                   grace=8)
    stopped_at = float(stamp.read_text())
    for rank in range(world):
        if rank == bad_rank:
            continue
        err = result.errors[rank]
        assert result.exitcodes[rank] not in (0, None), (rank, result.exitcodes, err)
        first = err.split("\n\n")[0]
        # the second step (runner.step numbers from 1): the bad rank stopped after its first
        assert f"pipeline rank {rank} failed at step 2" in first and f"rank {bad_rank} is " in first, (rank, err)
        # spawn's clock starts after the processes are created: start + seconds overestimates the exit time
        assert start + result.seconds[rank] - stopped_at < TIMEOUT + 10, (rank, result.seconds, stopped_at - start)
    if how == "stop":
        assert "still running: killed" in result.errors[bad_rank]


def test_a_crashing_rank_leaves_its_python_stack_whole_after_the_run(capfd):
    """torch's agent enables faulthandler in each rank, on stderr: a crash printed its dump there while
    the run went on (ranks crashing together interleaved theirs). The dump is the result's, and written
    after the run, one rank after the other; with collect_faults it is only returned."""
    from runtime_workers import crash_worker

    result = spawn(crash_worker, 2, (1,), timeout=30, deadline=120, grace=5)
    assert result.culprit == 1 and result.exitcodes[1] == -11, (result.exitcodes, result.errors)
    assert "was killed by signal SIGSEGV" in result.summary(), result.summary()
    dump = result.faults[1]
    assert dump.startswith("Fatal Python error: Segmentation fault") and "in crash_worker" in dump, dump
    err = capfd.readouterr().err
    assert f"rank 1 crashed; its Python stack (faulthandler):\n{dump}\n" in err, err
    assert err.count("Fatal Python error") == 1, err
    quiet = spawn(crash_worker, 2, (1,), timeout=30, deadline=120, grace=5, collect_faults=True)
    assert "in crash_worker" in quiet.faults[1] and "Fatal Python error" not in capfd.readouterr().err
