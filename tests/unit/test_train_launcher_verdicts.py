"""The launcher's last line when a spawned rank fails: the likely cause of a SIGBUS (a memory-mapped
--data file that shrank), where the rank's Python stack went, and the way on from the last checkpoint.
``spawn`` is replaced by its result, so no rank starts."""
from __future__ import annotations

import signal
from pathlib import Path

import pytest

from pipeoffload.train.config import build_config


def _failed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, errors: list[str | None], codes: list[int | None],
            culprit: int | None, faults: dict[int, str] | None = None, **keys: object) -> str:
    import pipeoffload.runtime.launch as runtime
    from pipeoffload.runtime.launch import SpawnResult
    from pipeoffload.train import launch

    dumps = {"faults": faults} if faults else {}
    monkeypatch.setattr(runtime, "spawn", lambda *a, **k: SpawnResult(
        exitcodes=codes, results=[None] * len(codes), errors=errors, culprit=culprit, **dumps))
    cfg = build_config({"pp": 2, "nproc": 2, "out": str(tmp_path), **keys})
    with pytest.raises(launch.RankFailure) as info:
        launch._spawned(lambda *a: None, cfg, (), False)
    return str(info.value)


def _checkpoints(run: Path, *steps: int) -> None:
    for step in steps:
        (run / "checkpoints" / f"step-{step:06d}").mkdir(parents=True)


def test_a_killed_rank_names_the_last_checkpoint_and_the_resume_command(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _checkpoints(tmp_path, 40, 44)
    message = _failed(monkeypatch, tmp_path, [None, "rank 1 (pid 7) was killed by signal SIGKILL"], [1, -9], 1)
    assert message.startswith("rank 1 (pid 7) was killed by signal SIGKILL; the last complete checkpoint is "), message
    assert message.endswith(f"step-000044; continue with: pipeoffload train --resume {tmp_path}"), message
    log = (tmp_path / "train.log").read_text().splitlines()[-1]
    assert "[launcher] ERROR run failed: " in log and f"--resume {tmp_path}" in log, log


def test_without_a_checkpoint_or_for_the_users_input_no_resume_command(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    stopped = "rank 1 (pid 7) was stopped (SIGSTOP) for 20 s (--timeout): killed"
    assert "continue with" not in _failed(monkeypatch, tmp_path, [None, stopped], [1, -9], 1)
    _checkpoints(tmp_path, 4)
    config = _failed(monkeypatch, tmp_path, ["ConfigError: data='x': no such file\n\nTraceback", None], [1, 1], None)
    diverged = _failed(monkeypatch, tmp_path, ["NonFiniteError: step 5: loss nan\n\nTraceback", None], [1, 1], None)
    assert "continue with" not in config and "continue with" not in diverged, (config, diverged)


def test_sigbus_with_a_memory_mapped_data_file_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "tokens.bin"
    data.write_bytes(b"\0" * 64)
    bus = f"rank 1 (pid 7) was killed by signal {signal.SIGBUS.name}"
    dumps = {0: "Fatal Python error: Bus error\n\nThread A", 1: "Fatal Python error: Bus error\n\nThread B"}
    message = _failed(monkeypatch, tmp_path, [bus.replace("1 (pid 7)", "0 (pid 6)"), bus], [-7, -7], 1, dumps,
                      data=str(data))
    assert message == (f"{bus}: a memory-mapped --data file ({data}) changed or was truncated during the run; do not "
                       f"modify it while training (the rank's Python stack is in {tmp_path / 'train.log'})"), message
    log = (tmp_path / "train.log").read_text()  # each rank's dump whole, one after the other, then the verdict
    assert log.index("rank 0 crashed; its Python stack (faulthandler):\nFatal Python error: Bus error\n\nThread A\n") \
        < log.index("rank 1 crashed; its Python stack (faulthandler):\nFatal Python error: Bus error\n\nThread B\n") \
        < log.index("[launcher] ERROR run failed: " + bus), log
    text = tmp_path / "text.txt"
    text.write_text("words " * 100)  # tokenized into memory: no file behind the tokens, no such cause
    other = _failed(monkeypatch, tmp_path, [None, bus], [1, -signal.SIGBUS], 1, data=str(text))
    assert other == bus, other  # and no dump: nothing said of one
