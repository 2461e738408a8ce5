"""What crosses a stage boundary: specs of value tuples, and inferring them without running compute.

A stage takes and returns a tuple of values, which may nest lists, tuples and dicts (flattened with
``torch.utils._pytree``). Tensor leaves travel point to point; any other leaf (ints, ``None``,
strings) is a *constant* of the boundary, known from the spec and never sent. A receiver
must allocate buffers before data arrives, so every rank needs the specs of the boundaries it
touches before the first transfer. They are inferred once, at the first step, in stage order, each
by the stage's owner and broadcast: the stage is probed once with placeholder inputs (eval mode, no
saved activations, random-number state restored), or run on the ``meta`` device if that fails.
They can also be declared.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.func import functional_call
from torch.utils._pytree import (
    TreeSpec,
    tree_flatten,
    tree_structure,
    tree_unflatten,
    treespec_dumps,
    treespec_loads,
)

from pipeoffload.errors import ConfigError


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool

    def empty(self, device: torch.device) -> torch.Tensor:
        return torch.empty(self.shape, dtype=self.dtype, device=device)


@dataclass(frozen=True)
class Const:
    value: Any


Leaf = Any  # TensorSpec | Const


@dataclass(frozen=True)
class Spec:
    """A boundary: the spec of each leaf of the flattened value tuple, and the tuple's structure."""

    leaves: tuple[Leaf, ...]
    tree: TreeSpec

    @staticmethod
    def flat(leaves: Sequence[Leaf]) -> Spec:
        """A plain tuple of leaves (no nesting): what users declare with ``output_specs``."""
        return Spec(tuple(leaves), tree_structure(tuple(range(len(leaves)))))

    def build(self, leaves: Sequence[Any]) -> tuple:
        """The value tuple with ``leaves`` in place of the spec's leaves."""
        tree = self.tree
        if tree.type is tuple and tree.num_nodes == tree.num_leaves + 1:  # a flat tuple: no pytree walk
            return tuple(leaves)
        return tree_unflatten(list(leaves), tree)  # type: ignore[no-any-return]

    def __reduce__(self) -> tuple:
        # Specs are broadcast between ranks: pickle the structure as JSON where pytree can (pickling
        # a TreeSpec object itself warns about deprecated leaf classes on unpickling).
        try:
            return (_spec_from_json, (self.leaves, treespec_dumps(self.tree)))
        except Exception:  # noqa: BLE001 - e.g. unregistered namedtuples: pickle the object
            return (Spec, (self.leaves, self.tree))


def _spec_from_json(leaves: tuple, tree: str) -> Spec:
    return Spec(leaves, treespec_loads(tree))


def as_spec(spec: Any) -> Spec:
    """Accept a ``Spec`` or a plain tuple of ``TensorSpec``/``Const`` (declared by a user)."""
    return spec if isinstance(spec, Spec) else Spec.flat(as_tuple(spec))


def as_tuple(values: Any) -> tuple:
    return values if isinstance(values, tuple) else (values,)


_SCALARS = (int, float, bool, str, type(None))


def flatten(values: Any) -> tuple[list[Any], TreeSpec]:
    """Leaves and structure of a stage's value tuple (a single value counts as a 1-tuple). A flat
    tuple of plain tensors and scalars (what most stages pass) skips the pytree walk, which costs
    more than the rest of a small action's bookkeeping."""
    values = as_tuple(values)
    if all(type(v) is torch.Tensor or type(v) in _SCALARS for v in values):
        return list(values), _flat_tree(len(values))
    return tree_flatten(values)


@functools.lru_cache(maxsize=32)
def _flat_tree(n: int) -> TreeSpec:
    """The structure of a flat ``n``-tuple of leaves (what ``tree_flatten`` gives for one)."""
    return tree_structure(tuple(range(n)))


def _leaf_spec(v: Any) -> Leaf:
    if isinstance(v, torch.Tensor):
        grad = v.requires_grad and (v.is_floating_point() or v.is_complex())
        return TensorSpec(tuple(v.shape), v.dtype, grad)
    attrs = getattr(v, "__dict__", None)
    if isinstance(attrs, dict) and any(isinstance(x, torch.Tensor) for x in attrs.values()):
        raise ConfigError(
            f"a stage boundary value of type {type(v).__name__} holds tensors, but only tuples, lists, dicts and "
            "namedtuples are looked into (anything else would be a constant, never sent); pass its tensors in "
            "one of those, or register the type with torch.utils._pytree.register_pytree_node"
        )
    return Const(v)


