"""Start-up has its own bound, ``--startup-timeout``: a rank slow to join the process group or to load its data
(seconds past ``--timeout``) no longer ends the run, while ``--timeout`` still bounds every wait from the first
step on. Here: spawned ranks join their group (gloo's connection of every pair waits for the slowest rank) with
the start-up bound, not ``timeout``. ``test_train_faults.py``: a run whose rank 0 loads its data twice --timeout
late (``fault_site``'s ``sleepS``) trains, and a rank stopped afterwards is found within --timeout under a 300 s
start-up bound."""
from __future__ import annotations

import pytest
from startup_workers_s20 import joined_with

from pipeoffload.runtime.launch import spawn

pytestmark = pytest.mark.dist


def test_spawn_joins_the_process_group_with_the_start_up_bound() -> None:
    result = spawn(joined_with, 2, timeout=7, startup_timeout=45, deadline=120)
    assert result.ok, result.summary()
    assert result.results == [45.0, 45.0]
    plain = spawn(joined_with, 2, timeout=7, deadline=120)  # without one, the group's is ``timeout`` as before
    assert plain.results == [7.0, 7.0], plain.summary()
