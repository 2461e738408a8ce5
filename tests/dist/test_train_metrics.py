"""Metrics behind loggers: TensorBoard equals metrics.jsonl, --log-every skips records without changing
the training, and the measurements have an all-reduce of their own (not the gradient norm's)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from train_workers import logged_and_spied  # noqa: E402

from pipeoffload.train.config import TrainConfig, validate  # noqa: E402

pytestmark = pytest.mark.dist
BASE = {"schedule": "1f1b", "pp": 2, "nproc": 2, "microbatches": 2, "global_batch": 8, "steps": 5, "lr": 1e-2,
        "warmup": 1, "eval_every": 100, "timeout": 60, "progress": False}


def _jsonl(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_log_every_skips_records_not_training_and_tensorboard_equals_the_jsonl(tmp_path: Path) -> None:
    """In one spawn of 2 ranks: a run logs every step to metrics.jsonl and TensorBoard; a second logs
    every 3rd step (so measures memory only then) and keeps 2 records in memory, under a spy: the same
    bits at the common steps, and the gradient norm's all-reduce holds the norm's slots only (the
    measurements have their own, after it)."""
    import numpy as np
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from pipeoffload.train.launch import run_ranks

    every_dir, sparse_dir = tmp_path / "every", tmp_path / "sparse"
    every_dir.mkdir()
    sparse_dir.mkdir()
    cfg = validate(TrainConfig.build(**BASE, tensorboard=True), data_exists=False, gpt=False)
    sparse_cfg = validate(TrainConfig.build(**BASE, log_every=3, keep_records=2), data_exists=False, gpt=False)
    ranks = run_ranks(logged_and_spied, cfg, (str(every_dir), sparse_cfg, str(sparse_dir)))
    for rank in ranks:
        assert rank["second"]["step"] == 5 and rank["sizes"] == [rank["slots"]] * 5, rank
        assert rank["measured"] == [True, False, True, False, True]  # memory measured on logged steps only
        # the measurements' all-reduce comes after the norm's, not started before it (which held the last
        # rank out of the pipeline longer on gloo), and is the only other one of a step (pp only here)
        assert rank["in_step"] == [["norm", "other"]] * 5, rank["in_step"]
    every, sparse = ranks[0]["first"]["history"], ranks[0]["second"]["history"]
    assert [h["step"] for h in _jsonl(sparse_dir)] == [1, 3, 5]  # 1: its validation loss
    assert [h["step"] for h in sparse] == [3, 5]  # in memory: the last keep_records
    by_step = {h["step"]: h for h in every}
    for h in sparse:
        assert h == {**by_step[h["step"]], "tokens_per_s": h["tokens_per_s"], "step_s": h["step_s"]}
    assert not (sparse_dir / "tensorboard").exists()

    records = _jsonl(every_dir)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5] and records == every
    events = EventAccumulator(str(every_dir / "tensorboard"))
    events.Reload()
    for key in ("loss", "grad_norm", "lr", "val_loss", "peak_act_bytes/rank1", "sim_peak_act_bytes/rank0"):
        name, _, rank = key.partition("/rank")
        got = [(e.step, e.value) for e in events.Scalars(key)]
        want = [(r["step"], float(np.float32(r[name] if not rank else r[name][int(rank)])))
                for r in records if r[name] is not None]
        assert got == want and want, key
