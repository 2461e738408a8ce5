"""Validation runs through the runtime: a rank failing in the evaluation ends the run naming the rank,
the evaluation and the action, as a failure in a training step does; both name the run's step (1-based,
continuing after a resume), not the runner's count of its own steps."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from train_workers import (  # noqa: E402
    RandomBatches,
    eval_failing_layers,
    plain_layers,
    second_step_failing_layers,
)

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
    assert "rank 1 failed at the evaluation after step 1, action #1 1F0" in message, message
    assert "this layer cannot evaluate" in message and "timed out" not in message, message


def test_a_failure_after_a_resume_names_the_runs_step(tmp_path: Path) -> None:
    """Resumed from step 2, the process's second step is the run's step 4 (it said "step 1")."""
    import torch.nn.functional as F

    from pipeoffload.train import TrainConfig, train_model
    from pipeoffload.train.launch import RankFailure

    run = tmp_path / "run"
    cfg = TrainConfig.build(schedule="1f1b", pp=2, nproc=2, microbatches=2, global_batch=8, steps=6, timeout=30,
                            progress=False, save_every=2, out=str(run))
    first = train_model(cfg.updated(stop_at=2), plain_layers, F.cross_entropy, RandomBatches)
    assert first["step"] == 2, first
    with pytest.raises(RankFailure) as err:
        train_model(cfg, second_step_failing_layers, F.cross_entropy, RandomBatches, resume=str(run))
    message = str(err.value)
    assert "rank 1 failed at step 4, action" in message and "fails in its second step" in message, message
