"""An evaluation batch of another size than the training's runs on several ranks (its own boundary
shapes), with the losses of one process; training's shapes stay fixed."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from eval_shape_workers_s13 import batch, eval_shape_worker, model

from pipeoffload.runtime.launch import spawn

pytestmark = pytest.mark.dist


def test_evaluation_batches_of_other_sizes_run_on_two_ranks() -> None:
    result = spawn(eval_shape_worker, 2, (), timeout=30, deadline=120)
    assert result.ok, result.errors
    got = result.results[1]
    layers = torch.nn.Sequential(*model())  # the reference: one process, no optimizer step (grads only)
    expected: list[float] = []
    for kind, rows, seed in (("step", 8, 1), ("eval", 4, 2), ("eval", 8, 3), ("eval", 4, 4), ("step", 8, 5)):
        x, y = batch(rows, seed)
        with torch.no_grad():
            losses = [float(F.cross_entropy(layers(a), b)) for a, b in zip(x.chunk(2), y.chunk(2))]
        expected += [sum(losses) / 2] if kind == "step" else losses
    assert got == pytest.approx(expected, rel=1e-5)
