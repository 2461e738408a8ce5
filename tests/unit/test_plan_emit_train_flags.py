"""``plan --emit`` plans the run the file starts (train's blocks and state): a flag describing a run train
does not make is refused in one line naming it, not silently dropped; the flags that are train's run pass."""
from __future__ import annotations

from pathlib import Path

import pytest

from pipeoffload.cli import main

PLAN = ["plan", "--layers", "4", "--hidden", "64", "--heads", "4", "--seq", "32", "--vocab", "256", "--gpus", "2",
        "--global-batch", "8", "--memory", "40", "--top", "1", "--no-pareto"]


@pytest.mark.parametrize(("flags", "named", "why"), [
    (["--partial-recompute"], "--partial-recompute", "partial (LGD)"),
    (["--no-sequence-parallel"], "--no-sequence-parallel", "always sequence-parallel"),
    (["--recompute", "selective,none"], "--recompute selective", "selective recomputation"),
])
def test_emit_refuses_a_flag_train_does_not_run(tmp_path: Path, capsys: pytest.CaptureFixture, flags: list[str],
                                                named: str, why: str) -> None:
    path = tmp_path / "run.toml"
    assert main([*PLAN, *flags, "--emit", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{named} with --emit" in err[0] and why in err[0], err
    assert not path.exists()
    assert main([*PLAN, *flags]) == 0  # without --emit the flag plans what it says


@pytest.mark.parametrize("flags", [["--no-distributed-optimizer"], ["--no-partial-recompute"]])
def test_emit_takes_the_flags_train_runs_by(tmp_path: Path, capsys: pytest.CaptureFixture, flags: list[str]) -> None:
    path = tmp_path / "run.toml"
    assert main([*PLAN, *flags, "--emit", str(path)]) == 0
    assert path.exists() and "wrote" in capsys.readouterr().out
