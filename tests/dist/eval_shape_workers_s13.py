"""Workers of test_eval_shapes_s13.py (spawned ranks import them by name)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pipeoffload import generate, lower
from pipeoffload.runtime import PipelineRunner


def model() -> list[nn.Module]:
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(4, 8), nn.ReLU()), nn.Linear(8, 3)]


def batch(rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 4, generator=g)
    return x, x[:, :3].argmax(1)


def eval_shape_worker(rank: int, world: int) -> list[float] | None:
    """A step on 8 rows, evaluations on 4, 8 and 4 rows, another step on 8: the losses (last rank)."""
    layers = model()
    runner = PipelineRunner({rank: layers[rank]}, lower(generate("1f1b", world, 2)), rank,
                            loss_fn=F.cross_entropy, timeout=30)
    out: list[float] = []
    for kind, rows, seed in (("step", 8, 1), ("eval", 4, 2), ("eval", 8, 3), ("eval", 4, 4), ("step", 8, 5)):
        x, y = batch(rows, seed)
        if kind == "step":
            loss = runner.step(x, y)
            values = [] if loss is None else [float(loss)]
        else:
            values = [float(v) for v in runner.evaluate(x, y) or []]
        out += values
    return out if rank == world - 1 else None
