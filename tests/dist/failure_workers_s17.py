"""Rank functions for ``test_failure_s17`` (importable by name: spawned ranks receive them pickled)."""
from __future__ import annotations

import threading
from typing import Any


def returns_an_unpicklable_value(rank: int, world: int) -> Any:
    """Returns what ``pickle`` refuses (a lock): the result cannot travel back to the launcher."""
    return threading.Lock()


def resume_signalled_while_loading(run_dir: str) -> int:
    """``pipeoffload train --resume RUN_DIR`` in this process (one rank), with a SIGTERM delivered while its
    checkpoint loads (inside DCP's load, as a ``kill PID`` at that moment would land)."""
    import os
    import signal

    import torch.distributed.checkpoint as dcp

    from pipeoffload.cli import main

    real = dcp.load

    def load(*args: Any, **kwargs: Any) -> Any:
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, inside checkpoint.load's try
        return real(*args, **kwargs)

    dcp.load = load
    return main(["train", "--resume", run_dir])


def batches_without_validation(cfg: Any) -> Any:
    """``train_workers.RandomBatches`` whose ``val`` gives no batch at all."""
    from train_workers import RandomBatches

    class NoVal(RandomBatches):
        def val(self, dp_rank: int) -> list[tuple[Any, Any]]:
            return []

    return NoVal(cfg)
