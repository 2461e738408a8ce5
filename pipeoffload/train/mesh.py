"""This rank's place in the ("dp", "pp", "tp") device mesh and the process groups of each dimension.

Global rank = (dp_index * pp + pp_index) * tp + tp_index: tensor-parallel peers are adjacent (on one
node under torchrun's usual numbering), then pipeline ranks, then data-parallel replicas.

Every group of the mesh gets a timeout (``init_device_mesh`` would otherwise give its sub-groups
torch's default of 30 minutes, so a data-parallel all-reduce with a stopped peer never failed): the
start-up bound (``--startup-timeout``) while the ranks set up, the run's (``--timeout``) from
``RankContext.started`` on, before the first step. A heartbeat per rank in the default store lets a
failed collective name the peer that stopped responding by its global rank (``RankContext.peer_failure``).
"""
from __future__ import annotations

import contextlib
import datetime
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


@dataclass
class RankContext:
    rank: int
    world: int
    device: torch.device
    dp: int
    pp: int
    tp: int
    dp_rank: int
    pp_rank: int
    tp_rank: int
    mesh: Any  # torch.distributed.device_mesh.DeviceMesh
    dp_group: Any
    pp_group: Any
    tp_group: Any
    heartbeat: Heartbeat | None = field(default=None, repr=False)
    timeout: float | None = None  # the run's bound of every wait once started (None: torch's default)
    startup: float | None = None  # the bound of every wait until then (None: ``timeout``)
    groups: list[Any] = field(default_factory=list, repr=False)  # this rank's groups of ``new_group``
    _started: bool = field(default=False, repr=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def tp_mesh(self) -> Any:
        return self.mesh["tp"]

    def bound(self) -> float | None:
        """The timeout of a wait started now: the start-up bound until ``started``, then the run's."""
        return self.timeout if self._started or self.startup is None else self.startup

    def new_group(self, ranks: list[int]) -> Any:
        """A process group of ``ranks`` (every rank calls it, in one order) bounded like the mesh's groups:
        created during start-up, it is switched to the run's timeout by ``started`` too."""
        bound = self.bound()
        group = dist.new_group(ranks, timeout=datetime.timedelta(seconds=bound) if bound is not None else None)
        if self.rank in ranks:
            self.groups.append(group)
        return group

    def started(self) -> None:
        """Start-up is over (every rank has passed its last collective of setting up; the first step
        comes next): from here every wait of the default group, the mesh's groups and ``new_group``'s is
        bounded by the run's timeout rather than the start-up bound, so a rank stopped during training
        is found within ``--timeout`` however long start-up may take."""
        if self._started:
            return
        self._started = True
        if self.timeout is None or self.startup in (None, self.timeout):
            return
        limit = datetime.timedelta(seconds=self.timeout)
        for group in {id(g): g for g in [None, self.dp_group, self.pp_group, self.tp_group, *self.groups]}.values():
            dist.distributed_c10d._set_pg_timeout(limit, group)

    def close(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.close()

    @contextlib.contextmanager
    def collective(self, what: str) -> Iterator[None]:
        """Run a collective of the training loop; a failure (a timeout, a lost peer) is re-raised as
        ``PeerFailure`` naming this rank, ``what`` was being done and the silent ranks; an error of this
        rank's own as ``RankError`` naming the rank and ``what`` (see ``doing``)."""
        try:
            yield
        except _self_named():  # already say what failed, and where
            raise
        except RuntimeError as exc:
            if not is_peer_error(exc):
                raise own_error(self.rank, what, exc) from exc
            raise self.peer_failure(exc, what) from exc
        except Exception as exc:
            raise own_error(self.rank, what, exc) from exc

    def peer_failure(self, exc: BaseException, what: str) -> PeerFailure:
        text = " ".join(str(exc).split()).split(". This is typically")[0][:200]
        silent = self.heartbeat.silent() if self.heartbeat is not None else []
        if silent:
            names = ", ".join(map(str, silent))
            why = f"rank(s) {names} stopped responding (no heartbeat): rank {silent[0]} is stuck or dead"
        elif "timed out" in text.lower() or "timeout" in text.lower():
            why = ("every rank is still alive, so a peer is itself waiting or computing for longer than the timeout "
                   "(stuck in its own code?; raise timeout=)")
        else:
            why = "a peer exited or failed first (see its error)"
        return PeerFailure(f"rank {self.rank} failed while {what}: {why} ({text})", silent)


class PeerFailure(RuntimeError):
    """A collective of the training loop failed because a peer is stuck or gone; ``silent``: the
    global ranks whose heartbeat stopped."""

    def __init__(self, message: str, silent: list[int]) -> None:
        super().__init__(message)
        self.silent = silent


class RankError(RuntimeError):
    """An error of a rank's own outside the pipeline step (torch's, a library's, the model's), naming the rank
    and what it was doing: reported bare ("rank 1: RuntimeError: ..."), an error in the optimizer step, the
    gradient reduction or a save said neither where nor when."""


def own_error(rank: int, what: str, exc: BaseException) -> RankError:
    text = str(exc).strip()
    return RankError(f"rank {rank} failed while {what}: {type(exc).__name__}"
                     f"{': ' + text.splitlines()[0][:300] if text else ''}")


def _self_named() -> tuple[type[BaseException], ...]:
    """The errors that name their rank and action (or are the user's input: exit 2) themselves, and the CLI's
    ``Interrupted`` (its SIGTERM handler raises it in a one-process run's rank until ``fit`` takes the signal:
    wrapped, the run read "failed ... RankError ...: Interrupted", exit 1, not interrupted, exit 143)."""
    from pipeoffload.errors import ConfigError
    from pipeoffload.runtime.executor import PipelineError
    from pipeoffload.train.checkpoint import SaveError
    from pipeoffload.train.launch import Interrupted
    from pipeoffload.train.loop import DataError, NonFiniteError
    from pipeoffload.train.metrics import MetricsError

    return (ConfigError, PipelineError, PeerFailure, RankError, SaveError, DataError, NonFiniteError, MetricsError,
            Interrupted)


@contextlib.contextmanager
def doing(rank: int, what: str) -> Iterator[None]:
    """Name ``what`` rank ``rank`` was doing in an error of its own (``RankError``); the errors that say it
    themselves, and a ``SystemExit`` or ``KeyboardInterrupt``, pass as they are."""
    try:
        yield
    except _self_named():
        raise
    except Exception as exc:
        raise own_error(rank, what, exc) from exc


def is_peer_error(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(w in text for w in ("timed out", "timeout", "connection", "broken pipe", "peer"))


class Heartbeat:
    """A counter per global rank in the default store, bumped by a thread; ranks whose counter does
    not move over a few intervals are silent (stopped or dead)."""

    def __init__(self, rank: int, world: int, interval: float) -> None:
        from pipeoffload.runtime.comm import _default_store, _heartbeat

        self.rank, self.world, self.interval = rank, world, interval
        self._store = _default_store()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self._store is not None:
            self._thread = threading.Thread(target=_heartbeat, args=(self._store, self._key(rank), interval, self._stop),
                                            name="pipeoffload-rank-heartbeat", daemon=True)
            self._thread.start()

    @staticmethod
    def _key(rank: int) -> str:
        return f"pipeoffload/world/beat/{rank}"

    def silent(self) -> list[int]:
        if self._store is None:
            return []
        from pipeoffload.runtime.comm import unmoved_counters

        keys = [self._key(r) for r in range(self.world)]
        return [r for r in unmoved_counters(self._store, keys, self.interval) if r != self.rank]

    def close(self) -> None:
        """Stop beating and join the thread (no store call may be cut off by the group's destruction)."""
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=max(5.0, 4 * self.interval))


def coordinates(rank: int, pp: int, tp: int) -> tuple[int, int, int]:
    """(dp_index, pp_index, tp_index) of a global rank."""
    dp_index, rest = divmod(rank, pp * tp)
    pp_index, tp_index = divmod(rest, tp)
    return dp_index, pp_index, tp_index


def group_options(timeout: float) -> Any:
    """Process-group options of the default group's backend carrying ``timeout`` (seconds)."""
    backend = str(dist.get_backend())
    opts = dist.ProcessGroupNCCL.Options() if "nccl" in backend else \
        dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    opts._timeout = datetime.timedelta(seconds=timeout)
    return backend, opts


def build_context(dp: int, pp: int, tp: int, device: torch.device, timeout: float | None = None,
                  startup: float | None = None) -> RankContext:
    """The mesh over the initialised default process group (its size must be dp*pp*tp); with
    ``timeout`` every group of the mesh bounds its waits by it (else torch's default), by ``startup``
    instead until ``RankContext.started``."""
    from torch.distributed.device_mesh import init_device_mesh

    rank, world = dist.get_rank(), dist.get_world_size()
    if world != dp * pp * tp:
        raise RuntimeError(f"world size {world} != dp*pp*tp = {dp}*{pp}*{tp}")
    override: Any = None
    first = startup if startup is not None else timeout
    if first is not None:
        override = {name: group_options(first) for name in ("dp", "pp", "tp")}
    mesh = init_device_mesh(device.type, (dp, pp, tp), mesh_dim_names=("dp", "pp", "tp"),
                            backend_override=override)
    d, p, t = coordinates(rank, pp, tp)
    beat = Heartbeat(rank, world, min(1.0, max(0.05, (timeout or 120.0) / 20))) if world > 1 else None
    return RankContext(rank, world, device, dp, pp, tp, d, p, t, mesh, mesh["dp"].get_group(),
                       mesh["pp"].get_group(), mesh["tp"].get_group(), beat, timeout=timeout, startup=startup)
