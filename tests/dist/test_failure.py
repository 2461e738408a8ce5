"""A rank that raises mid-step brings every rank down, promptly, with a message naming the rank,
the step and the action."""
from __future__ import annotations

import re

import pytest
from workers import failure_worker

from pipeoffload.runtime.launch import spawn

pytestmark = pytest.mark.dist


def test_one_rank_raises_all_exit_nonzero_with_rank_step_action():
    world, bad_rank, microbatches = 4, 1, 8
    fail_call = 1 + microbatches + 2  # shape probe, step 1's forwards, then step 2's second forward
    result = spawn(failure_worker, world, (bad_rank, fail_call), timeout=40, deadline=150)
    assert all(code not in (0, None) for code in result.exitcodes), (result.exitcodes, result.errors)
    assert max(result.seconds) - min(result.seconds) < 60, result.seconds
    own = result.errors[bad_rank]
    assert re.search(r"pipeline rank 1 failed at step 2, action #\d+ 1F1: ValueError: injected failure", own), own
    for rank, err in enumerate(result.errors):
        assert err is not None and f"pipeline rank {rank} failed at step 2, action" in err, (rank, err)
        if rank != bad_rank:
            assert "first failure in the pipeline: pipeline rank 1 failed at step 2" in err, (rank, err)
