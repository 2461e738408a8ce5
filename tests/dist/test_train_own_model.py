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
    assert {"model.layers.0.weight", "model.layers.4.bias", "optim.state.layers.2.weight.exp_avg"} <= keys

    import tomllib

    saved = tomllib.loads((tmp_path / "run" / "config.toml").read_text())
    assert saved["model"] == {"source": "own"}  # the model kind, not GPT keys that do not apply
    for command in (["train", "--resume"], ["generate"]):  # the CLI cannot rebuild the user's model: say so
        refused = subprocess.run([sys.executable, "-m", "pipeoffload", *command, str(tmp_path / "run")],
                                 capture_output=True, text=True, timeout=120)
        lines = refused.stderr.strip().splitlines()
        assert refused.returncode == 2 and len(lines) == 1 and "train_model" in lines[0], refused.stderr


def _own_config(out: Path, **keys: object) -> object:
    from pipeoffload.train import TrainConfig

    base = {"schedule": "1f1b", "pp": 2, "nproc": 2, "offload": "all", "microbatches": 4, "global_batch": 64,
            "steps": 4, "lr": 1e-2, "warmup": 1, "eval_every": 2, "save_every": 2, "out": str(out), "progress": False}
    return TrainConfig.build(**{**base, **keys})


def test_train_model_resumes_its_own_run_bit_identically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """train_model(..., resume=RUN) continues in RUN: the same losses as an uninterrupted run; a new
    `steps` needs extend=True (it is a new LR schedule)."""
    import torch.nn.functional as F

    monkeypatch.syspath_prepend(str(EXAMPLE.parent))  # the spawned ranks inherit the path and import it too
    from train_own_model import batches, layers

    from pipeoffload.errors import ConfigError
    from pipeoffload.train import train_model

    full = train_model(_own_config(tmp_path / "full"), layers, F.cross_entropy, batches)
    part = tmp_path / "part"
    train_model(_own_config(part, stop_at=2), layers, F.cross_entropy, batches)
    with pytest.raises(ConfigError, match="extend=True"):
        train_model(_own_config(part, steps=6), layers, F.cross_entropy, batches, resume=str(part))
    resumed = train_model(_own_config(tmp_path / "elsewhere"), layers, F.cross_entropy, batches, resume=str(part))
    assert resumed["step"] == 4 and not (tmp_path / "elsewhere").exists()  # continued in the run's own folder
    losses = [json.loads(line)["loss"] for line in (part / "metrics.jsonl").read_text().splitlines()]
    assert losses == [h["loss"] for h in full["history"]]


def test_a_dict_crossing_a_stage_boundary_trains_and_evaluates() -> None:
    """A stage returning a dict: the step and the forward-only evaluation both carry it across ranks
    (the evaluation sent nothing, and its receiver waited for the whole timeout)."""
    import math

    import torch.nn.functional as F
    from train_workers import RandomBatches, dict_layers

    from pipeoffload.train import TrainConfig, train_model

    cfg = TrainConfig.build(schedule="1f1b", pp=2, nproc=2, microbatches=2, global_batch=8, steps=2, timeout=60,
                            progress=False)
    result = train_model(cfg, dict_layers, F.cross_entropy, RandomBatches)
    assert [h["step"] for h in result["history"]] == [1, 2]
    assert all(math.isfinite(h["val_loss"]) for h in result["history"])


def test_a_lambda_loss_is_refused_before_ranks_start() -> None:
    from train_workers import RandomBatches, dict_layers

    from pipeoffload.errors import ConfigError
    from pipeoffload.train import TrainConfig, train_model

    cfg = TrainConfig.build(schedule="1f1b", pp=2, nproc=2, microbatches=2, global_batch=8, steps=2, progress=False)
    with pytest.raises(ConfigError, match="loss_fn=.*<lambda>.*importable"):
        train_model(cfg, dict_layers, lambda out, y: out.sum(), RandomBatches)


def test_a_rank_whose_stages_have_no_parameters_trains_checkpoints_and_resumes(tmp_path: Path) -> None:
    """counts=(3, 1) leaves rank 1 only nn.Identity(): that rank has no optimizer state (it crashed with
    "optimizer got an empty parameter list"); the run equals one process bitwise. Resuming the finished
    run names train_model's keywords, not the CLI's flags."""
    import torch
    import torch.nn.functional as F
    from train_workers import RandomBatches, parameterless_end_layers

    from pipeoffload.errors import ConfigError
    from pipeoffload.train import TrainConfig, train_model

    keys = {"schedule": "1f1b", "microbatches": 2, "global_batch": 8, "steps": 2, "lr": 1e-2, "warmup": 1,
            "timeout": 60, "progress": False}
    run = tmp_path / "run"
    two = train_model(TrainConfig.build(pp=2, nproc=2, out=str(run), **keys), parameterless_end_layers,
                      F.cross_entropy, RandomBatches, counts=(3, 1))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a spawned rank
    try:
        one = train_model(TrainConfig.build(pp=1, nproc=1, **keys), parameterless_end_layers, F.cross_entropy,
                          RandomBatches)
    finally:
        torch.set_num_threads(threads)
    fields = ("loss", "val_loss", "grad_norm")
    assert [[h[f] for f in fields] for h in two["history"]] == [[h[f] for f in fields] for h in one["history"]]
    assert (run / "checkpoints" / "step-000002" / "manifest.json").is_file()
    with pytest.raises(ConfigError, match=r"resume=: the run is finished.*pass steps=N and extend=True") as err:
        train_model(TrainConfig.build(pp=2, nproc=2, **keys), parameterless_end_layers, F.cross_entropy,
                    RandomBatches, counts=(3, 1), resume=str(run))
    assert "--" not in str(err.value)


def test_non_finite_stops_name_train_models_keywords_and_what_happened() -> None:
    """A NaN from a module's forward in evaluation is not "the parameters overflowed" (they are finite);
    the training stop names skip_nonfinite=N, not --skip-nonfinite N."""
    import torch.nn.functional as F
    from train_workers import RandomBatches, nan_in_eval_layers, nan_in_training_layers

    from pipeoffload.train import TrainConfig, train_model
    from pipeoffload.train.launch import RankFailure

    cfg = TrainConfig.build(schedule="1f1b", pp=1, nproc=1, microbatches=2, global_batch=8, steps=2, progress=False)
    with pytest.raises(RankFailure) as err:
        train_model(cfg, nan_in_eval_layers, F.cross_entropy, RandomBatches)
    text = str(err.value)
    assert "step 1: validation loss nan is not finite, but the parameters are finite (at most " in text, text
    assert "in absolute value): the model's forward" in text and "most likely" not in text, text
    assert "overflowed" not in text and "--lr" not in text
    with pytest.raises(RankFailure) as err:
        train_model(cfg, nan_in_training_layers, F.cross_entropy, RandomBatches)
    text = str(err.value)
    assert "lower lr= (now 0.0003) or lower clip= (now 1), or allow skipped steps with skip_nonfinite=N" in text, text
    assert "--" not in text
