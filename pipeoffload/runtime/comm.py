"""Point-to-point transport between pipeline ranks, with bounded waits and a shared abort record.

Semantics (the ones ``validate.check_p2p_order`` proves deadlock-free): each run of consecutive
SEND/RECV actions is posted as one batch; sends never block (their works are kept and waited at the
end of the step, or, for a storage the activation store manages, before the OFFLOAD or I that frees
it); the rank blocks until every receive of the batch has arrived.

- gloo: each tensor is its own ``isend``/``irecv`` with a tag derived from (direction, stage,
  microbatch, index), so messages between two ranks match by tag whatever the posting order (the
  executor posts all of a step's receives when the step starts and waits for each at its batch).
- NCCL: one ``batch_isend_irecv`` per batch (a group call, required so that two ranks exchanging in
  both directions cannot deadlock); NCCL ignores tags and matches in posting order, so
  ``check_fifo`` verifies at set-up that every pair of ranks posts matching sequences.

Every wait is bounded by ``timeout`` (gloo raises when it expires; NCCL waits are enforced by the
process group's own timeout). When a rank fails it writes one line into the process group's store;
a rank whose wait fails because a peer died reads it, so its own error names the rank, step and
action where the trouble started.
"""
from __future__ import annotations

import datetime
import itertools
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

import torch
import torch.distributed as dist

from pipeoffload import semantics as sem
from pipeoffload.errors import ConfigError
from pipeoffload.ir import Action, Schedule

log = logging.getLogger(__name__)

Message = tuple[int, int, torch.Tensor]  # (peer rank in the pipeline group, tag, tensor)
_MAX_TENSORS = 64  # tensors per boundary message, part of the tag space
_RUNNER_IDS = itertools.count()


def message_tag(direction: int, stage: int, microbatch: int, index: int, num_stages: int, num_microbatches: int) -> int:
    """Tag of tensor ``index`` of the message carrying (direction 0=activation, 1=gradient) from
    ``stage`` for ``microbatch``; the same on sender and receiver."""
    return ((direction * num_stages + stage) * num_microbatches + microbatch) * _MAX_TENSORS + index


def check_tag_space(num_stages: int, num_microbatches: int) -> None:
    if message_tag(1, num_stages, num_microbatches, 0, num_stages, num_microbatches) >= 2**31:
        raise ConfigError(
            f"{num_stages} stages x {num_microbatches} microbatches exceed the gloo tag space; "
            "use fewer microbatches per step"
        )


def check_fifo(schedule: Schedule) -> None:
    """Raise ``ConfigError`` unless, for every ordered pair of ranks, the sender posts its messages
    in the order the receiver posts the matching receives (needed where tags are ignored: NCCL)."""
    placement, n = schedule.placement, schedule.num_stages
    sent: dict[tuple[int, int], list[tuple]] = {}
    received: dict[tuple[int, int], list[tuple]] = {}
    for rank, row in enumerate(schedule.actions):
        for a in row:
            lane = sem.lane_of(a.kind)
            if lane == sem.SEND:  # a message is named by its send: (kind, stage, microbatch)
                peer = placement.rank_of(sem.peer_stage(a.kind, a.stage, n))
                sent.setdefault((rank, peer), []).append((a.kind, a.stage, a.microbatch))
            elif lane == sem.RECV:
                ((send,), sender), = sem.producers(a.kind, a.stage, n)
                received.setdefault((placement.rank_of(sender), rank), []).append((send, sender, a.microbatch))
    for pair, order in sent.items():
        if received.get(pair) != order:
            raise ConfigError(
                f"ranks {pair[0]} -> {pair[1]} send in an order their receives do not follow; NCCL matches "
                "messages in posting order, so this schedule needs the gloo backend or a reordered lowering"
            )


class PeerError(RuntimeError):
    """A wait on a peer rank failed: it timed out, or the connection to the peer was lost."""

    def __init__(self, message: str, peer: int) -> None:
        super().__init__(message)
        self.peer = peer


