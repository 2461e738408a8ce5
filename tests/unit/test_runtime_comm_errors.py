"""A send or receive that fails while being posted (gloo raises there when the peer's connection is
already closed, e.g. the peer was killed) names the peer like a failed wait does."""
from __future__ import annotations

import datetime
import tempfile

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from pipeoffload.runtime.comm import PeerError, ProcessGroupTransport  # noqa: E402

GLOO_CLOSED = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
               "[127.0.0.1]:51414. This is typically caused by a remote worker crashing.")


class _ClosedPeer:
    """The process group's posting calls as gloo behaves once a peer's connection is closed."""

    def send(self, tensors, peer, tag):  # type: ignore[no-untyped-def]
        raise RuntimeError(GLOO_CLOSED)

    def recv(self, tensors, peer, tag):  # type: ignore[no-untyped-def]
        raise RuntimeError(GLOO_CLOSED)


@pytest.fixture()
def transport():  # type: ignore[no-untyped-def]
    with tempfile.TemporaryDirectory() as folder:
        dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=30))
        try:
            made = ProcessGroupTransport(None, 5.0, torch.device("cpu"))
            made._pg = _ClosedPeer()  # type: ignore[assignment]
            yield made
            made.close()
        finally:
            dist.destroy_process_group()


@pytest.mark.parametrize("side", ["send", "recv"])
def test_a_post_to_a_dead_peer_names_it(transport, side: str) -> None:  # type: ignore[no-untyped-def]
    message = [(2, 7, torch.zeros(3))]
    with pytest.raises(PeerError) as info:
        transport.post(message if side == "send" else [], message if side == "recv" else [])
    assert info.value.peer == 2
    assert "lost the connection to rank 2: rank 2 is dead or exited" in str(info.value)
    assert "Connection closed by peer" in str(info.value)


def test_close_joins_the_heartbeat_thread(transport) -> None:  # type: ignore[no-untyped-def]
    beat = transport._beat
    assert beat is not None and beat.is_alive()
    transport.close()
    assert not beat.is_alive()  # nothing is left inside a store call when the group is destroyed