def spec_of(values: Any) -> Spec:
    leaves, tree = flatten(values)
    return Spec(tuple(_leaf_spec(v) for v in leaves), tree)


def tensor_specs(spec: Spec) -> list[TensorSpec]:
    return [s for s in spec.leaves if isinstance(s, TensorSpec)]


def grad_specs(spec: Spec) -> list[TensorSpec]:
    return [s for s in spec.leaves if isinstance(s, TensorSpec) and s.requires_grad]


def check_values(leaves: Sequence[Any], tree: TreeSpec, spec: Spec, where: str) -> None:
    """Raise ``ConfigError`` if flattened values no longer match the boundary's spec (shapes are fixed)."""
    if tree != spec.tree:
        raise ConfigError(
            f"{where}: the values are structured as {_describe(tree)} but the pipeline was set up for "
            f"{_describe(spec.tree)} at the first step; keep the structure of stage outputs fixed"
        )
    for i, (v, s) in enumerate(zip(leaves, spec.leaves)):
        if isinstance(s, TensorSpec):
            if not isinstance(v, torch.Tensor) or tuple(v.shape) != s.shape or v.dtype != s.dtype:
                got = f"{tuple(v.shape)} {v.dtype}" if isinstance(v, torch.Tensor) else repr(v)
                raise ConfigError(
                    f"{where}: value {i} is {got}, expected {s.shape} {s.dtype}; boundary shapes are fixed "
                    "at the first step: keep the batch size and sequence length constant"
                )
        elif isinstance(v, torch.Tensor) or not _same_const(v, s.value):
            raise ConfigError(
                f"{where}: value {i} is {v!r}, expected the constant {s.value!r} seen at the first step; "
                "non-tensor stage outputs must not change between steps"
            )


