"""A one-rank run happens in the caller's process: ``train_model`` in a notebook replaced the root logger's
handlers with the run's (rank-tagged stderr, ``train.log``) for good, so the notebook's own logging stopped
and the run's ``train.log`` stayed open. The caller's handlers and level come back after the run."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from pipeoffload.train import TrainConfig, train_model  # noqa: E402


def _layers() -> list[Any]:
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(8, 8), nn.ReLU()), nn.Linear(8, 4)]


class _Batches:
    tokens_per_sample = 1

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg

    def train(self, step: int, dp_rank: int) -> tuple[Any, Any]:
        return torch.randn(4, 8), torch.zeros(4, dtype=torch.long)

    def val(self, dp_rank: int) -> list[tuple[Any, Any]]:
        return [self.train(0, dp_rank)]


def test_train_model_gives_the_callers_logging_back(tmp_path: Path) -> None:
    root = logging.getLogger()
    mine = logging.StreamHandler()
    before_handlers, before_level = list(root.handlers), root.level
    root.addHandler(mine)
    root.setLevel(logging.DEBUG)
    try:
        cfg = TrainConfig.build(pp=1, nproc=1, microbatches=1, global_batch=4, steps=1, progress=False,
                                eval_every=100, out=str(tmp_path / "run"))
        train_model(cfg, _layers, F.cross_entropy, _Batches)
        assert root.handlers == [*before_handlers, mine]  # ours kept, the run's gone
        assert root.level == logging.DEBUG
        assert (tmp_path / "run" / "train.log").is_file()  # the run did log to its file while it ran
    finally:
        root.removeHandler(mine)
        root.setLevel(before_level)
