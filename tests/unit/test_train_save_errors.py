"""A failed save: ENOSPC is recognised however DCP wraps it, the partial folder is removed, and the
message says "disk full" and names the last complete checkpoint."""
from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest

from pipeoffload.train.checkpoint import (
    _DISK_FULL,
    _FAILED,
    SaveError,
    _attempt,
    _check,
    _disk_full,
    _first_line,
    estimated_bytes,
    sizes,
)


def test_enospc_is_recognised_through_wrapping() -> None:
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("CheckpointException ranks:dict_keys([0, 1])") from inner
    except RuntimeError as outer:
        assert _disk_full(outer)
    assert not _disk_full(RuntimeError("CheckpointException ranks:dict_keys([0])"))


def test_a_failed_save_is_removed_and_named(tmp_path: Path) -> None:
    (tmp_path / "checkpoints" / "step-000002").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step-000002" / "x.distcp").write_bytes(b"0" * 1000)
    partial = tmp_path / "checkpoints" / ".tmp-step-000004"
    partial.mkdir()
    with pytest.raises(SaveError) as info:
        _check(_DISK_FULL, OSError(errno.ENOSPC, "No space left on device"), tmp_path, 4, partial, rank=0)
    assert not partial.exists()
    assert "disk full" in str(info.value) and "step-000002" in str(info.value) and "--resume" in str(info.value)
    assert estimated_bytes(tmp_path, 10) == 1000  # the previous checkpoint's size


# ---- real saves in one process (a gloo group of one rank) --------------------------------------------
def _model(layers: int = 8) -> tuple[dict[str, Any], Any]:
    """``layers`` small Linear layers under full names, and their optimizer after one step."""
    import torch

    from pipeoffload.train.config import TrainConfig
    from pipeoffload.train.optim import make_optimizer

    torch.manual_seed(0)
    named: dict[str, Any] = {}
    for i in range(layers):
        layer = torch.nn.Linear(8, 8)
        named[f"layers.{i}.fc.weight"], named[f"layers.{i}.fc.bias"] = layer.weight, layer.bias
    opt = make_optimizer(TrainConfig.build(), list(named.values()), None, 1)
    sum(p.square().sum() for p in named.values()).backward()
    opt.step()
    return named, opt


def _no_space(monkeypatch: pytest.MonkeyPatch, short_write: bool = False) -> None:
    """DCP's writer runs out of space part-way through its first item: ENOSPC, or (``short_write``) the
    error ``torch.save`` gives on a real full disk, a RuntimeError, with the file system then full."""
    import shutil

    from torch.distributed.checkpoint import filesystem

    from pipeoffload.train import checkpoint

    full = []

    def write_item(_transforms: Any, stream: Any, *args: Any, **kwargs: Any) -> Any:
        stream.write(b"\0" * 100)
        full.append(True)
        if short_write:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
        raise OSError(errno.ENOSPC, "No space left on device")

    real = shutil.disk_usage
    monkeypatch.setattr(filesystem, "_write_item", write_item)
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda path: real(path)._replace(free=0) if full else real(path))


def test_a_dcp_checkpoint_exception_is_an_outcome_not_an_escape(tmp_path: Path) -> None:
    """DCP gathers the ranks' errors in a CheckpointException, a BaseException: ``_attempt`` must turn it
    into an outcome every rank agrees on (it escaped ``except Exception``), but not a Ctrl-C."""
    import traceback

    from torch.distributed.checkpoint.api import CheckpointException

    def raising(exc: BaseException) -> Any:
        def work() -> None:
            raise exc
        return work

    full = CheckpointException("x", {1: (OSError(errno.ENOSPC, "No space left on device"), traceback.StackSummary())})
    assert _attempt(raising(full), tmp_path) == (_DISK_FULL, full)
    other = CheckpointException("x", {0: (ValueError("bad shape"), traceback.StackSummary())})
    assert _attempt(raising(other), tmp_path) == (_FAILED, other)
    assert "ValueError: bad shape" in _first_line(other) and "rank 0" in _first_line(other)
    for stop in (KeyboardInterrupt(), SystemExit(3)):
        with pytest.raises(type(stop)):
            _attempt(raising(stop), tmp_path)


def test_a_short_write_on_a_full_file_system_is_disk_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.save (DCP's writer) reports ENOSPC as ``unexpected pos``: disk full when the file system is full."""
    import shutil

    from pipeoffload.train import checkpoint

    def short() -> None:
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    assert _attempt(short, tmp_path / "checkpoints" / ".tmp-step-000002")[0] == _FAILED  # room left: not full
    real = shutil.disk_usage
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda path: real(path)._replace(free=4096))
    assert _attempt(short, tmp_path / "checkpoints" / ".tmp-step-000002")[0] == _DISK_FULL


