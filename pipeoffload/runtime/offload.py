"""The activation store: what autograd saves during a forward, kept per (stage, microbatch) slot,
and moved to host memory and back when the schedule says OFFLOAD and RELOAD.

Forwards (F, R) run inside ``store.saving(stage, mb)``, which installs ``saved_tensors_hooks``
while the store is ``active`` (else autograd keeps what it saves itself, at no cost: a rank that
neither offloads nor trims after I, in a step that does not measure memory, needs no store):

- pack returns a small handle, never the tensor: a handle that held a tensor with a ``grad_fn``
  that saved it would close a reference cycle (tensor -> node -> saved handle -> tensor) that is
  invisible to Python's collector and would never be freed. The handle holds a *detached* alias.
- parameters and buffers are excluded by storage identity: autograd saves views such as
  ``weight.t()`` that are not ``nn.Parameter`` objects but share the parameter's storage. Casts of a
  parameter (autocast's bf16 weights, cached for the whole step and shared by every microbatch) are
  excluded too, found through their autograd history.
- the unit moved is a *storage*: views sharing one storage are one entry, stored once. A storage
  may belong to several slots (a tensor a module keeps and every microbatch saves, such as a cache
  that is not a buffer); it leaves the device only when no slot that still counts as resident refers
  to it. A tensor handed to the next stage on the same rank is a copy (``PipelineRunner``), as a
  transfer between ranks is, so the two stages' slots never share it.
- storages smaller than ``min_bytes`` stay where they are and are not counted.

Offload copies a storage's bytes to a host buffer and, once the copy has completed (polled; never
earlier, the copy engine may still be reading), releases the device memory with
``storage.resize_(0)``: every tensor viewing it, autograd's aliases included, stays a valid object
and becomes usable again when reload resizes the storage back and copies the bytes in. Reload
allocates on the compute stream before the copy stream writes; unpack makes the compute stream wait
for the reload. ``resident_bytes`` counts device bytes of managed storages exactly: F allocates,
OFFLOAD frees at copy completion, RELOAD allocates at its start, release frees.

Storages still needed elsewhere (a pending send) are
*pinned*; an offloaded pinned storage is freed when its last pin is dropped. The runner completes a
slot's pending sends before it offloads or trims the slot (``PipelineRunner._settle_sends``), so a
send's pin never outlives the OFFLOAD that frees its storage.

The second offload window (OFFLOAD_W after I, RELOAD_W before W) is the same offload and reload of
the slot after ``trim`` left only what W needs. When the slot was offloaded before its I as well, its
reload keeps the host copy (``reload(..., keep_host=True)``): the bytes W needs are unchanged, so the
offload after I copies nothing and only releases the device memory.
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from enum import Enum
from functools import partial
from typing import Any

import torch

from pipeoffload.runtime.copier import Copier, make_copier

try:  # torch built without distributed support has no DTensor, hence no sharded tensors to unwrap
    from torch.distributed._functional_collectives import AsyncCollectiveTensor as _AsyncCollectiveTensor
    from torch.distributed.tensor import DTensor as _DTensor
except ImportError:  # pragma: no cover
    _DTensor = None  # type: ignore[assignment,misc]
    _AsyncCollectiveTensor = None  # type: ignore[assignment,misc]

log = logging.getLogger(__name__)

Slot = tuple[int, int]  # (stage, microbatch)
_UNMANAGED = contextlib.nullcontext()  # ``saving`` while the store is inactive: autograd saves as usual


_VIEW_NODES = frozenset({"TBackward0", "TransposeBackward0", "ViewBackward0", "UnsafeViewBackward0",
                         "PermuteBackward0", "ExpandBackward0", "SliceBackward0", "SelectBackward0",
                         "UnsqueezeBackward0", "SqueezeBackward0", "AsStridedBackward0", "AliasBackward0"})


def _cast_of_parameter(t: torch.Tensor, parameters: set[int] | frozenset[int]) -> bool:
    """Whether ``t`` is (a view of) autocast's cached low-precision copy of one of the ``parameters``
    (their storages' data pointers). Autocast caches that copy for the whole step and hands it to
    every microbatch's forward, so it belongs to no slot: offloading it with one microbatch would
    free what the next one is about to use. Asked only under autocast with its cache on; anything else
    computed from a parameter is made anew per microbatch and stays managed."""
    fn = t.grad_fn
    while fn is not None and type(fn).__name__ in _VIEW_NODES:
        fn = fn.next_functions[0][0]
    if fn is None or type(fn).__name__ != "ToCopyBackward0":
        return False
    source = fn.next_functions[0][0]
    if source is None or type(source).__name__ != "AccumulateGrad":
        return False
    return local_tensor(getattr(source, "variable")).untyped_storage().data_ptr() in parameters  # noqa: B009 - untyped


def _autocast_on(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except (TypeError, RuntimeError):  # a device type autocast does not know
        return False


class EntryState(Enum):
    RESIDENT = "resident"
    TO_HOST = "to_host"  # copy to host in flight; the device copy is still allocated
    ON_HOST = "on_host"  # device memory released
    TO_DEVICE = "to_device"  # device memory allocated, copy back in flight
    DROPPED = "dropped"  # released after I: only nodes W never runs refer to it


_RESIDENT = EntryState.RESIDENT


class _Entry:
    """One device storage saved by one or more slots."""

    __slots__ = ("ident", "storage", "nbytes", "slots", "claims", "handles", "state", "host", "token", "pins",
                 "keep_host")

    def __init__(self, ident: int, storage: torch.UntypedStorage, nbytes: int) -> None:
        self.ident = ident
        # None once autograd dropped the last handle of a resident storage (``_handle_dropped``)
        self.storage: torch.UntypedStorage | None = storage
        self.nbytes = nbytes
        self.handles = 0  # handles autograd still holds; at 0 nothing can use the storage any more
        self.slots: set[Slot] = set()
        self.claims = 0  # slots referring to it that are currently resident
        self.state = EntryState.RESIDENT
        self.host: torch.Tensor | None = None
        self.token: Any = None
        self.pins = 0
        self.keep_host = False  # reloaded with its host copy kept (the I -> W window offloads it again)


class _Handle:
    """What autograd keeps instead of a saved tensor: the entry and a detached alias. When autograd
    drops it (a backward released the node, or the graph died) the store is told, so the accounting
    follows what autograd really still holds."""

    __slots__ = ("store", "entry", "view")

    def __init__(self, store: ActivationStore, entry: _Entry, view: torch.Tensor) -> None:
        self.store = store
        self.entry = entry
        self.view = view

    def __del__(self) -> None:
        try:
            self.store._handle_dropped(self.entry)
        except Exception:  # noqa: BLE001 - never raise from a finaliser (e.g. at interpreter exit)
            pass


class _SlotRecord:
    __slots__ = ("entries", "resident", "nbytes")

    def __init__(self) -> None:
        self.entries: dict[int, _Entry] = {}
        self.resident = True
        self.nbytes = 0  # bytes of ``entries``


def _normalise(device: torch.device) -> torch.device:
    """``cuda`` -> ``cuda:<current>``, so that tensors' devices compare equal to it."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The tensor holding the data: a DTensor's local shard (``to_local()``), else the tensor itself.

    Without grad mode ``to_local()`` hands back the shard itself, not a differentiable view: writes
    through it (gradient averaging, clipping) land in the DTensor, and a pack hook adds no autograd node.

    A shard that a redistribution left as an ``AsyncCollectiveTensor`` (the result of an all-gather
    that was not yet waited on, e.g. the sequence-parallel all-gather of a one-sequence microbatch,
    whose gathered buffer needs no reordering) is a wrapper without storage of its own (its
    ``untyped_storage()`` is invalid): the collective is waited for and its result returned, the
    tensor whose storage holds the bytes."""
    if _DTensor is not None and isinstance(t, _DTensor):
        with torch.no_grad():
            t = t.to_local()
    if _AsyncCollectiveTensor is not None and isinstance(t, _AsyncCollectiveTensor):
        t.trigger_wait()  # the collective writing the buffer has completed (a no-op once waited)
        return t.elem
    return t



def _live(entry: _Entry) -> torch.UntypedStorage:
    """The entry's storage; only entries whose last handle is gone (settled by ``_reap`` before any
    other use) have none."""
    if entry.storage is None:
        raise RuntimeError(f"internal error: a storage of slot(s) {sorted(entry.slots)} was used after autograd freed it")
    return entry.storage


def _byte_view(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


class ActivationStore:
    """Saved activations of one rank's stages, per (stage, microbatch) slot. See the module doc."""

    def __init__(
        self,
        device: torch.device | str,
        exclude: Iterable[torch.Tensor] = (),
        *,
        min_bytes: int = 4096,
        copier: Copier | None = None,
    ) -> None:
        self.device = _normalise(torch.device(device))
        self.min_bytes = min_bytes
        self.copier = copier if copier is not None else make_copier(self.device)
        self._excluded: set[int] = set()
        self.exclude(exclude)
        self._slots: dict[Slot, _SlotRecord] = {}
        self._entries: dict[int, _Entry] = {}
        self._copying: list[_Entry] = []
        self._pinned_free: list[_Entry] = []
        self._dead: list[_Entry] = []  # entries whose last handle autograd dropped, to be reaped
        self._resident = 0
        self.peak_bytes = 0
        self.host_bytes = 0  # host bytes of offloaded storages now (buffers held from OFFLOAD to reload/release)
        self.peak_host_bytes = 0  # highest ``host_bytes`` since ``reset_peak``
        # False: forwards save nothing here (no hooks). Set only between steps, when nothing is held.
        self.active = True

    # ---- configuration ------------------------------------------------------------------------
    def exclude(self, tensors: Iterable[torch.Tensor], *, replace: bool = False) -> None:
        """Never manage storages of these tensors (parameters, buffers): they are not activations.
        ``replace``: these instead of the ones excluded so far (storages that were reallocated)."""
        if replace:
            self._excluded = set()
        for t in tensors:
            t = local_tensor(t)
            if t.device.type != "meta":
                self._excluded.add(t.untyped_storage().data_ptr())

    # ---- accounting -----------------------------------------------------------------------------
    @property
    def resident_bytes(self) -> int:
        """Device bytes of managed storages now (frees autograd made since the last call included)."""
        self._reap()
        return self._resident

    def _alloc(self, nbytes: int) -> None:
        self._resident += nbytes
        if self._resident > self.peak_bytes:
            self.peak_bytes = self._resident

    def reset_peak(self) -> None:
        """Start a new measurement window (a step): both peaks restart from what is held now."""
        self.peak_bytes = self._resident
        self.peak_host_bytes = self.host_bytes

    def slot_bytes(self, stage: int, microbatch: int) -> int:
        """Device bytes of the storages a slot saved (shared storages counted in full)."""
        self._reap()
        rec = self._slots.get((stage, microbatch))
        return 0 if rec is None else rec.nbytes

    def slots(self) -> list[Slot]:
        return list(self._slots)

    # ---- saving (forward) -----------------------------------------------------------------------
    def saving(self, stage: int, microbatch: int) -> contextlib.AbstractContextManager:
        """Run a forward inside this to have what it saves managed under slot (stage, microbatch)
        (while the store is ``active``; else a context that does nothing)."""
        if not self.active:
            return _UNMANAGED
        key = (stage, microbatch)
        rec = self._slots.get(key)
        if rec is None:
            rec = self._slots[key] = _SlotRecord()

        # read here, outside any op: while an op runs (and packs), autocast reports itself off
        cached_casts = torch.is_autocast_cache_enabled() and _autocast_on(self.device.type)
        return torch.autograd.graph.saved_tensors_hooks(partial(self._pack, key, rec, cached_casts), self._unpack)

    def _pack(self, key: Slot, rec: _SlotRecord, cached_casts: bool, t: torch.Tensor) -> Any:
        # Called for every tensor a forward saves: the common case (a plain tensor, a new storage of
        # this slot) takes as few Python calls as it can.
        if self._dead:  # settle frees first, so that the peak never counts memory already gone
            self._reap()
        local = t if t.__class__ is torch.Tensor else local_tensor(t)  # a DTensor: manage its local shard
        if local.layout != torch.strided:  # e.g. sparse: no storage of its own to manage
            return t.detach()
        storage = local.untyped_storage()
        nbytes = storage.nbytes()
        if (nbytes < self.min_bytes or storage.device != self.device
                or storage.data_ptr() in self._excluded or not storage.resizable()
                or (cached_casts and _cast_of_parameter(t, self._excluded))):
            return t.detach()
        ident = storage._cdata
        entry = rec.entries.get(ident)
        if entry is not None and entry.storage is None:  # freed by a finaliser since the reap: not this storage
            self._reap()
            entry = rec.entries.get(ident)
        if entry is None:  # the first save of this storage by this slot
            entry = self._entry_of(ident)
            if entry is None:
                entry = self._entries[ident] = _Entry(ident, storage, nbytes)
                self._alloc(nbytes)
            rec.entries[ident] = entry
            rec.nbytes += nbytes
            entry.slots.add(key)
            entry.claims += 1
            if entry.state is not _RESIDENT:
                self._reclaim(entry)
        entry.handles += 1
        return _Handle(self, entry, t.detach())

    def _reclaim(self, entry: _Entry) -> None:
        """A slot saves a storage that other slots' OFFLOADs sent away (a tensor a module keeps across
        microbatches): it is resident again, for the new slot."""
        if entry.state is EntryState.TO_HOST:
            self.copier.synchronize(entry.token)
            self._copying.remove(entry)
        elif entry.state is EntryState.ON_HOST and entry in self._pinned_free:
            self._pinned_free.remove(entry)
        else:  # its device memory is gone: nothing a forward could have just used
            raise RuntimeError(f"a forward saved a storage of slot(s) {sorted(entry.slots)} (stage, microbatch) "
                               f"that is {entry.state.value}")
        self._drop_host(entry)
        entry.state = EntryState.RESIDENT

    def _unpack(self, handle: Any) -> torch.Tensor:
        if handle.__class__ is not _Handle:
            return handle  # type: ignore[no-any-return]
        entry = handle.entry
        if entry.state is _RESIDENT:  # the common case first
            return handle.view
        if entry.state is EntryState.TO_DEVICE:
            self.copier.wait_on_compute(entry.token)
        elif entry.state is EntryState.ON_HOST:
            raise RuntimeError(
                f"a saved activation of slot(s) {sorted(entry.slots)} (stage, microbatch) is used while offloaded: "
                "the schedule needs a RELOAD of that slot before its backward"
            )
        elif entry.state is EntryState.DROPPED:
            raise RuntimeError(
                f"a saved activation of slot(s) {sorted(entry.slots)} (stage, microbatch) was released after I as "
                "unneeded by W, yet W used it; run the stage with trim_after_input=False and report this model"
            )
        return handle.view

    # ---- offload / reload -------------------------------------------------------------------------
    def offload(self, stage: int, microbatch: int) -> None:
        """Start copying the slot's storages to host; each is released when its copy completes."""
        self._reap()
        rec = self._record(stage, microbatch)
        if not rec.resident:
            raise RuntimeError(f"OFFLOAD of stage {stage}, microbatch {microbatch}: already offloaded")
        rec.resident = False
        for entry in list(rec.entries.values()):
            entry.claims -= 1
            if entry.claims == 0 and entry.state is EntryState.TO_DEVICE and entry.host is not None:
                self.copier.synchronize(entry.token)  # its I already waited for it: complete
                self._copying.remove(entry)
                entry.state = EntryState.RESIDENT
            if entry.claims == 0 and entry.state is EntryState.RESIDENT and entry.host is not None:
                entry.keep_host = False  # the host still holds these bytes (kept at reload): no copy
                self._release_device(entry)
            elif entry.claims == 0 and entry.state is EntryState.RESIDENT:
                entry.host = self.copier.pool.acquire(entry.nbytes)
                self.host_bytes += entry.nbytes
                if self.host_bytes > self.peak_host_bytes:
                    self.peak_host_bytes = self.host_bytes
                entry.token = self.copier.to_host(_byte_view(_live(entry)), entry.host)
                entry.state = EntryState.TO_HOST
                self._copying.append(entry)
        self.poll()

    def reload(self, stage: int, microbatch: int, *, keep_host: bool = False) -> None:
        """Allocate device memory for the slot's offloaded storages and start copying them back;
        ``keep_host``: keep the host copies too, for an offload after I that then copies nothing."""
        self._reap()
        rec = self._record(stage, microbatch)
        if rec.resident:
            raise RuntimeError(f"RELOAD of stage {stage}, microbatch {microbatch}: it was not offloaded")
        rec.resident = True
        for entry in list(rec.entries.values()):
            entry.claims += 1
            entry.keep_host = keep_host
            if entry.state is EntryState.ON_HOST and entry in self._pinned_free:  # never left the device
                self._pinned_free.remove(entry)
                if not keep_host:
                    self._drop_host(entry)
                entry.state = EntryState.RESIDENT
            elif entry.state is EntryState.ON_HOST:
                storage = _live(entry)
                storage.resize_(entry.nbytes)
                self._alloc(entry.nbytes)
                entry.token = self.copier.to_device(entry.host, _byte_view(storage))  # type: ignore[arg-type]
                entry.state = EntryState.TO_DEVICE
                self._copying.append(entry)
            elif entry.state is EntryState.TO_HOST:  # reloaded before the device copy was released
                self.copier.synchronize(entry.token)
                self._copying.remove(entry)
                if keep_host:
                    entry.token = None
                else:
                    self._drop_host(entry)
                entry.state = EntryState.RESIDENT
        self.poll()

    def await_offload(self, stage: int, microbatch: int) -> None:
        """WAIT: block until the slot's offload copies have completed, then release their device memory.

        The host waits for each copy (``Copier.synchronize``: the copy's CUDA event on GPU, nothing on
        CPU where copies complete when issued) rather than only making the compute stream wait for it:
        the memory is freed here, on the host, so it must be free before the next forward allocates,
        which is what the schedule's WAIT promises (the simulator frees it at the copy's end)."""
        self._reap()
        rec = self._record(stage, microbatch)
        for entry in rec.entries.values():  # after its RELOAD nothing is TO_HOST: the reload waited already
            if entry.state is EntryState.TO_HOST:
                self.copier.synchronize(entry.token)
        self.poll()

    def poll(self) -> None:
        """Advance copies that completed: release offloaded device memory, recycle host buffers."""
        self._reap()
        if self._copying:
            still = []
            for entry in list(self._copying):
                if not self.copier.done(entry.token):
                    still.append(entry)
                elif entry.state is EntryState.TO_HOST:
                    self._release_device(entry)
                else:  # TO_DEVICE
                    entry.state = EntryState.RESIDENT
                    if entry.keep_host:
                        entry.token = None
                    else:
                        self._drop_host(entry)
            self._copying = still

    def _release_device(self, entry: _Entry) -> None:
        entry.state = EntryState.ON_HOST
        if entry.pins:
            self._pinned_free.append(entry)  # freed when its last pin goes
            return
        _live(entry).resize_(0)
        self._resident -= entry.nbytes

    def _drop_host(self, entry: _Entry) -> None:
        if entry.host is not None:
            self.copier.pool.release(entry.host)
            self.host_bytes -= entry.nbytes
            entry.host = None
        entry.token = None

    # ---- after I -------------------------------------------------------------------------------
    def trim(self, stage: int, microbatch: int, keep: Iterable[Any]) -> int:
        """Release the slot's storages that none of the handles in ``keep`` refers to (after I:
        ``keep`` is what the nodes W will run saved). Storages shared with another slot, pinned or
        not resident are left alone. Returns the bytes released."""
        self._reap()
        key = (stage, microbatch)
        rec = self._slots.get(key)
        if rec is None:
            return 0
        kept = {h.entry.ident for h in keep if isinstance(h, _Handle)}
        freed = 0
        for ident, entry in list(rec.entries.items()):
            if ident in kept or entry.pins or entry.slots != {key} or entry.state is not EntryState.RESIDENT:
                continue
            del rec.entries[ident]
            rec.nbytes -= entry.nbytes
            del self._entries[ident]
            entry.state = EntryState.DROPPED
            self._drop_host(entry)  # a host copy kept for W: W does not need these bytes
            _live(entry).resize_(0)
            self._resident -= entry.nbytes
            freed += entry.nbytes
        return freed

    def _entry_of(self, ident: int) -> _Entry | None:
        """The entry of the storage at address ``ident`` now. An entry whose storage autograd has freed
        (``_handle_dropped``) may have left its address to a new storage: it is settled first."""
        if self._dead:
            self._reap()
        entry = self._entries.get(ident)
        if entry is not None and entry.storage is None:  # freed by a finaliser since the reap above
            self._reap()
            entry = self._entries.get(ident)
        return entry

    # ---- pins -----------------------------------------------------------------------------------
    def pin(self, tensor: torch.Tensor) -> bool:
        """Keep ``tensor``'s storage on the device even if its slot is offloaded; True if managed."""
        if not self._entries:
            return False
        entry = self._entry_of(tensor.untyped_storage()._cdata)
        if entry is None:
            return False
        entry.pins += 1
        return True

    def holds(self, tensor: torch.Tensor, stage: int, microbatch: int) -> bool:
        """Whether ``tensor``'s storage is one that slot (stage, microbatch) saved."""
        entry = self._entry_of(tensor.untyped_storage()._cdata) if self._entries else None
        return entry is not None and (stage, microbatch) in entry.slots

    def unpin(self, tensor: torch.Tensor) -> None:
        entry = self._entry_of(tensor.untyped_storage()._cdata)
        if entry is None or entry.pins == 0:
            return
        entry.pins -= 1
        if entry.pins == 0 and entry in self._pinned_free:
            self._pinned_free.remove(entry)
            _live(entry).resize_(0)
            self._resident -= entry.nbytes

    # ---- release ----------------------------------------------------------------------------------
    def release(self, stage: int, microbatch: int) -> None:
        """Forget a slot after the backward that last needs it (B, or W after I). Storages no other
        slot refers to stop being counted; the memory goes with the last reference to it."""
        self._reap()
        key = (stage, microbatch)
        rec = self._slots.pop(key, None)
        if rec is None:
            return
        for entry in list(rec.entries.values()):
            entry.slots.discard(key)
            if rec.resident:
                entry.claims -= 1
            if not entry.slots:
                self._forget(entry)

    def _handle_dropped(self, entry: _Entry) -> None:
        """Called from a handle's finaliser, which may run anywhere (inside another store method
        when the collector strikes, or on autograd's device thread): only note it; ``_reap``
        settles it at the next store call."""
        entry.handles -= 1
        if entry.handles == 0:
            self._dead.append(entry)
            if entry.state is _RESIDENT or entry.state is EntryState.DROPPED:
                # Nothing can use the bytes any more: let them go now, as autograd would without the
                # store, not at the next store call. A backward frees each saved tensor once its node
                # has run; holding them all to its end made its own allocations take fresh pages
                # (hundreds of page faults per microbatch on CPU). The accounting still settles in ``_reap``.
                entry.storage = None

    def _reap(self) -> None:
        """Forget entries autograd no longer refers to."""
        while self._dead:
            entry = self._dead.pop()
            if entry.handles or self._entries.get(entry.ident) is not entry:
                continue
            for key in entry.slots:
                rec = self._slots.get(key)
                if rec is not None and rec.entries.pop(entry.ident, None) is not None:
                    rec.nbytes -= entry.nbytes
            self._forget(entry)

    def _forget(self, entry: _Entry) -> None:
        """Stop managing ``entry``: settle its copies, its accounting and its host buffer."""
        if self._entries.get(entry.ident) is entry:
            del self._entries[entry.ident]
        counted = entry.state is not EntryState.ON_HOST or entry in self._pinned_free
        if entry.token is not None:
            self.copier.synchronize(entry.token)
        if entry in self._copying:
            self._copying.remove(entry)
        if entry in self._pinned_free:
            self._pinned_free.remove(entry)
        if counted:
            self._resident -= entry.nbytes
        self._drop_host(entry)
        entry.slots.clear()

    def _record(self, stage: int, microbatch: int) -> _SlotRecord:
        rec = self._slots.get((stage, microbatch))
        if rec is None:
            rec = self._slots[(stage, microbatch)] = _SlotRecord()
        return rec

    def clear(self) -> None:
        """Forget everything (after a failed step): settle copies, return host buffers."""
        self._dead.clear()
        for entry in list(self._entries.values()):
            self._forget(entry)
        self._slots.clear()
        self._copying.clear()
        self._pinned_free.clear()
        self._resident = 0

    def finish(self) -> None:
        """End of step: complete outstanding copies; every slot must have been released."""
        self._reap()
        for entry in list(self._copying):
            self.copier.synchronize(entry.token)
        self.poll()
        if self._slots:
            leaked = sorted(self._slots)
            self._slots.clear()
            self._entries.clear()
            self._resident = 0
            raise RuntimeError(f"activation slots {leaked} (stage, microbatch) were never released by a backward")
