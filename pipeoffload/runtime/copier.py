"""Device<->host copy engines and the reusable host buffer pool behind the activation store.

Two engines share one small interface so that the store's state machine is the same everywhere:

- ``SyncCopier`` (CPU, and any device without streams): copies happen when issued; a token is
  always complete. Used by tests and laptops: the "device" copy is really released afterwards.
- ``CudaCopier``: copies run on dedicated stream(s) (one shared by both directions by default,
  like one copy engine per GPU), completion is tracked with events, and host buffers are pinned.

A token is whatever the engine needs to ask "is this copy done?" and to make the compute stream
wait for it. Bytes and time per direction are accumulated to report achieved bandwidth.
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Protocol

import torch


@dataclass
class CopyStats:
    """Bytes and seconds spent in each direction (seconds measured on the copy stream on CUDA)."""

    d2h_bytes: int = 0
    h2d_bytes: int = 0
    d2h_seconds: float = 0.0
    h2d_seconds: float = 0.0
    d2h_copies: int = 0
    h2d_copies: int = 0

    def gbps(self, direction: str) -> float:
        nbytes, seconds = (self.d2h_bytes, self.d2h_seconds) if direction == "d2h" else (self.h2d_bytes, self.h2d_seconds)
        return nbytes / seconds / 1e9 if seconds > 0 else float("nan")

    def as_dict(self) -> dict:
        return {
            "d2h_bytes": self.d2h_bytes, "h2d_bytes": self.h2d_bytes, "d2h_copies": self.d2h_copies,
            "h2d_copies": self.h2d_copies, "d2h_gbps": self.gbps("d2h"), "h2d_gbps": self.gbps("h2d"),
        }


class HostPool:
    """Host byte buffers kept across steps and reused by exact size (pinned when copying from CUDA).

    Activation sizes repeat every microbatch and every step, so exact-size free lists hit almost
    always; pinning is expensive, which is why buffers are never returned to the OS during a run.
    """

    def __init__(self, pin: bool) -> None:
        self.pin = pin
        self._free: dict[int, list[torch.Tensor]] = defaultdict(list)
        self.allocated_bytes = 0
        self.in_use_bytes = 0
        self.peak_in_use_bytes = 0

    def acquire(self, nbytes: int) -> torch.Tensor:
        free = self._free[nbytes]
        if free:
            buf = free.pop()
        else:
            buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin)
            self.allocated_bytes += nbytes
        self.in_use_bytes += nbytes
        self.peak_in_use_bytes = max(self.peak_in_use_bytes, self.in_use_bytes)
        return buf

    def release(self, buf: torch.Tensor) -> None:
        self.in_use_bytes -= buf.numel()
        self._free[buf.numel()].append(buf)


class Copier(Protocol):
    """What the activation store needs from a copy engine: start a copy in either direction and get a
    token; ask whether it is done, make compute wait for it, or block on it. Host buffers come from
    ``pool``; bytes and seconds per direction accumulate in ``stats``."""

    pool: HostPool
    stats: CopyStats

    def to_host(self, device_bytes: torch.Tensor, host: torch.Tensor) -> Any:
        """Start copying ``device_bytes`` into ``host``; return a token for the copy."""

    def to_device(self, host: torch.Tensor, device_bytes: torch.Tensor) -> Any:
        """Start copying ``host`` into ``device_bytes``; return a token for the copy."""

    def done(self, token: Any) -> bool:
        """Whether the copy has completed (never blocks)."""

    def wait_on_compute(self, token: Any) -> None:
        """Make later compute wait for the copy, without blocking the host."""

    def synchronize(self, token: Any) -> None:
        """Block the host until the copy is complete."""


class SyncCopier:
    """Copies complete when issued. Tokens are ``None``."""

    def __init__(self) -> None:
        self.pool = HostPool(pin=False)
        self.stats = CopyStats()

    def to_host(self, device_bytes: torch.Tensor, host: torch.Tensor) -> Any:
        start = time.perf_counter()
        host.copy_(device_bytes)
        self.stats.d2h_seconds += time.perf_counter() - start
        self.stats.d2h_bytes += host.numel()
        self.stats.d2h_copies += 1
        return None

    def to_device(self, host: torch.Tensor, device_bytes: torch.Tensor) -> Any:
        start = time.perf_counter()
        device_bytes.copy_(host)
        self.stats.h2d_seconds += time.perf_counter() - start
        self.stats.h2d_bytes += host.numel()
        self.stats.h2d_copies += 1
        return None

    def done(self, token: Any) -> bool:
        return True

    def wait_on_compute(self, token: Any) -> None:
        """Make the compute stream wait for the copy (nothing to do: it already happened)."""

    def synchronize(self, token: Any) -> None:
        """Block the host until the copy is complete."""


class _CudaToken:
    __slots__ = ("done_event", "start_event", "nbytes", "direction", "counted")

    def __init__(self, done_event: Any, start_event: Any, nbytes: int, direction: str) -> None:
        self.done_event = done_event
        self.start_event = start_event
        self.nbytes = nbytes
        self.direction = direction
        self.counted = False


class CudaCopier:
    """Copies on dedicated CUDA stream(s), ordered after the compute stream, tracked by events.

    ``separate_streams=False`` (default) serialises D2H and H2D on one stream, as one copy engine
    does; ``True`` gives each direction its own stream. ``timing=True`` records start events too, so
    achieved GB/s can be reported (a small cost per copy).
    """

    def __init__(self, device: torch.device, separate_streams: bool = False, timing: bool = True) -> None:
        self.device = device
        self.pool = HostPool(pin=True)
        self.stats = CopyStats()
        self.timing = timing
        self.d2h_stream = torch.cuda.Stream(device=device)
        self.h2d_stream = torch.cuda.Stream(device=device) if separate_streams else self.d2h_stream

    def _issue(self, stream: Any, dst: torch.Tensor, src: torch.Tensor, direction: str) -> _CudaToken:
        compute = torch.cuda.current_stream(self.device)
        # The copy must see the values the compute stream produced, and (for H2D) the allocation
        # the compute stream made for its destination: order the copy stream after compute.
        stream.wait_stream(compute)
        start = torch.cuda.Event(enable_timing=True) if self.timing else None
        done = torch.cuda.Event(enable_timing=self.timing)
        with torch.cuda.stream(stream):
            if start is not None:
                start.record(stream)
            dst.copy_(src, non_blocking=True)
            done.record(stream)
        return _CudaToken(done, start, src.numel(), direction)

    def to_host(self, device_bytes: torch.Tensor, host: torch.Tensor) -> _CudaToken:
        return self._issue(self.d2h_stream, host, device_bytes, "d2h")

    def to_device(self, host: torch.Tensor, device_bytes: torch.Tensor) -> _CudaToken:
        return self._issue(self.h2d_stream, device_bytes, host, "h2d")

    def _count(self, token: _CudaToken) -> None:
        if token.counted:
            return
        token.counted = True
        seconds = token.start_event.elapsed_time(token.done_event) / 1e3 if token.start_event is not None else 0.0
        if token.direction == "d2h":
            self.stats.d2h_bytes += token.nbytes
            self.stats.d2h_seconds += seconds
            self.stats.d2h_copies += 1
        else:
            self.stats.h2d_bytes += token.nbytes
            self.stats.h2d_seconds += seconds
            self.stats.h2d_copies += 1

    def done(self, token: _CudaToken | None) -> bool:
        if token is None:
            return True
        finished = bool(token.done_event.query())
        if finished:
            self._count(token)
        return finished

    def wait_on_compute(self, token: _CudaToken | None) -> None:
        if token is not None:
            torch.cuda.current_stream(self.device).wait_event(token.done_event)

    def synchronize(self, token: _CudaToken | None) -> None:
        if token is not None:
            token.done_event.synchronize()
            self._count(token)


def make_copier(device: torch.device, **options: Any) -> Copier:
    """The copy engine for ``device``: CUDA streams on GPUs, synchronous copies elsewhere."""
    if device.type == "cuda":
        return CudaCopier(device, **options)
    return SyncCopier()
