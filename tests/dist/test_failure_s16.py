"""Faults the audit of the sixteenth session found (2 gloo ranks, a few seconds each): a rank that leaves
with exit code 0 before its work is done, a rank whose share of a checkpoint cannot be written while its
peers write theirs, a peer lost while a checkpoint is loaded, a ``sys.exit()`` in the loss, and a data
source whose validation batches cannot be read."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from failure_workers_s16 import (
    batches_failing_in_validation,
    exits_early_with_code_0,
    layers_of_a_rank_that_cannot_write_its_rng_file,
    loses_its_peer_while_loading,
    loss_exiting_at_its_third_call,
)
from train_workers import RandomBatches, plain_layers

from pipeoffload.runtime.launch import _consequence, spawn

pytestmark = pytest.mark.dist


def test_a_rank_exiting_with_code_0_before_its_work_is_done_is_named() -> None:
    """A 0 exit without the function's return is no success: the verdict names rank 1, not rank 0's lost
    connection."""
    result = spawn(exits_early_with_code_0, 2, timeout=20, deadline=60, grace=5)
    assert not result.ok and result.culprit == 1, (result.exitcodes, result.errors)
    line = result.summary()
    assert line.startswith("rank 1 ") and "exited with code 0 before its work was done" in line, line


def test_a_rank_failing_alone_to_write_its_checkpoint_share_ends_the_save_naming_it(tmp_path: Path) -> None:
    """Rank 1 cannot write its random states; rank 0 can. Both agree before DCP's write (rank 0 used to wait in
    DCP's collectives, rank 1 in the agreement, until the timeout, each blaming the other): the save fails at
    once, every rank's error names rank 1 and its error, and no partial folder is left."""
    import torch.nn.functional as F

    from pipeoffload.train import TrainConfig, train_model
    from pipeoffload.train.launch import RankFailure

    run = tmp_path / "run"
    cfg = TrainConfig.build(schedule="1f1b", pp=2, nproc=2, microbatches=2, global_batch=8, steps=2, timeout=30,
                            progress=False, save_every=1, out=str(run))
    with pytest.raises(RankFailure) as err:
        train_model(cfg, layers_of_a_rank_that_cannot_write_its_rng_file, F.cross_entropy, RandomBatches)
    message = str(err.value)
    assert "saving the checkpoint of step 1 failed" in message, message
    assert "on rank 1, OSError: [Errno 5] Input/output error" in message and "timed out" not in message, message
    assert not [p.name for p in (run / "checkpoints").iterdir()], message  # no step-*, no .tmp-*


def test_a_rank_exiting_with_code_0_after_its_last_collective_ends_the_run_naming_it(tmp_path: Path) -> None:
    """Rank 0 had returned and waited to be collected with rank 1, which had no result to give: the launcher
    waited for ever, a SIGTERM included. Now the run ends naming rank 1. (In a process of its own, killed with
    its group if it outlives the bound, so that the old hang fails the test rather than stalling it.)"""
    script = Path(__file__).with_name("failure_workers_s16.py")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)})
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"the launcher was still waiting after 120 s: {out[-2000:]}") from None
    assert "ok=False culprit=1 summary=rank 1 " in out and "exited with code 0 before its work was done" in out, out


def test_a_peer_lost_while_loading_a_checkpoint_is_not_blamed_on_the_checkpoint(tmp_path: Path) -> None:
    """Rank 0's DCP load loses rank 1: its error is a lost peer (which the training loop names as one, with
    what it was doing), not a ConfigError "cannot be loaded onto this layout" (exit 2, the input's fault),
    which torchrun's ranks, with no launcher to blame the dead rank, would report as the run's cause."""
    result = spawn(loses_its_peer_while_loading, 2, args=(str(tmp_path),), timeout=20, deadline=60, grace=5)
    assert not result.ok and result.culprit == 1, (result.exitcodes, result.errors)
    error = result.errors[0] or ""
    assert error.startswith("RuntimeError: loading checkpoint step-000001: ") and _consequence(error), error


def _failure(layers: Any, loss: Any, batches: Any) -> str:
    from pipeoffload.train import TrainConfig, train_model
    from pipeoffload.train.launch import RankFailure

    cfg = TrainConfig.build(schedule="1f1b", pp=2, nproc=2, microbatches=2, global_batch=8, steps=3, timeout=30,
                            progress=False)
    with pytest.raises(RankFailure) as err:
        train_model(cfg, layers, loss, batches)
    return str(err.value)


def test_a_sys_exit_in_the_loss_names_the_evaluation_and_the_action() -> None:
    """SystemExit is no Exception: it used to pass the runtime's handler and end the run as "rank 1: SystemExit: 0"."""
    message = _failure(plain_layers, loss_exiting_at_its_third_call, RandomBatches)
    assert message.startswith("rank 1: PipelineError: pipeline rank 1 failed at the evaluation after step 1, "
                              "action #1 1F0: "), message
    assert "SystemExit: 0 (sys.exit() called in the model or the loss" in message, message


def test_a_failing_validation_source_names_the_step_and_the_call() -> None:
    """As a failing ``batches.train`` does (it used to be "rank 1: OSError: validation shard missing")."""
    import torch.nn.functional as F

    message = _failure(plain_layers, F.cross_entropy, batches_failing_in_validation)
    assert ("reading the validation batches after step 1 failed on rank 1: the batches' val(dp_rank=0) raised "
            "OSError: validation shard missing; fix the data source") in message, message
