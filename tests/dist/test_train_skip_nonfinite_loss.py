"""A step whose loss is not finite while its gradients are (so is the norm) is skipped on every rank,
those that hold no loss included: the decision needs every rank's loss. A guard for any rearranging
of the step's collectives (an overlapped measurements' all-reduce must bring the decision with it:
docs/decisions.md, "A gloo all-reduce's last rank waits for the first rank's core")."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from train_workers import skip_on_a_nan_loss  # noqa: E402

from pipeoffload.train.config import TrainConfig, validate  # noqa: E402

pytestmark = pytest.mark.dist


@pytest.mark.parametrize("schedule", ["1f1b", "zb-v"])
def test_a_nan_loss_with_finite_gradients_skips_the_step_on_every_rank(schedule: str) -> None:
    from pipeoffload.train.launch import run_ranks

    cfg = validate(TrainConfig.build(layers=4, hidden=32, heads=4, seq_len=32, global_batch=8, microbatches=2,
                                     steps=10, warmup=0, schedule=schedule, pp=2, nproc=2, skip_nonfinite=1,
                                     timeout=60, progress=False, eval_every=100))
    for rank in run_ranks(skip_on_a_nan_loss, cfg):
        assert rank["moved"] == [True, False, True], rank  # the second step's update skipped on this rank too
        assert rank["skipped"] == 1, rank
        (first, _), (loss, norm), _ = rank["records"]
        assert math.isfinite(first) and math.isnan(loss), rank  # the record keeps the NaN loss ...
        assert math.isfinite(norm) and norm > 0, rank  # ... and the finite norm of that step