class Transport(Protocol):
    """What the runner needs to exchange messages with the other pipeline ranks.

    ``matches_in_posting_order`` is the one capability that changes how the runner drives it: true
    when messages between two ranks match in the order they were posted rather than by tag (NCCL).
    The runner then checks at set-up that every pair of ranks posts matching sequences
    (``check_fifo``) and posts each batch's receives with the batch instead of early.
    """

    matches_in_posting_order: bool

    def post(self, sends: Sequence[Message], recvs: Sequence[Message]) -> tuple[list[Any], list[Any]]:
        """Post one batch; return the send and the receive works."""

    def wait(self, works: Sequence[Any], peers: Sequence[int] | None = None, what: str = "a message from") -> None:
        """Block until ``works`` complete, bounded; a failure names the peer (``PeerError``)."""

    def broadcast(self, obj: Any, src_rank: int) -> Any:
        """``obj`` of pipeline rank ``src_rank``, on every rank."""

    def all_gather(self, obj: Any) -> list[Any]:
        """Every pipeline rank's ``obj``, in rank order."""

    def global_name(self, rank: int) -> int:
        """The global rank of pipeline rank ``rank`` (what errors print)."""

    def record_failure(self, message: str) -> None:
        """Make ``message`` the pipeline's first failure, unless one is recorded already."""

    def first_failure(self) -> str | None:
        """The first failure any rank recorded, if any."""

    def close(self) -> None:
        """Release what the transport holds (threads, connections)."""


