"""Validation runs through the runtime: a rank failing in the evaluation ends the run naming the rank,
the evaluation and the action, as a failure in a training step does."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from train_workers import RandomBatches, eval_failing_layers  # noqa: E402

pytestmark = pytest.mark.dist


def test_a_rank_failing_in_the_evaluation_ends_the_run_naming_the_action() -> None:
    import torch.nn.functional as F

    from pipeoffload.train import TrainConfig, train_model
    from pipeoffload.train.launch import RankFailure

    cfg = TrainConfig.build(schedule="1f1b", pp=2, nproc=2, microbatches=2, global_batch=8, steps=3, timeout=30,
                            progress=False)
    with pytest.raises(RankFailure) as err:  # the last stage's layer raises in eval mode, after training step 1
        train_model(cfg, eval_failing_layers, F.cross_entropy, RandomBatches)
    message = str(err.value)
    assert "rank 1 failed at the evaluation after step 0, action #1 1F0" in message, message
    assert "this layer cannot evaluate" in message and "timed out" not in message, message
