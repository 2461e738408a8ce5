"""Workers of test_failure_s19 (importable by the spawned ranks)."""
from __future__ import annotations

import torch.distributed as dist


def fails_while_its_peer_waits_in_the_store(rank: int, world: int, message: str) -> None:
    """Rank 1 fails at once with ``message``; rank 0 waits in the default store for a key rank 1 would have
    set, as a rank building the mesh waits for its peers' addresses: it cannot see rank 1's exit."""
    if rank == 1:
        raise ValueError(message)
    dist.distributed_c10d._get_default_store().get("pipeoffload/test/never-set")