class ProcessGroupTransport:
    """Posts batches of sends/receives on a process group and waits for receives, bounded.

    A heartbeat thread bumps a counter per rank in the process group's store; when a wait times out,
    the ranks whose counter stopped moving are named as stuck or dead (a rank merely waiting on
    another keeps beating)."""

    def __init__(self, group: dist.ProcessGroup | None, timeout: float, device: torch.device) -> None:
        self.group = group
        self.seconds = timeout
        self.timeout = datetime.timedelta(seconds=timeout)
        self.device = device
        self.backend = dist.get_backend(group)
        self.nccl = device.type == "cuda" and "nccl" in str(self.backend)
        self.matches_in_posting_order = self.nccl
        group_ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
        self._global = list(group_ranks)
        self.rank = dist.get_rank(group)
        # The process group object itself: its send/recv take group ranks and skip the per-call
        # argument checks of dist.isend/irecv (the same C++ calls underneath).
        self._pg = group if group is not None else dist.group.WORLD
        self._store = _default_store()
        self._key = f"pipeoffload/{'-'.join(map(str, group_ranks))}/{next(_RUNNER_IDS)}"
        self.beat_interval = min(1.0, max(0.05, timeout / 20))
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        if self._store is not None:
            self._beat = threading.Thread(target=_heartbeat, args=(self._store, f"{self._key}/beat/{self.rank}",
                                                                   self.beat_interval, self._stop),
                                          name="pipeoffload-heartbeat", daemon=True)
            self._beat.start()

    def __del__(self) -> None:
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()

    def close(self) -> None:
        """Stop the heartbeat and wait for its thread (peers that time out later will name this rank as
        silent). Joined, so that no thread is inside a store call when the process group is destroyed
        or the process exits (a C++ store call cut off at exit aborts the process)."""
        self._stop.set()
        beat = self._beat
        if beat is not None and beat.is_alive() and beat is not threading.current_thread():
            beat.join(timeout=max(5.0, 4 * self.beat_interval))

    def global_rank(self, rank: int) -> int:
        return self._global[rank]

    def post(self, sends: Sequence[Message], recvs: Sequence[Message]) -> tuple[list[Any], list[Any]]:
        """Post one batch; returns (send works, receive works)."""
        if self.nccl:
            ops = [dist.P2POp(dist.isend, t, self._global[p], self.group) for p, _, t in sends]
            ops += [dist.P2POp(dist.irecv, t, self._global[p], self.group) for p, _, t in recvs]
            works = dist.batch_isend_irecv(ops) if ops else []
            return [], list(works)  # NCCL: one group call; waiting on its works covers the sends too
        pg = self._pg
        assert pg is not None, "gloo transport without a process group"
        send_works, recv_works = [], []
        # gloo raises while posting, not only while waiting, when the peer's connection is already
        # closed (a killed rank): named like a failed wait
        for p, tag, t in sends:
            try:
                send_works.append(pg.send([t], p, tag))
            except Exception as exc:  # noqa: BLE001 - re-raised with the peer named
                raise self._peer_error(exc, p, "a message to") from exc
        for p, tag, t in recvs:
            try:
                recv_works.append(pg.recv([t], p, tag))
            except Exception as exc:  # noqa: BLE001 - re-raised with the peer named
                raise self._peer_error(exc, p, "a message from") from exc
        return send_works, recv_works

    def wait(self, works: Sequence[Any], peers: Sequence[int] | None = None, what: str = "a message from") -> None:
        """Wait for ``works`` (exchanged with ``peers``), all within one ``timeout``; a failure is
        re-raised as ``PeerError`` naming the peer, or the rank that stopped beating."""
        deadline = time.monotonic() + self.seconds
        for i, work in enumerate(works):
            try:
                if self.nccl:
                    work.wait()
                else:
                    left = max(0.001, deadline - time.monotonic())
                    work.wait(timeout=datetime.timedelta(seconds=left))
            except Exception as exc:  # noqa: BLE001 - re-raised with the peer named
                peer = peers[i] if peers is not None else -1
                raise self._peer_error(exc, peer, what) from exc

    def _peer_error(self, exc: Exception, peer: int, what: str) -> PeerError:
        """Ranks are named by their global number (the pipeline group's rank differs with dp/tp)."""
        text = " ".join(str(exc).split()).split(". This is typically")[0]
        g = self.global_name(peer)
        if "timed out" not in text.lower() and "timeout" not in text.lower():
            if self.first_failure() is not None:
                return PeerError(f"lost the connection to rank {g}, which exited after the failure below "
                                 f"({text[:160]})", g)
            return PeerError(f"lost the connection to rank {g}: rank {g} is dead or exited ({text[:160]})", g)
        silent = [self.global_name(r) for r in self.silent_ranks()]
        if silent:
            names = ", ".join(map(str, silent))
            return PeerError(
                f"waited {self.seconds:g} s for {what} rank {g}; rank(s) {names} stopped responding "
                f"(no heartbeat): rank {names} is stuck or dead", silent[0])
        return PeerError(
            f"waited {self.seconds:g} s for {what} rank {g}; every rank is still alive, so rank {g} is itself "
            "waiting or computing for longer than the timeout (raise timeout=)", g)

    def global_name(self, rank: int) -> int:
        """The global rank of pipeline-group rank ``rank`` (itself when out of the group's range)."""
        return self._global[rank] if 0 <= rank < len(self._global) else rank

    def silent_ranks(self) -> list[int]:
        """Pipeline-group ranks whose heartbeat does not move over a few beat intervals (at least 1.5 s): stopped or
        dead processes."""
        if self._store is None:
            return []
        keys = [f"{self._key}/beat/{r}" for r in range(len(self._global))]
        return [r for r in unmoved_counters(self._store, keys, self.beat_interval) if r != self.rank]

    def broadcast(self, obj: Any, src_rank: int) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=self._global[src_rank], group=self.group,
                                   device=self.device if self.nccl else None)
        return box[0]

    def all_gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * len(self._global)
        dist.all_gather_object(out, obj, group=self.group)
        return out

    # ---- failure record ---------------------------------------------------------------------------
    def record_failure(self, message: str) -> None:
        """Publish the first failure of this pipeline (later ones keep the first)."""
        if self._store is None:
            return
        try:
            if self._store.add(self._key + "/failures", 1) == 1:
                self._store.set(self._key + "/first", message)
        except Exception:  # noqa: BLE001 - best effort: the store may be gone with a dead peer
            log.debug("could not publish the failure record", exc_info=True)

    def first_failure(self) -> str | None:
        if self._store is None:
            return None
        try:
            if self._store.check([self._key + "/first"]):
                return self._store.get(self._key + "/first").decode()
        except Exception:  # noqa: BLE001
            log.debug("could not read the failure record", exc_info=True)
        return None


