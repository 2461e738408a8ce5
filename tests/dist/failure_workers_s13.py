"""Rank functions for test_failure_s13.py (importable by name: spawned ranks receive them pickled)."""
from __future__ import annotations

import os
import signal
import time
from typing import Any

import torch.distributed as dist


def exits_with_code(rank: int, world: int) -> None:
    """Rank 1 ends with exit code 3 and no Python error (os._exit, as a C extension's exit() does); rank 0
    then fails on its lost connection."""
    dist.barrier()
    if rank == 1:
        os._exit(3)
    time.sleep(0.5)
    dist.barrier()


def hangs_in_set_up(rank: int, world: int) -> None:
    """Rank 1 never reaches the first collective (stuck in its own code); rank 0's times out."""
    if rank == 1:
        time.sleep(1000)
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, rank)


def signalled_while_starting(rank: int, world: int) -> int:
    """A SIGINT sent while the ranks still ignore it (as they start): rank 0 sends it to the launcher,
    every rank waits until the launcher has forwarded it, then installs its own handler and asks
    ``pending_signal`` (the trainer's way): the signal must not be lost."""
    from pipeoffload.runtime.launch import pending_signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a rank still starting: the forwarded signal is dropped
    dist.barrier()
    if rank == 0:
        os.kill(os.getppid(), signal.SIGINT)  # the launcher (our parent) forwards it to every rank
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not _forwarded():
        time.sleep(0.01)
    signal.signal(signal.SIGINT, lambda *_: None)  # the rank's own handler, installed late
    return pending_signal()


def _forwarded() -> bool:
    from pipeoffload.runtime import launch

    return bool(launch._stop_file) and os.path.exists(launch._stop_file[0])


def signals_the_launcher_and_returns(rank: int, world: int, mark: str) -> None:
    """Rank 0 sends SIGTERM to the launcher and notes when in ``mark``; every rank ignores the forwarded
    copy and returns at once, as ranks that finish their step and save quickly do."""
    signal.signal(signal.SIGTERM, lambda *_: None)
    dist.barrier()
    if rank == 0:
        os.kill(os.getppid(), signal.SIGTERM)
        with open(mark, "w") as fh:
            fh.write("sent")
