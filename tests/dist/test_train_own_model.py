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
    import tomllib

    saved = tomllib.loads((tmp_path / "run" / "config.toml").read_text())
    assert saved["model"] == {"source": "own"}  # the model kind, not GPT keys that do not apply
    for command in (["train", "--resume"], ["generate"]):  # the CLI cannot rebuild the user's model: say so
        refused = subprocess.run([sys.executable, "-m", "pipeoffload", *command, str(tmp_path / "run")],
                                 capture_output=True, text=True, timeout=120)
        lines = refused.stderr.strip().splitlines()
        assert refused.returncode == 2 and len(lines) == 1 and "train_model" in lines[0], refused.stderr
