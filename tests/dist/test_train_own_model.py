"""examples/train_own_model.py keeps running: an nn.Sequential MLP on 2 pipeline ranks learns."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_own_model.py"


def test_own_model_example_trains_and_checkpoints_by_layer_name(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(EXAMPLE), "--steps", "20", "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    history = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    vals = [h["val_loss"] for h in history if h["val_loss"] is not None]
    assert len(history) == 20 and vals[-1] < 0.5 * vals[0]
    manifest = json.loads(next((tmp_path / "run" / "checkpoints").glob("step-*/manifest.json")).read_text())
    assert manifest["step"] == 20 and manifest["world"] == 2
    import torch.distributed.checkpoint as dcp

    keys = set(dcp.FileSystemReader(str(tmp_path / "run" / "checkpoints" / "step-000020")).read_metadata()
               .state_dict_metadata)
    assert {"model.layers.0.weight", "model.layers.4.bias", "optim.layers.2.weight.exp_avg"} <= keys


def test_a_dict_crossing_a_stage_boundary_trains_and_evaluates() -> None:
    """A stage returning a dict: the step and the forward-only evaluation both carry it across ranks
    (the evaluation sent nothing, and its receiver waited for the whole timeout)."""
    import math

    import torch.nn.functional as F
    from train_workers import RandomBatches, dict_layers

    from pipeoffload.train import TrainConfig, train_model

    cfg = TrainConfig(schedule="1f1b", pp=2, nproc=2, microbatches=2, global_batch=8, steps=2, timeout=60,
                      progress=False)
    result = train_model(cfg, dict_layers, F.cross_entropy, RandomBatches)
    assert [h["step"] for h in result["history"]] == [1, 2]
    assert all(math.isfinite(h["val_loss"]) for h in result["history"])


def test_a_lambda_loss_is_refused_before_ranks_start() -> None:
    from train_workers import RandomBatches, dict_layers

    from pipeoffload.errors import ConfigError
    from pipeoffload.train import TrainConfig, train_model

    cfg = TrainConfig(schedule="1f1b", pp=2, nproc=2, microbatches=2, global_batch=8, steps=2, progress=False)
    with pytest.raises(ConfigError, match="loss_fn=.*<lambda>.*importable"):
        train_model(cfg, dict_layers, lambda out, y: out.sum(), RandomBatches)
