"""``--async-save`` where one rank's background write cannot start while its peer's has: the failed
save says the partial folder was removed, and it is (the peer's writer thread, still waiting for the
failed rank in DCP's planning, used to make the folder again after rank 0 had removed it); the line
names the last complete checkpoint once (the launcher's way on used to repeat it)."""
from __future__ import annotations

from pathlib import Path

import pytest
from failure_workers_s16 import layers_of_a_rank_whose_second_background_write_fails
from train_workers import RandomBatches

pytestmark = pytest.mark.dist


def test_a_background_save_failing_on_one_rank_leaves_only_the_last_complete_checkpoint(tmp_path: Path) -> None:
    import torch.nn.functional as F

    from pipeoffload.train import TrainConfig, train_model
    from pipeoffload.train.config import continue_with
    from pipeoffload.train.launch import RankFailure

    run = tmp_path / "run"
    cfg = TrainConfig.build(schedule="1f1b", pp=2, nproc=2, microbatches=2, global_batch=8, steps=3, timeout=30,
                            progress=False, save_every=1, async_save=True, out=str(run))
    with pytest.raises(RankFailure) as err:
        train_model(cfg, layers_of_a_rank_whose_second_background_write_fails, F.cross_entropy, RandomBatches)
    message = str(err.value)
    # the ranks are gone (their background threads too): what is left is all the run will ever see
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000001"], message
    assert "saving the checkpoint of step 2 failed (the partial save was removed; " in message, message
    assert "on rank 1, OSError: [Errno 5] Input/output error" in message, message
    assert message.count("the last complete checkpoint is") == 1, message
    assert message.count("continue with:") == 1 and message.endswith(f"continue with: {continue_with(run)}"), message
