"""Failures the probe of the thirteenth session injected, through the real launcher (2 gloo ranks, a few
seconds each): a rank that exits with a code of its own and no Python error, a rank stuck before the first
collective, and a signal that reaches the ranks while they still ignore it."""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from failure_workers_s13 import (
    exits_with_code,
    hangs_in_set_up,
    signalled_while_starting,
    signals_the_launcher_and_returns,
)

from pipeoffload.runtime import launch
from pipeoffload.runtime.launch import spawn

pytestmark = pytest.mark.dist


def test_a_rank_exiting_with_its_own_code_is_named_with_it() -> None:
    """os._exit(3) (or a C extension's exit()): no error file, its peer sees a lost connection; the verdict
    must name rank 1 and its code, not rank 0's lost connection."""
    result = spawn(exits_with_code, 2, timeout=20, deadline=60, grace=5)
    assert result.exitcodes[1] == 3 and result.culprit == 1, (result.exitcodes, result.errors)
    line = result.summary()
    assert line.startswith("rank 1 ") and "exited with code 3" in line, line


def test_a_rank_stuck_before_the_first_collective_is_blamed_not_its_waiting_peer() -> None:
    """Rank 0 times out waiting for rank 1, which is still running (stuck in set-up) and is killed after the
    grace: the verdict names rank 1, not rank 0's gloo timeout."""
    result = spawn(hangs_in_set_up, 2, timeout=2, deadline=60, grace=1)
    assert not result.ok
    line = result.summary()
    assert line.startswith("rank 1 was still running"), line
    assert "rank 0: " in line  # what the waiting rank saw, after


def test_a_signal_sent_while_the_ranks_ignore_it_is_still_delivered() -> None:
    """The launcher forwards a SIGINT that the ranks drop (they start with it ignored); the rank's handler,
    installed later, learns of it from ``pending_signal``; the run counts as interrupted."""
    result = spawn(signalled_while_starting, 2, timeout=20, deadline=60, forward_signals=True, stop_grace=30)
    assert result.ok, result.errors
    assert result.results == [signal.SIGINT, signal.SIGINT]
    assert result.interrupted == signal.SIGINT


def test_a_copy_of_the_signal_after_the_ranks_returned_is_still_the_same_signal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`kill -TERM -- -PGID` under `timeout`: the launcher gets the signal and `timeout`'s copy a moment
    later. Where the ranks return before the copy arrives, spawn must still take it as the first delivered
    twice, not hand it to the handler it restores (the CLI's default: killed by SIGTERM after saving)."""
    monkeypatch.setattr(launch, "REPEAT", 3.0)  # a margin for the sender thread on a loaded machine
    mark = tmp_path / "sent"
    after: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: after.append(signum))

    def copy_of_the_signal() -> None:
        deadline = time.monotonic() + 60
        while not mark.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.5)  # past the ranks' return (on the code before, spawn had returned), within REPEAT
        os.kill(os.getpid(), signal.SIGTERM)

    sender = threading.Thread(target=copy_of_the_signal)
    sender.start()
    try:
        result = spawn(signals_the_launcher_and_returns, 2, (str(mark),), timeout=20, deadline=60,
                       forward_signals=True, stop_grace=30)
        sender.join()
        time.sleep(0.1)  # a handler runs between the main thread's bytecodes
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert result.ok and result.interrupted == signal.SIGTERM, result.errors
    assert after == [], "the copy reached the restored handler"