def _same_const(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - e.g. arrays: compare by identity
        return a is b


def _describe(tree: TreeSpec) -> str:
    return " ".join(str(tree).split())


def to_meta(spec: Spec) -> tuple:
    return spec.build([
        torch.empty(s.shape, dtype=s.dtype, device="meta").requires_grad_(s.requires_grad)
        if isinstance(s, TensorSpec) else s.value
        for s in spec.leaves
    ])


def _dummy(spec: Spec, device: torch.device) -> tuple:
    """Zeros shaped like ``spec`` (valid indices and masks for typical models)."""
    return spec.build([
        torch.zeros(s.shape, dtype=s.dtype, device=device).requires_grad_(s.requires_grad)
        if isinstance(s, TensorSpec) else s.value
        for s in spec.leaves
    ])


def probe_output_spec(module: nn.Module, input_spec: Spec, device: torch.device, values: tuple | None = None) -> Spec:
    """Run ``module`` once on ``values`` (zeros shaped like ``input_spec`` when omitted) and return
    its output spec. Side effects are contained: eval mode (no dropout, no running-statistics
    update), random-number state restored, and autograd saves nothing (the graph exists only to
    tell which outputs need gradients)."""
    args = values if values is not None else _dummy(input_spec, device)
    modes = [(m, m.training) for m in module.modules()]
    devices = [device] if device.type == "cuda" else []
    try:
        module.eval()
        with torch.random.fork_rng(devices=devices), torch.enable_grad(), \
                torch.autograd.graph.saved_tensors_hooks(_discard, _discard):  # type: ignore[arg-type]
            out = module(*args)
    finally:
        for m, training in modes:  # exactly as before, submodules the user froze included
            m.training = training
    return spec_of(out)


def _discard(_: object) -> None:
    """Saved-tensor hook that keeps nothing: a shape probe never runs backward."""


def infer_output_spec(module: nn.Module, input_spec: Spec, device: torch.device | None = None,
                      values: tuple | None = None) -> Spec:
    """Output spec of ``module`` for inputs like ``input_spec``: probed on the device, or on the
    ``meta`` device if probing fails (or ``device`` is None)."""
    if device is not None:
        try:
            return probe_output_spec(module, input_spec, device, values)
        except Exception:  # noqa: BLE001 - fall back to shapes-only inference
            pass
    params = {
        name: torch.empty_like(p, device="meta").requires_grad_(p.requires_grad)
        for name, p in module.named_parameters()
    }
    buffers = {name: torch.empty_like(b, device="meta") for name, b in module.named_buffers()}
    try:
        with torch.enable_grad():
            out = functional_call(module, {**params, **buffers}, to_meta(input_spec))
    except Exception as exc:  # noqa: BLE001 - any failure means the module cannot run on meta
        raise ConfigError(
            f"cannot infer the output shapes of stage module {type(module).__name__} "
            f"({type(exc).__name__}: {exc}); declare them with PipelineRunner(..., output_specs=...)"
        ) from exc
    return spec_of(out)


def infer_specs(module: nn.Module, input_specs: Sequence[Spec], device: torch.device | None = None,
                values: Sequence[tuple] | None = None) -> list[Spec]:
    """Output spec per microbatch; identical input specs are inferred once."""
    seen: list[tuple[Spec, Spec]] = []  # specs may hold unhashable constants: search a short list
    out = []
    for i, spec in enumerate(input_specs):
        found = next((o for s, o in seen if s == spec), None)
        if found is None:
            found = infer_output_spec(module, spec, device, values[i] if values is not None else None)
            seen.append((spec, found))
        out.append(found)
    return out


def split_microbatches(values: Any, num_microbatches: int, device: torch.device, what: str) -> list[tuple]:
    """Split every tensor of ``values`` (nested containers included) along dim 0; other values are
    repeated. Each piece is a fresh copy on ``device``, owned by its microbatch (so offloading it never
    touches the caller's)."""
    return [to_device(piece, device) for piece in split_on_host(values, num_microbatches, what)]


def split_on_host(values: Any, num_microbatches: int, what: str, pin: bool = False) -> list[tuple]:
    """The pieces of ``split_microbatches`` before their copy to the device (``to_device``): views of the caller's
    tensors, or with ``pin`` (the device is a GPU) of one pinned copy of each host tensor, so that the copy to the
    device does not wait for it. The runner copies each microbatch when its forward needs it: a step holds on the
    device the microbatches in flight only, as the planner counts them (``planner.trainblocks.embedding_bytes``)."""
    leaves, tree = flatten(values)
    pieces: list[list[Any]] = [[] for _ in range(num_microbatches)]
    for v in leaves:
        if isinstance(v, torch.Tensor):
            if v.dim() == 0 or v.shape[0] < num_microbatches:
                raise ConfigError(
                    f"{what}: a tensor of shape {tuple(v.shape)} cannot be split into {num_microbatches} "
                    "microbatches along dim 0; give a batch of at least that many rows"
                )
            if v.shape[0] % num_microbatches:  # each piece's mean loss counts 1/m: unequal pieces weigh unequally
                raise ConfigError(
                    f"{what}: a tensor of shape {tuple(v.shape)} splits into {num_microbatches} microbatches of "
                    f"unequal size (dim 0 is not a multiple of {num_microbatches}), and each microbatch's loss "
                    f"counts 1/{num_microbatches}, so the step would not be the batch's mean; give a batch whose "
                    f"dim 0 is a multiple of {num_microbatches}"
                )
            v = v.detach()
            if pin and v.device.type == "cpu":
                v = v.pin_memory()
            for i, part in enumerate(v.tensor_split(num_microbatches)):
                pieces[i].append(part)
        else:
            for piece in pieces:
                piece.append(v)
    return [tree_unflatten(p, tree) for p in pieces]


def to_device(piece: tuple, device: torch.device) -> tuple:
    """A piece of ``split_on_host`` as its microbatch's own copy on ``device`` (the same values, bit for bit)."""
    leaves, tree = flatten(piece)
    return tree_unflatten([v.to(device=device, copy=True, non_blocking=True) if isinstance(v, torch.Tensor) else v
                           for v in leaves], tree)


def as_inputs(leaves: Sequence[Any], spec: Spec) -> tuple:
    """Next stage's inputs from this stage's flattened outputs: detached, so each stage has its own graph."""
    return spec.build([
        v.detach().requires_grad_(sp.requires_grad) if isinstance(sp, TensorSpec) else v
        for v, sp in zip(leaves, spec.leaves)
    ])


def assemble(spec: Spec, buffers: list[torch.Tensor]) -> tuple:
    out, it = [], iter(buffers)
    for sp in spec.leaves:
        if isinstance(sp, TensorSpec):
            t = next(it)
            out.append(t.requires_grad_(True) if sp.requires_grad else t)
        else:
            out.append(sp.value)
    return spec.build(out)
