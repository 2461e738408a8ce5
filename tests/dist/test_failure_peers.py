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
        assert f"pipeline rank {rank} failed at step 1" in first and f"rank {bad_rank} is " in first, (rank, err)
        # spawn's clock starts after the processes are created: start + seconds overestimates the exit time
        assert start + result.seconds[rank] - stopped_at < TIMEOUT + 10, (rank, result.seconds, stopped_at - start)
    if how == "stop":
        assert "still running: killed" in result.errors[bad_rank]
