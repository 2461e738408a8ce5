"""Train your own model with pipeoffload: a plain ``nn.Sequential`` MLP classifier on 2 pipeline ranks.

    python examples/train_own_model.py                 # 2 spawned gloo ranks, 1F1B with offload all
    python examples/train_own_model.py --pp 1          # the same in one process

The model is a list of layers (split into ``pp * stages_per_rank`` consecutive stages), the loss any
``loss_fn(output, target)``, the data an object giving each step's ``(inputs, targets)`` per
data-parallel replica. Everything a spawned rank calls is defined at module level.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn

from pipeoffload.errors import ConfigError
from pipeoffload.train import TrainConfig, train_model

FEATURES, CLASSES = 16, 4


def layers() -> list[nn.Module]:
    torch.manual_seed(0)  # every rank builds the same initial weights
    model = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, CLASSES))
    return list(model)


class Blobs:
    """A separable toy problem: the class is the argmax of 4 fixed projections of the input."""

    tokens_per_sample = 1

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.proj = torch.randn(FEATURES, CLASSES, generator=torch.Generator().manual_seed(1))

    def _batch(self, seed: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(size, FEATURES, generator=torch.Generator().manual_seed(seed))
        return x, (x @ self.proj).argmax(dim=1)

    def train(self, step: int, dp_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        share = self.cfg.data.global_batch // self.cfg.parallel.dp
        return self._batch(1000 + step * self.cfg.parallel.dp + dp_rank, share)

    def val(self, dp_rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [self._batch(-1 - dp_rank, self.cfg.data.global_batch // self.cfg.parallel.dp)]


def batches(cfg: TrainConfig) -> Blobs:
    return Blobs(cfg)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", default="", help="run directory (checkpoints, metrics.jsonl); default: none")
    args = parser.parse_args(argv)
    cfg = TrainConfig.build(schedule="1f1b", pp=args.pp, nproc=args.pp, offload="all", microbatches=4,
                            global_batch=64, steps=args.steps, lr=1e-2, warmup=5, eval_every=10,
                            save_every=args.steps, out=args.out, progress=False)
    try:  # a bad --pp or --steps: one line (train_model checks the config before any rank starts)
        result = train_model(cfg, layers, F.cross_entropy, batches)
    except ConfigError as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    history = result["history"]
    first = next(h["val_loss"] for h in history if h["val_loss"] is not None)
    print(f"validation loss {first:.3f} -> {history[-1]['val_loss']:.3f} in {len(history)} steps")
    return result


if __name__ == "__main__":
    main()
