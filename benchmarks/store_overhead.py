"""What the activation store's saved-tensor hooks cost per stage-microbatch (docs/decisions.md, issue #19).

The stage of ``benchmarks/train_throughput.py`` (2 GPT blocks, hidden 128, seq 128, 2 sequences per
microbatch), one intra-op thread, forward + ``.sum().backward()`` in one process, thread CPU time, the
variants alternating (their order reversed every other round) so that drift of the machine falls on all
of them alike; printed: the median of each variant's time, and the median of the per-round differences to
no hooks. Variants: no hooks; hooks that only ``detach`` (torch's mechanism itself); the
``ActivationStore`` (``saving`` then ``release``, as a zb-v rank runs every step).

    python benchmarks/store_overhead.py [--rounds 600]
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from pipeoffload.models.gpt import GPTConfig, gpt_layers
from pipeoffload.runtime.offload import ActivationStore


def _stage() -> tuple[nn.ModuleList, torch.Tensor]:
    torch.manual_seed(0)
    blocks = nn.ModuleList(gpt_layers(GPTConfig(vocab=256, seq=128, hidden=128, heads=4, layers=2))[1:3])
    return blocks, torch.randn(2, 128, 128)


def _variants(blocks: nn.ModuleList) -> tuple[dict[str, Callable[[int], Any]], ActivationStore]:
    store = ActivationStore("cpu", exclude=list(blocks.parameters()))

    def detach_hooks(_: int) -> Any:
        return torch.autograd.graph.saved_tensors_hooks(lambda t: t.detach(), lambda t: t)

    return {"no hooks": lambda _: contextlib.nullcontext(), "detach-only hooks": detach_hooks,
            "ActivationStore": lambda mb: store.saving(0, mb)}, store


def _run(blocks: nn.ModuleList, x0: torch.Tensor, context: Any, release: Callable[[], None]) -> float:
    x = x0.clone().requires_grad_()
    start = time.thread_time()
    with context:
        y = x
        for block in blocks:
            out = block(y, None, 0)
            y = out[0] if isinstance(out, tuple) else out
    y.sum().backward()
    release()
    return time.thread_time() - start


def _releaser(store: ActivationStore, microbatch: int, managed: bool) -> Callable[[], None]:
    """What follows the backward: the store forgets the slot (as after B); nothing for the other variants."""
    def release() -> None:
        if managed:
            store.release(0, microbatch)
    return release


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=600)
    args = parser.parse_args()
    torch.set_num_threads(1)
    blocks, x0 = _stage()
    variants, store = _variants(blocks)
    names = list(variants)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(args.rounds + 20):  # the first 20 rounds warm up
        for name in names if r % 2 else names[::-1]:
            took = _run(blocks, x0, variants[name](r), _releaser(store, r, name == "ActivationStore"))
            if r >= 20:
                times[name].append(took)
    base = times["no hooks"]
    print(f"stage: 2 GPT blocks, hidden 128, seq 128, 2 sequences; {args.rounds} alternating rounds, thread CPU ms "
          "per forward + backward")
    for name in names:
        extra = statistics.median(t - b for t, b in zip(times[name], base))
        print(f"  {name:18} {statistics.median(times[name]) * 1e3:7.3f} ms   over no hooks {extra * 1e3:+.3f} ms")


if __name__ == "__main__":
    main()
