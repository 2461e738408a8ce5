"""One pipeline stage on this rank: the user's module run per microbatch as F, B, I, W and R.

The stage knows nothing about ranks or messages: the executor hands it input values and output
gradients and takes back output values and input gradients. What it keeps per microbatch between
a forward and the backward that consumes it is only what autograd needs:

- the gradient edges of its outputs (never the output tensors: their memory goes with the send),
  or the loss on the last stage;
- the input tensors that need gradients (leaves whose ``.grad`` the backward fills);
- for a recomputed microbatch: its inputs and the random-number state, nothing else (its F runs
  without autograd, R replays it with autograd and the same random numbers before the backward).

Saved activations go through the ``ActivationStore`` slot (stage, microbatch).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.autograd.graph import get_gradient_edge

from pipeoffload.errors import ConfigError
from pipeoffload.runtime.backward import (
    GradAccumulators,
    Root,
    WeightJob,
    backward_full,
    backward_input,
    backward_weight,
)
from pipeoffload.runtime.offload import ActivationStore
from pipeoffload.runtime.spec import flatten

LossFn = Callable[[Any, Any], torch.Tensor]


def _needs_grad(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and v.requires_grad and (v.is_floating_point() or v.is_complex())


@dataclass
class _Microbatch:
    grad_inputs: list[torch.Tensor] = field(default_factory=list)
    roots: list[Root] = field(default_factory=list)
    args: tuple | None = None  # kept only when the microbatch is recomputed
    target: Any = None
    rng: tuple | None = None
    job: WeightJob | None = None


class PipelineStage:
    """Stage ``index`` of ``num_stages``: ``module`` plus per-microbatch autograd state."""

    def __init__(
        self,
        module: nn.Module,
        index: int,
        num_stages: int,
        store: ActivationStore,
        *,
        loss_fn: LossFn | None = None,
        num_microbatches: int = 1,
        trim_after_input: bool = True,
    ) -> None:
        self.module = module
        self.index = index
        self.num_stages = num_stages
        self.store = store
        self.loss_fn = loss_fn
        self.num_microbatches = num_microbatches
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.device = store.device
        self._mb: dict[int, _Microbatch] = {}
        self._saved_attrs: dict[str, tuple[str, ...]] = {}  # autograd node class -> saved-tensor attributes
        self._accumulators = GradAccumulators()  # the parameters' AccumulateGrad nodes, for I and W
        self.trim_after_input = trim_after_input

    @property
    def is_first(self) -> bool:
        return self.index == 0

    @property
    def is_last(self) -> bool:
        return self.index == self.num_stages - 1

    def pending(self) -> list[int]:
        """Microbatches whose backward has not run yet."""
        return sorted(self._mb)

    def reset(self) -> None:
        """Drop all per-microbatch state (after a failed step)."""
        self._mb.clear()

    # ---- forward -------------------------------------------------------------------------------
    def _run(self, args: tuple, target: Any) -> Any:
        out = self.module(*args)
        if self.is_last:
            if self.loss_fn is None:
                raise ValueError(f"stage {self.index} is the last stage but no loss_fn was given")
            loss = self.loss_fn(out, target)
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:  # metadata only: cheap per microbatch
                shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
                raise ConfigError(f"loss_fn returned {shape}, not a scalar tensor: it must return one number per "
                                  "microbatch (e.g. F.cross_entropy(..., reduction=\"mean\")); a per-sample loss "
                                  "would train on the gradient of its sum")
            return loss / self.num_microbatches
        return out

    def _record_roots(self, state: _Microbatch, out: Any) -> None:
        if self.is_last:
            state.roots = [out] if out.requires_grad else []
        else:
            state.roots = [get_gradient_edge(v) for v in flatten(out)[0] if _needs_grad(v)]

    def forward(self, mb: int, args: Sequence[Any], target: Any = None, *, recompute: bool = False) -> Any:
        """F. Returns the output values (the scaled loss, detached, on the last stage).

        With ``recompute`` nothing is saved: only the inputs and the random-number state are kept
        for R."""
        args = tuple(args)
        state = _Microbatch(grad_inputs=[a for a in flatten(args)[0] if _needs_grad(a)])
        if recompute:
            state.args, state.target, state.rng = args, target, _rng_state(self.device)
            with torch.no_grad():
                out = self._run(args, target)
        else:
            with self.store.saving(self.index, mb):
                out = self._run(args, target)
            self._record_roots(state, out)
        self._mb[mb] = state
        return out.detach() if self.is_last else out

    def recompute(self, mb: int) -> None:
        """R: replay the forward of a recomputed microbatch with autograd, same random numbers."""
        state = self._mb[mb]
        if state.args is None:
            raise RuntimeError(f"R of stage {self.index}, microbatch {mb}: its F was not run as recomputed")
        with _rng_restored(state.rng, self.device), _buffers_kept(self.module), self.store.saving(self.index, mb):
            out = self._run(state.args, state.target)
        self._record_roots(state, out)
        state.args = state.target = state.rng = None

    # ---- backward ------------------------------------------------------------------------------
    def _roots_and_grads(self, state: _Microbatch, grads: Sequence[torch.Tensor | None] | None) -> tuple[list, list]:
        if state.args is not None:
            raise RuntimeError(f"backward of stage {self.index} before the R of a recomputed microbatch")
        if self.is_last:
            return list(state.roots), [None] * len(state.roots)
        grads = list(grads or [])
        if len(grads) != len(state.roots):
            raise RuntimeError(
                f"stage {self.index} got {len(grads)} output gradients for {len(state.roots)} outputs needing one"
            )
        pairs = [(r, g) for r, g in zip(state.roots, grads) if g is not None]
        return [r for r, _ in pairs], [g for _, g in pairs]

    def backward(self, mb: int, grads: Sequence[torch.Tensor | None] | None = None) -> list[torch.Tensor | None]:
        """B: full backward; returns the gradients of the inputs that need one."""
        state = self._mb.pop(mb)
        roots, grads = self._roots_and_grads(state, grads)
        return backward_full(roots, grads, state.grad_inputs)

    def backward_input(self, mb: int, grads: Sequence[torch.Tensor | None] | None = None) -> list[torch.Tensor | None]:
        """I: input gradients only; the graph is kept for W, the activations only I needed are
        released (``trim_after_input``)."""
        state = self._mb[mb]
        roots, grads = self._roots_and_grads(state, grads)
        in_grads, state.job = backward_input(roots, grads, state.grad_inputs, self.params, self._accumulators)
        state.roots = []
        state.grad_inputs = []
        if self.trim_after_input:
            needed = state.job.saved_by_needed_nodes(self._saved_attrs)
            if needed is not None:
                self.store.trim(self.index, mb, needed)
        return in_grads

    def backward_weight(self, mb: int) -> None:
        """W: the weight gradients deferred by I."""
        state = self._mb.pop(mb)
        if state.job is None:
            raise RuntimeError(f"W of stage {self.index}, microbatch {mb} before its I")
        backward_weight(state.job)


class _buffers_kept:
    """Run a block, then put the module's buffers back as they were: the recomputed forward must not
    update running statistics a second time (F already did). The values are restored through
    ``.data`` so that autograd's version check on buffers the forward saved is not tripped."""

    def __init__(self, module: nn.Module) -> None:
        self.buffers = [b for b in module.buffers() if b.device.type != "meta"]
        self.saved: list[torch.Tensor] = []

    def __enter__(self) -> None:
        self.saved = [b.detach().clone() for b in self.buffers]

    def __exit__(self, *exc: Any) -> None:
        for b, saved in zip(self.buffers, self.saved):
            b.data.copy_(saved)
        self.saved = []


def _rng_state(device: torch.device) -> tuple:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


class _rng_restored:
    """Run a block with the random-number state captured at F, then put the current state back."""

    def __init__(self, state: tuple | None, device: torch.device) -> None:
        self.state = state
        self.device = device
        self.saved: tuple | None = None

    def __enter__(self) -> None:
        if self.state is None:
            return
        self.saved = _rng_state(self.device)
        cpu, cuda = self.state
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda, self.device)

    def __exit__(self, *exc: Any) -> None:
        if self.saved is not None:
            cpu, cuda = self.saved
            torch.set_rng_state(cpu)
            if cuda is not None:
                torch.cuda.set_rng_state(cuda, self.device)
