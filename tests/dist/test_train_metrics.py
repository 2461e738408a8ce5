"""Metrics behind loggers: TensorBoard equals metrics.jsonl, --log-every skips records without changing
the training, and the measurements have an all-reduce of their own (not the gradient norm's)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from train_workers import RandomBatches, dict_layers, norm_reduce_sizes  # noqa: E402

from pipeoffload.train.config import TrainConfig, validate  # noqa: E402

pytestmark = pytest.mark.dist
BASE = {"schedule": "1f1b", "pp": 2, "nproc": 2, "microbatches": 2, "global_batch": 8, "steps": 5, "lr": 1e-2,
        "warmup": 1, "eval_every": 100, "timeout": 60, "progress": False}


def _jsonl(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_log_every_skips_records_not_training_and_tensorboard_equals_the_jsonl(tmp_path: Path) -> None:
    """One run logs every step to metrics.jsonl and TensorBoard; one logs every 3rd step (so measures
    memory only then) and keeps 2 in memory, under a spy: the same bits at the common steps, and the gradient norm's
    all-reduce holds the norm's slots only (the measurements have their own)."""
    import numpy as np
    import torch.nn.functional as F
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from pipeoffload.train import train_model
    from pipeoffload.train.launch import run_ranks

    every = train_model(TrainConfig.build(**BASE, out=str(tmp_path / "every"), tensorboard=True), dict_layers,
                        F.cross_entropy, RandomBatches)
    (tmp_path / "sparse").mkdir()
    cfg = validate(TrainConfig.build(**BASE, log_every=3, keep_records=2), data_exists=False, gpt=False)
    spied = run_ranks(norm_reduce_sizes, cfg, (str(tmp_path / "sparse"),))
    for rank in spied:
        assert rank["step"] == 5 and rank["sizes"] == [rank["slots"]] * 5, rank
    sparse = spied[0]["history"]
    assert [h["step"] for h in _jsonl(tmp_path / "sparse")] == [1, 3, 5]  # 1: its validation loss
    assert [h["step"] for h in sparse] == [3, 5]  # in memory: the last keep_records
    by_step = {h["step"]: h for h in every["history"]}
    for h in sparse:
        assert h == {**by_step[h["step"]], "tokens_per_s": h["tokens_per_s"], "step_s": h["step_s"]}
    assert not (tmp_path / "sparse" / "tensorboard").exists()

    records = _jsonl(tmp_path / "every")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    events = EventAccumulator(str(tmp_path / "every" / "tensorboard"))
    events.Reload()
    for key in ("loss", "grad_norm", "lr", "val_loss", "peak_act_bytes/rank1", "sim_peak_act_bytes/rank0"):
        name, _, rank = key.partition("/rank")
        got = [(e.step, e.value) for e in events.Scalars(key)]
        want = [(r["step"], float(np.float32(r[name] if not rank else r[name][int(rank)])))
                for r in records if r[name] is not None]
        assert got == want and want, key
