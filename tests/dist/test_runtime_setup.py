"""Set-up mistakes across ranks are caught at the first step with a message naming the ranks."""
from __future__ import annotations

import pytest
from runtime_workers import mismatch_worker

from pipeoffload.runtime.launch import spawn

pytestmark = pytest.mark.dist


def test_ranks_with_different_schedules_are_named():
    result = spawn(mismatch_worker, 2, (), timeout=30, deadline=120)
    assert result.exitcodes == [1, 1], (result.exitcodes, result.results)
    assert "ranks [1] run a different schedule from rank 0" in result.errors[0], result.errors[0]
    assert "ranks [0] run a different schedule from rank 1" in result.errors[1], result.errors[1]
    assert "1f1b" in result.errors[0] and "gpipe" in result.errors[0]