@pytest.mark.parametrize("short_write", [False, True], ids=["enospc", "short-write"])
@pytest.mark.parametrize("background", [False, True], ids=["sync", "async"])
def test_a_save_that_runs_out_of_space_mid_write_is_removed_and_named(
        one_rank: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, background: bool, short_write: bool) -> None:
    """The disk fills during DCP's write (rank 1 of the probe; here the only rank): the partial
    .tmp-step folder is removed, the last checkpoint stays intact, and SaveError says "disk full",
    names it and the resume command (not DCP's ``CheckpointException ranks:dict_keys([1])``)."""
    from pipeoffload.train import checkpoint
    from pipeoffload.train.config import TrainConfig

    cfg = TrainConfig.build(async_save=background)
    named, opt = _model()
    saver = checkpoint.Saver(cfg)
    saver.save(tmp_path, 2, named, opt, 0, 1, {})
    saver.wait()
    _no_space(monkeypatch, short_write)
    with pytest.raises(SaveError) as info:
        saver.save(tmp_path, 4, named, opt, 0, 1, {})
        saver.wait()
    message = str(info.value)
    assert "disk full" in message and "step-000002" in message and f"--resume {tmp_path}" in message, message
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["step-000002"]
    checkpoint.verify(checkpoint.step_dir(tmp_path, 2))


def test_a_first_save_that_runs_out_of_space_does_not_suggest_resuming(
        one_rank: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeoffload.train import checkpoint
    from pipeoffload.train.config import TrainConfig

    named, opt = _model()
    _no_space(monkeypatch)
    with pytest.raises(SaveError) as info:
        checkpoint.save(tmp_path, 3, TrainConfig.build(), named, opt, 0, 1, {})
    message = str(info.value)
    assert "disk full" in message and "no checkpoint was saved yet" in message, message
    assert "--resume" not in message and "start the run again" in message
    assert not list((tmp_path / "checkpoints").iterdir())


def test_the_free_space_check_counts_every_byte_a_save_writes(
        one_rank: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With one byte less free than the checkpoint takes, the save is refused before anything is written
    (the estimate was the tensors' bytes x 1.1: a small model's checkpoint, with DCP's per-item framing,
    the optimizer's options and step counters, .metadata and the random-number states, is several
    times that, so the write started and failed mid-way on a full disk)."""
    import shutil

    from pipeoffload.train import checkpoint
    from pipeoffload.train.config import TrainConfig

    named, opt = _model()
    written = checkpoint.save(tmp_path / "a", 2, TrainConfig.build(), named, opt, 0, 1, {})
    actual = checkpoint.checkpoint_bytes(written)
    assert json.loads((written / "manifest.json").read_text())["estimated_bytes"] >= actual
    real = shutil.disk_usage
    monkeypatch.setattr(checkpoint.shutil, "disk_usage",
                        lambda path: real(path)._replace(free=actual - 1))
    with pytest.raises(SaveError) as info:
        checkpoint.save(tmp_path / "b", 2, TrainConfig.build(), named, opt, 0, 1, {})
    message = str(info.value)
    assert "disk full" in message and "needs about" in message and "nothing was written" in message, message
    assert "--resume" not in message and "start the run again" in message
    assert not list((tmp_path / "b" / "checkpoints").iterdir())


def test_two_different_sizes_read_differently() -> None:
    mib = 1 << 20
    assert sizes(int(3.04 * mib), int(2.96 * mib)) == ("3.04 MiB", "2.96 MiB")  # both 3.0 at one decimal
    assert sizes(3 * mib + 1, 3 * mib) == (f"{3 * mib + 1:,} bytes", f"{3 * mib:,} bytes")
    assert sizes(4 * mib, 3 * mib) == ("4.0 MiB", "3.0 MiB")


def test_a_checkpoint_of_other_shapes_is_refused_in_one_line(one_rank: None, tmp_path: Path) -> None:
    """DCP's load raises a CheckpointException (a BaseException) for a tensor of another shape: it is
    reported as the checkpoint that cannot be loaded, with the rank's own error, not a traceback."""
    import torch

    from pipeoffload.errors import ConfigError
    from pipeoffload.train import checkpoint
    from pipeoffload.train.config import TrainConfig
    from pipeoffload.train.optim import make_optimizer

    named, opt = _model(1)
    path = checkpoint.save(tmp_path, 1, TrainConfig.build(), named, opt, 0, 1, {})
    wider = torch.nn.Linear(8, 16)
    other = {"layers.0.fc.weight": wider.weight, "layers.0.fc.bias": wider.bias}
    with pytest.raises(ConfigError) as info:
        checkpoint.load(path, other, make_optimizer(TrainConfig.build(), list(other.values()), None, 1), 0, 1)
    assert "cannot be loaded onto this layout" in str(info.value) and "ranks:dict_keys" not in str(info.value)
