"""The activation store on CPU: what it manages, that offload really releases memory, exact bytes."""
from __future__ import annotations

import gc

import pytest
import torch
from torch import nn

from pipeoffload.runtime.offload import ActivationStore, EntryState


def _store(*modules: nn.Module, min_bytes: int = 64) -> ActivationStore:
    return ActivationStore("cpu", [p for m in modules for p in m.parameters()], min_bytes=min_bytes)


def test_parameters_and_their_views_are_not_managed():
    lin = nn.Linear(32, 32)
    store = _store(lin)
    x = torch.randn(8, 32, requires_grad=True)
    with store.saving(0, 0):
        y = lin(x)  # addmm saves x and weight.t() (a view of the parameter, not an nn.Parameter)
    assert store.resident_bytes == x.untyped_storage().nbytes()
    assert store.slot_bytes(0, 0) == 8 * 32 * 4
    y.sum().backward()
    assert lin.weight.grad is not None


def test_views_of_one_storage_are_stored_once_and_tiny_tensors_stay():
    store = _store(min_bytes=1024)
    base = torch.randn(64, 16, requires_grad=True)
    tiny = torch.randn(4, requires_grad=True)
    with store.saving(0, 0):
        a = base[:32] * base[32:]  # mul saves both views of ``base``'s storage
        b = tiny * tiny
    assert store.resident_bytes == base.untyped_storage().nbytes()
    (a.sum() + b.sum()).backward()
    assert torch.equal(tiny.grad, 2 * tiny.detach())


def test_offload_releases_the_storage_and_reload_restores_it_exactly():
    store = _store()
    x = torch.randn(16, 16, requires_grad=True)
    with store.saving(1, 3):
        y = (x * 2).exp()  # exp saves its output: a tensor whose grad_fn saved it
        total = y.sum()
    expected_grad = torch.autograd.grad(total, x, retain_graph=True)[0]
    storage = y.untyped_storage()
    nbytes = storage.nbytes()
    store.offload(1, 3)
    assert storage.nbytes() == 0 and store.resident_bytes == 0 and store.host_bytes == nbytes
    store.reload(1, 3)
    assert storage.nbytes() == nbytes and store.resident_bytes == nbytes and store.host_bytes == 0
    grad = torch.autograd.grad(total, x)[0]
    assert torch.equal(grad, expected_grad)


def test_reload_keeping_the_host_copy_lets_the_second_offload_copy_nothing():
    """Both windows offloaded: RELOAD keeps the host copy, so OFFLOAD after I only releases the
    device memory (no new host buffer, no copy) and RELOAD before W brings back the same bytes."""
    store = _store()
    x = torch.randn(16, 16, requires_grad=True)
    with store.saving(0, 0):
        y = (x * 2).exp()
        total = y.sum()
    expected_grad = torch.autograd.grad(total, x, retain_graph=True)[0]
    storage = y.untyped_storage()
    nbytes = storage.nbytes()
    store.offload(0, 0)
    store.reload(0, 0, keep_host=True)
    store.poll()
    assert storage.nbytes() == nbytes and store.host_bytes == nbytes  # the host copy stays
    store.offload(0, 0)  # the I -> W window: released at once, no second host buffer
    assert storage.nbytes() == 0 and store.resident_bytes == 0 and store.host_bytes == nbytes
    store.reload(0, 0)
    store.poll()
    assert storage.nbytes() == nbytes and store.host_bytes == 0
    assert torch.equal(torch.autograd.grad(total, x)[0], expected_grad)


def test_unpack_while_offloaded_names_the_slot():
    store = _store()
    x = torch.randn(16, 16, requires_grad=True)
    with store.saving(2, 5):
        total = x.exp().sum()  # (reading an offloaded tensor's data is invalid: sum before offload)
    store.offload(2, 5)
    with pytest.raises(RuntimeError, match=r"\(2, 5\).*RELOAD"):
        total.backward()


def test_handles_form_no_reference_cycle():
    """Saved outputs (exp saves its own result) are freed by reference counting alone once the
    graph is dropped: the handle autograd keeps never holds the tensor whose grad_fn keeps it."""
    gc.disable()
    try:
        store = _store()
        x = torch.randn(16, 16, requires_grad=True)
        with store.saving(0, 0):
            y = x.exp()
        assert store.resident_bytes > 0
        del y  # no backward, no collector: the graph and its handles must go right now
        assert store.resident_bytes == 0
    finally:
        gc.enable()


