"""Failures the probe of the thirteenth session injected, checked without spawning ranks: the launcher's
verdict when every error only reports a stuck peer, a signal pending when the trainer's handler is
installed, an interrupted run whose ranks all finished, a full disk before the run starts (config.toml,
the run's lock), a checkpoint with a missing file, ``checkpoints/`` replaced by a file mid-run, and a
failing ``Batches.train``."""
from __future__ import annotations

import errno
import os
import signal
import types
from pathlib import Path
from typing import Any

import pytest

from pipeoffload.errors import ConfigError


# ---- 1. the launcher blames the rank still running when every other error is a consequence -------------
def test_the_rank_still_running_is_blamed_when_the_others_only_timed_out() -> None:
    from pipeoffload.runtime.launch import SpawnResult

    gloo = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 10000ms "
            "for send operation to complete")
    late = "rank 1 still running: killed 5 s after a rank failed (stuck or stopped?)"
    line = SpawnResult([1, -9], [None, None], [gloo, late]).summary()
    assert line.startswith("rank 1 was still running when its peers gave up waiting for it"), line
    assert "killed 5 s after a rank failed" in line and "rank 0: RuntimeError" in line, line
    closed = "RuntimeError: Connection closed by peer [127.0.0.1]:1234"  # 4 ranks, rank 2 stuck
    line = SpawnResult([1, 1, -9, 1], [None] * 4, [closed, gloo, "rank 2 still running: killed 5 s after a rank "
                                                   "failed (stuck or stopped?)", gloo]).summary()
    assert line.startswith("rank 2 was still running"), line
    # a rank's own error still comes first: the rank killed while waiting on it is its consequence
    own = "ValueError: bad batch\n\nTraceback ..."
    assert SpawnResult([1, -9], [None, None], [own, late]).summary() == "rank 0: ValueError: bad batch"


def test_a_set_up_collective_that_times_out_names_the_action(one_rank: None) -> None:
    """The trainer's set-up collectives run under ``Context.collective``: their failure names the action."""
    import torch

    from pipeoffload.train.mesh import PeerFailure, build_context

    ctx = build_context(1, 1, 1, torch.device("cpu"), timeout=5)
    try:
        with pytest.raises(PeerFailure) as info, \
                ctx.collective("setting up (gathering the parameter names of every rank)"):
            raise RuntimeError("[gloo] Timed out waiting 10000ms for send operation to complete")
    finally:
        ctx.close()
    text = str(info.value)
    assert "rank 0 failed while setting up" in text and "waiting or computing for longer than the timeout" in text


