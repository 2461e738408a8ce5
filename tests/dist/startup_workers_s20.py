"""Rank functions of ``test_train_startup_s20.py`` (importable by the spawned ranks)."""
from __future__ import annotations


def joined_with(rank: int, world: int) -> float:
    """The timeout, in seconds, of the default process group this rank was started in."""
    import torch
    import torch.distributed as dist

    del rank, world
    return float(dist.group.WORLD._get_backend(torch.device("cpu")).options._timeout.total_seconds())