def _heartbeat(store: Any, key: str, interval: float, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            store.add(key, 1)
        except Exception:  # noqa: BLE001 - the store went away (a peer hosting it died): stop beating
            return
        stop.wait(interval)


def unmoved_counters(store: Any, keys: Sequence[str], interval: float) -> list[int]:
    """Indices of the heartbeat counters in ``store`` that do not move over a few beat ``interval``s
    (at least 1.5 s): their ranks are stopped or dead. Best effort: [] when the store cannot be read."""
    try:
        before = [store.add(k, 0) for k in keys]
        time.sleep(max(3 * interval, 1.5))  # a loaded machine may delay a beat or two
        after = [store.add(k, 0) for k in keys]
    except Exception:  # noqa: BLE001 - the store may be gone with a dead peer
        log.debug("could not read heartbeats", exc_info=True)
        return []
    return [i for i, (b, a) in enumerate(zip(before, after)) if a == b]


def _default_store() -> Any:
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - private API; without it errors still name this rank's action
        return None


class LoopbackTransport:
    """For replaying one rank alone: sends go nowhere, receives are filled with plausible values
    (small random floats, zeros otherwise), so one device can run one rank's real schedule."""

    matches_in_posting_order = False

    def __init__(self, device: torch.device, seed: int = 0) -> None:
        self.device = device
        self._gen = torch.Generator(device="cpu").manual_seed(seed)
        self._templates: dict[tuple, torch.Tensor] = {}

    def _template(self, t: torch.Tensor) -> torch.Tensor:
        key = (tuple(t.shape), t.dtype)
        tmpl = self._templates.get(key)
        if tmpl is None:
            if t.is_floating_point():
                tmpl = (torch.randn(t.shape, generator=self._gen) * 0.02).to(device=self.device, dtype=t.dtype)
            else:
                tmpl = torch.zeros(t.shape, dtype=t.dtype, device=self.device)
            self._templates[key] = tmpl
        return tmpl

    def post(self, sends: Sequence[Message], recvs: Sequence[Message]) -> tuple[list[Any], list[Any]]:
        for _, _, t in recvs:
            t.copy_(self._template(t))
        return [], []

    def wait(self, works: Sequence[Any], peers: Sequence[int] | None = None, what: str = "") -> None:
        return None

    def broadcast(self, obj: Any, src_rank: int) -> Any:
        return obj

    def all_gather(self, obj: Any) -> list[Any]:
        return [obj]

    def record_failure(self, message: str) -> None:
        return None

    def close(self) -> None:
        return None

    def first_failure(self) -> str | None:
        return None

    def global_name(self, rank: int) -> int:
        return rank


def peer_of(a: Action, schedule: Schedule) -> int:
    """The rank on the other side of comm action ``a``."""
    return schedule.placement.rank_of(sem.peer_stage(a.kind, a.stage, schedule.num_stages))


def comm_batches(row: Sequence[Action]) -> list:
    """The rank's program: compute/copy actions as they are, each maximal run of consecutive send and
    receive actions (``semantics.LANE``) as one list (posted together)."""
    comm = {k for k in sem.KINDS if sem.lane_of(k) in (sem.SEND, sem.RECV)}
    out: list = []
    for a in row:
        if a.kind in comm:
            if out and isinstance(out[-1], list):
                out[-1].append(a)
            else:
                out.append([a])
        else:
            out.append(a)
    return out