# ---- 3. signals ------------------------------------------------------------------------------------------
def test_the_trainer_takes_up_a_signal_received_before_its_handler(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeoffload.runtime import launch
    from pipeoffload.train.loop import Trainer

    monkeypatch.setattr(launch, "_recorded", [signal.SIGTERM])
    trainer = types.SimpleNamespace(stop_signal=0)
    restore = Trainer._install_signals(trainer)  # type: ignore[arg-type]
    try:
        assert trainer.stop_signal == signal.SIGTERM
    finally:
        restore()


def test_a_signal_forwarded_before_the_rank_listened_is_read_from_the_run_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeoffload.runtime import launch

    sup = launch._Supervisor(2, str(tmp_path), 10, 60, None, 10)
    sup.on_signal(signal.SIGINT, None)  # before any rank has started: recorded, sent to none
    monkeypatch.setattr(launch, "_recorded", [])
    monkeypatch.setattr(launch, "_stop_file", [str(tmp_path / launch.STOP_FILE)])
    assert launch.pending_signal() == signal.SIGINT
    monkeypatch.setattr(launch, "_stop_file", [])
    assert launch.pending_signal() == 0  # not a spawned rank


def test_an_interrupted_run_whose_ranks_all_finished_is_not_a_success(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import pipeoffload.runtime.launch as runtime
    from pipeoffload.train import launch
    from pipeoffload.train.config import build_config

    done = [{"rank": r, "step": 50, "interrupted": 0, "saved_at": 50} for r in range(2)]
    monkeypatch.setattr(runtime, "spawn", lambda *a, **k: runtime.SpawnResult(
        exitcodes=[0, 0], results=done, errors=[None, None], interrupted=signal.SIGINT))
    results = launch._spawned(lambda *a: None, build_config({"pp": 2, "nproc": 2, "out": str(tmp_path)}), (), False)
    assert [r["interrupted"] for r in results] == [signal.SIGINT, signal.SIGINT]


# ---- 4. a full disk before the run starts ------------------------------------------------------------------
def _full(*_: Any) -> Any:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_writing_a_file_atomically_is_one_line_and_leaves_nothing(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeoffload import fileio

    class Handle:
        def __enter__(self) -> Handle:
            return self

        def __exit__(self, *_: Any) -> None:
            pass

        write = staticmethod(_full)

    real = os.fdopen
    monkeypatch.setattr(fileio.os, "fdopen", lambda fd, mode: (os.close(fd), Handle())[1])
    with pytest.raises(ConfigError) as info:
        fileio.write_atomic(tmp_path / "config.toml", "x = 1\n")
    monkeypatch.setattr(fileio.os, "fdopen", real)
    text = str(info.value)
    assert str(tmp_path / "config.toml") in text and "No space left on device" in text and "free space" in text
    assert "\n" not in text and list(tmp_path.iterdir()) == []


def test_a_full_disk_taking_the_run_lock_is_one_line_and_leaves_no_folder(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeoffload.train import runlock

    run = tmp_path / "runs" / "run"
    monkeypatch.setattr(runlock.os, "write", _full)
    with pytest.raises(ConfigError) as info:
        runlock.RunLock(run).acquire()
    assert str(run / ".lock") in str(info.value) and "free space" in str(info.value)
    assert list(tmp_path.iterdir()) == []  # neither the lock nor the folders it made


def test_a_refused_run_leaves_no_folder_holding_only_its_lock(tmp_path: Path) -> None:
    from pipeoffload.train.runlock import RunLock

    run = tmp_path / "run"
    with pytest.raises(ConfigError), RunLock(run):
        raise ConfigError("config.toml: cannot be written")  # e.g. the disk filled after the lock
    assert not run.exists()
    with RunLock(run):
        (run / "config.toml").write_text("")
    assert sorted(p.name for p in run.iterdir()) == [".lock", "config.toml"]  # a run that wrote something keeps it
    kept = tmp_path / "existing"
    kept.mkdir()
    with RunLock(kept):
        pass
    assert kept.is_dir()  # a folder that was there stays


# ---- 5./6. checkpoints -------------------------------------------------------------------------------------
def _model() -> tuple[dict[str, Any], Any]:
    import torch

    from pipeoffload.train.config import TrainConfig
    from pipeoffload.train.optim import make_optimizer

    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 4)
    named = {"layers.0.fc.weight": layer.weight, "layers.0.fc.bias": layer.bias}
    opt = make_optimizer(TrainConfig.build(), list(named.values()), None, 1)
    return named, opt


@pytest.mark.parametrize("name", ["__0_0.distcp", "rng-rank0.pt", "trainer.json", ".metadata"])
def test_a_checkpoint_missing_a_file_says_what_to_do(one_rank: None, tmp_path: Path, name: str) -> None:
    from pipeoffload.train import checkpoint
    from pipeoffload.train.config import TrainConfig

    named, opt = _model()
    saver = checkpoint.Saver(TrainConfig.build())
    for step in (2, 4):
        saver.save(tmp_path, step, named, opt, 0, 1, {})
    first, last = checkpoint.list_checkpoints(tmp_path)
    (last / name).unlink()
    with pytest.raises(ConfigError) as info:
        checkpoint.verify(last)
    assert f"file {name} is missing" in str(info.value)
    assert "delete it to resume from the previous one (step-000002)" in str(info.value), str(info.value)
    (first / name).unlink()
    with pytest.raises(ConfigError) as info:
        checkpoint.verify(first)
    assert "only checkpoint" in str(info.value), str(info.value)


def test_checkpoints_replaced_by_a_file_mid_run_is_a_save_error(one_rank: None, tmp_path: Path) -> None:
    from pipeoffload.train import checkpoint
    from pipeoffload.train.config import TrainConfig

    named, opt = _model()
    saver = checkpoint.Saver(TrainConfig.build())
    saver.save(tmp_path, 2, named, opt, 0, 1, {})
    import shutil

    shutil.rmtree(tmp_path / "checkpoints")
    (tmp_path / "checkpoints").write_text("")
    with pytest.raises(checkpoint.SaveError) as info:
        saver.save(tmp_path, 4, named, opt, 0, 1, {})
    text = str(info.value)
    assert text.startswith("saving the checkpoint of step 4 failed") and "FileExistsError" in text, text


# ---- 7. a failing Batches.train ----------------------------------------------------------------------------
def test_a_failing_batches_train_names_the_step_rank_and_action() -> None:
    import torch

    from pipeoffload.train.config import TrainConfig
    from pipeoffload.train.loop import DataError, Trainer

    class Boom:
        def train(self, step: int, dp_rank: int) -> Any:
            raise OSError("data boom")

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    trainer = types.SimpleNamespace(cfg=TrainConfig.build(steps=40), ctx=types.SimpleNamespace(rank=1, dp_rank=0),
                                    step=29, opt=opt, batches=Boom())
    with pytest.raises(DataError) as info:
        Trainer.train_step(trainer)  # type: ignore[arg-type]
    text = str(info.value)
    assert "training batch of step 30" in text and "rank 1" in text and "OSError: data boom" in text, text
    assert "fix the data source" in text


# ---- found by the fault sweep of the eighteenth session (benchmarks/fault_sweep.py) ---------------------------
def test_a_rank_s_own_error_in_a_collective_names_the_rank_and_the_action() -> None:
    """A collective's own error (not a lost peer) passed bare: "rank 2: RuntimeError: boom" said neither what
    the rank was doing nor when. The errors that name themselves, and a ConfigError (exit 2), pass as they are."""
    from pipeoffload.train.checkpoint import SaveError
    from pipeoffload.train.mesh import RankContext, RankError, doing

    ctx = RankContext(2, 4, None, 2, 2, 1, 1, 0, 0, None, None, None, None)  # type: ignore[arg-type]
    with pytest.raises(RankError) as err:
        with ctx.collective("averaging the gradients of step 3 over the data-parallel group"):
            raise RuntimeError("boom\nsecond line")
    assert str(err.value) == ("rank 2 failed while averaging the gradients of step 3 over the data-parallel group: "
                              "RuntimeError: boom")
    with pytest.raises(RankError, match=r"^rank 2 failed while saving: OSError: \[Errno 28\] full$"):
        with ctx.collective("saving"):
            raise OSError(errno.ENOSPC, "full")
    for named in (ConfigError("bad input"), SaveError("disk full while saving")):
        with pytest.raises(type(named)) as passed:
            with ctx.collective("saving"), doing(2, "saving"):
                raise named
        assert passed.value is named
    with pytest.raises(SystemExit):
        with doing(2, "taking the optimizer step"):
            raise SystemExit(0)