def test_backward_frees_saved_tensors_as_it_goes():
    store = _store()
    x = torch.randn(16, 16, requires_grad=True)
    with store.saving(0, 0):
        total = x.exp().sum()
    total.backward()
    assert store.resident_bytes == 0  # autograd released what it saved; release() only forgets the slot
    store.release(0, 0)
    assert store.slots() == []


def test_a_storage_goes_as_soon_as_autograd_drops_it_not_at_the_next_store_call():
    """The store's own reference to a saved storage must not outlive autograd's: a backward frees each
    node's saved tensors as it runs, and holding them to its end made its allocations take fresh pages."""
    store = _store()
    x = torch.randn(16, 16, requires_grad=True)
    with store.saving(0, 0):
        total = (x.exp() * 3).sin().sum()  # exp saves its result, sin its input: two storages
    entries = list(store._entries.values())
    assert len(entries) == 2 and all(e.storage is not None for e in entries)
    total.backward()  # no store call until the assertions: nothing has been reaped yet
    assert [e.storage for e in entries] == [None, None]
    assert store.resident_bytes == 0 and not store._entries  # the accounting settles as before


def test_storage_shared_by_two_slots_leaves_only_when_both_are_offloaded():
    store = _store()
    h = torch.randn(16, 16, requires_grad=True)
    with store.saving(0, 0):
        a = h.exp()
    hand_off = a.detach().requires_grad_()
    with store.saving(1, 0):
        b = (hand_off * hand_off).sum()  # saves the same storage in a second slot
    shared = a.untyped_storage()
    store.offload(0, 0)
    assert shared.nbytes() > 0
    store.offload(1, 0)
    assert shared.nbytes() == 0
    store.reload(1, 0)
    store.reload(0, 0)
    b.backward()
    a.backward(hand_off.grad)
    assert h.grad is not None


def test_pinned_storage_is_freed_when_unpinned():
    store = _store()
    x = torch.randn(16, 16, requires_grad=True)
    with store.saving(0, 0):
        y = x.exp()
    assert store.pin(y)
    store.offload(0, 0)
    entry = next(iter(store._entries.values()))
    assert entry.state is EntryState.ON_HOST and y.untyped_storage().nbytes() > 0
    assert store.resident_bytes == entry.nbytes  # still on the device, still counted
    store.unpin(y)
    assert y.untyped_storage().nbytes() == 0 and store.resident_bytes == 0


def test_host_buffers_are_reused_across_steps():
    store = _store()
    for _ in range(3):
        x = torch.randn(32, 32, requires_grad=True)
        with store.saving(0, 0):
            y = x.exp()
        store.offload(0, 0)
        store.reload(0, 0)
        y.sum().backward()
        store.release(0, 0)
        store.finish()
    assert store.copier.pool.allocated_bytes == 32 * 32 * 4
    assert store.copier.stats.d2h_copies == 3 and store.copier.stats.h2d_copies == 3


def test_finish_reports_slots_never_released():
    store = _store()
    x = torch.randn(16, 16, requires_grad=True)
    with store.saving(4, 1):
        y = x.exp()
    with pytest.raises(RuntimeError, match=r"\(4, 1\)"):
        store.finish()
    del y


def test_peak_host_bytes_keeps_the_highest_host_bytes_until_reset():
    store = _store()
    xs = [torch.randn(16, 16, requires_grad=True) for _ in range(2)]
    totals = []
    for mb, x in enumerate(xs):
        with store.saving(0, mb):
            totals.append((x * 2).exp().sum())
    one = store.slot_bytes(0, 0)
    store.reset_peak()
    store.offload(0, 0)
    store.offload(0, 1)
    assert store.host_bytes == store.peak_host_bytes == 2 * one
    store.reload(0, 0)
    store.reload(0, 1)
    assert store.host_bytes == 0 and store.peak_host_bytes == 2 * one  # the peak outlives the reloads
    store.reset_peak()
    assert store.peak_host_bytes == 0
    for total in totals:
        total.backward()
