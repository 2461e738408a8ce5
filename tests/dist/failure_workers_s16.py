"""Rank functions for test_failure_s16.py (importable by name: spawned ranks receive them pickled)."""
from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist


def exits_early_with_code_0(rank: int, world: int) -> None:
    """Rank 1 leaves with exit code 0 before its work is done (os._exit(0), as a library's exit(0) in
    native code would); rank 0 then fails on its lost connection."""
    dist.barrier()
    if rank == 1:
        os._exit(0)
    time.sleep(0.5)
    dist.barrier()


def _refuse_rng_writes() -> None:
    """From now on this process cannot write a checkpoint's ``rng-rank*.pt`` (an I/O error, as a failing
    disk or a full quota of one node gives); everything else the checkpoint module opens still opens."""
    from pipeoffload.train import checkpoint

    def refusing_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        if Path(path).name.startswith("rng-rank"):
            raise OSError(errno.EIO, "Input/output error", str(path))
        return open(path, *args, **kwargs)

    checkpoint.open = refusing_open  # type: ignore[attr-defined]  # the module's ``open``, shadowing the builtin


def layers_of_a_rank_that_cannot_write_its_rng_file() -> list[Any]:
    """``train_workers.plain_layers``, built on rank 1 with its checkpoint writes of random states failing."""
    from train_workers import plain_layers

    if int(os.environ["RANK"]) == 1:
        _refuse_rng_writes()
    return plain_layers()


def loses_its_peer_while_loading(rank: int, world: int, folder: str) -> None:
    """Both ranks save a checkpoint of their stage; rank 1 then leaves (exit 3) and rank 0 loads it, DCP's
    collectives finding rank 1 gone."""
    import torch

    from pipeoffload.train import TrainConfig, checkpoint

    cfg = TrainConfig.build(schedule="1f1b", pp=2, nproc=2, microbatches=2, global_batch=8, out=folder)
    torch.manual_seed(rank)
    layer = torch.nn.Linear(4, 4)
    named = {f"{rank}.{n}": p for n, p in layer.named_parameters()}
    opt = torch.optim.AdamW(layer.parameters())
    path = checkpoint.save(Path(folder), 1, cfg, named, opt, rank, world, {})
    dist.barrier()
    if rank == 1:
        os._exit(3)
    time.sleep(0.5)
    checkpoint.load(path, named, opt, rank, world)


def loss_exiting_at_its_third_call(out: Any, target: Any) -> Any:
    """Cross-entropy, but a ``sys.exit(0)`` at its third call (2 microbatches a step: the evaluation after step
    1), as a library's "fatal error" path might."""
    import sys

    import torch.nn.functional as F

    _calls[0] += 1
    if _calls[0] > 2:
        sys.exit(0)
    return F.cross_entropy(out, target)


_calls = [0]


def batches_failing_in_validation(cfg: Any) -> Any:
    """``train_workers.RandomBatches`` whose held-out batches cannot be read (on rank 1)."""
    from train_workers import RandomBatches

    class FailingVal(RandomBatches):
        def val(self, dp_rank: int) -> list[tuple[Any, Any]]:
            if int(os.environ["RANK"]) == 1:
                raise OSError("validation shard missing")
            return super().val(dp_rank)

    return FailingVal(cfg)


def _refuse_second_background_write() -> None:
    """From its second call on, ``dcp.async_save`` of this process raises before it starts anything (as a
    failing copy of the state to CPU memory would), while its peers' background writes have started."""
    import torch.distributed.checkpoint as dcp

    calls = [0]
    real = dcp.async_save

    def refusing(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] > 1:
            raise OSError(errno.EIO, "Input/output error", "staging the state")
        return real(*args, **kwargs)

    dcp.async_save = refusing


def _make_second_checkpoint_folder_late() -> None:
    """From its second call on, DCP's making of the checkpoint's folder in this process's background writer
    thread (``FileSystem.mkdir``, its first step) happens only once rank 0 has removed that folder (at most
    10 s later): a writer thread that starts late, as on a loaded machine, after the save already failed."""
    from torch.distributed.checkpoint.filesystem import FileSystem

    calls = [0]
    real = FileSystem.mkdir

    def late(self: Any, path: Any) -> None:
        calls[0] += 1
        if calls[0] > 1:
            deadline = time.monotonic() + 10
            while Path(path).exists() and time.monotonic() < deadline:
                time.sleep(0.001)
        real(self, path)

    FileSystem.mkdir = late  # type: ignore[method-assign]


def layers_of_a_rank_whose_second_background_write_fails() -> list[Any]:
    """``train_workers.plain_layers``, built on rank 1 with its second ``dcp.async_save`` failing, and on rank 0
    with its second background write starting after that failure was handled."""
    from train_workers import plain_layers

    if int(os.environ["RANK"]) == 1:
        _refuse_second_background_write()
    else:
        _make_second_checkpoint_folder_late()
    return plain_layers()


def exits_with_code_0_after_its_last_collective(rank: int, world: int) -> int:
    """Rank 1 leaves with exit code 0 after the last collective, before returning: rank 0 returns and waits
    to be collected with it."""
    dist.barrier()
    if rank == 1:
        os._exit(0)
    return rank


if __name__ == "__main__":  # test_failure_s16 runs this in a process of its own, which a hang cannot outlive
    from pipeoffload.runtime.launch import spawn

    result = spawn(exits_with_code_0_after_its_last_collective, 2, timeout=20, deadline=60, grace=5)
    print(f"ok={result.ok} culprit={result.culprit} summary={result.summary()}")
