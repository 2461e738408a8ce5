"""Can FSDP2 (``fully_shard``), and torch's FSDP-based ``replicate``, reduce the gradients of the runtime's
split backward when driven by hand? The probe behind ``--fsdp`` and the ``replicate`` decision.

2 gloo ranks on CPU; a Linear-Tanh-Linear module sharded with ``fully_shard`` over both ranks; each
rank runs two microbatches through ``runtime.backward`` — a full backward (B), or I then W — with
FSDP's gradient sync off, then drives FSDP's post-backward by hand once (what
``torch.distributed.pipelining``'s REDUCE_GRAD does: ``post_backward`` of every parameter group,
then the root's final callback). The reduced gradients are compared with one process's gradients
of all four microbatches, divided by the number of ranks (FSDP averages).

    .venv/bin/python benchmarks/fsdp_split_backward.py

Prints, per wrapper (``fully_shard``, ``replicate`` from ``torch.distributed._composable.replicate_with_fsdp``)
and backward, how many of the 4 parameters got a gradient, the largest difference from the
single-process gradient, and whether it is bitwise equal.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeoffload.runtime.launch import spawn  # noqa: E402

WORLD, PER_RANK = 2, 2


def build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))


def inputs() -> list[torch.Tensor]:
    torch.manual_seed(1)
    return [torch.randn(4, 8, requires_grad=True) for _ in range(WORLD * PER_RANK)]


def reference() -> list[torch.Tensor]:
    model = build()
    for x in inputs():
        (model(x) ** 2).mean().backward()
    return [p.grad / WORLD for p in model.parameters()]  # type: ignore[operator]


def worker(rank: int, world: int, wrapper: str, mode: str) -> list[torch.Tensor | None]:
    from torch.distributed._composable.replicate_with_fsdp import replicate
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from pipeoffload.runtime.backward import backward_full, backward_input, backward_weight

    model = build()
    wrap = fully_shard if wrapper == "fully_shard" else replicate
    if wrapper == "fully_shard":
        fully_shard(model, mesh=init_device_mesh("cpu", (world,)), reshard_after_forward=False)
    else:
        replicate(model, mesh=init_device_mesh("cpu", (world,), mesh_dim_names=("replicate",)))
    model.set_requires_gradient_sync(False)  # type: ignore[operator]
    model.set_is_last_backward(False)  # type: ignore[operator]
    model.set_reshard_after_backward(False)  # type: ignore[operator]
    for x in inputs()[rank * PER_RANK:(rank + 1) * PER_RANK]:
        loss = (model(x) ** 2).mean()
        if mode == "B":
            backward_full([loss], [None], [x])
        else:  # the registered parameters are FSDP's unsharded ones while the module stays unsharded
            _, job = backward_input([loss], [None], [x], list(model.parameters()))
            backward_weight(job)
    model.set_requires_gradient_sync(True)  # type: ignore[operator]
    model.set_is_last_backward(True)  # type: ignore[operator]
    model.set_reshard_after_backward(True)  # type: ignore[operator]
    state = wrap.state(model)  # type: ignore[attr-defined]
    for group in state._fsdp_param_groups:  # private, as in torch.distributed.pipelining
        group.post_backward()
    state._root_post_backward_final_callback()
    return [None if p.grad is None else p.grad.full_tensor() for p in model.parameters()]


def main() -> None:
    ref = reference()
    for wrapper in ("fully_shard", "replicate"):
        for mode in ("B", "I+W"):
            result = spawn(worker, WORLD, (wrapper, mode), timeout=60, deadline=300)
            assert result.ok, result.summary()
            got = result.results[0]
            diff = max((a - b).abs().max().item() if a is not None else float("inf") for a, b in zip(got, ref))
            bitwise = all(a is not None and torch.equal(a, b) for a, b in zip(got, ref))
            print(f"{wrapper} {mode}: {sum(g is not None for g in got)} of {len(got)} gradients, "
                  f"max |diff| {diff:.3g}, bitwise {bitwise}")


if __name__ == "__main__":
    main()
