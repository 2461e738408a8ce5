"""Start-up has its own bound (``--startup-timeout``), apart from ``--timeout``, which bounds the waits from
the first step on; the launcher's grace after SIGINT/SIGTERM is ``--stop-grace``. The runs themselves are in
``tests/dist/test_train_startup_s20.py`` and ``tests/dist/test_train_faults.py``."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeoffload.train.config import TrainConfig, build_config, flag_help, load_toml


def _timeouts(ctx: object, extra: object) -> list[float]:
    """The timeout of the default group, the mesh's groups and ``extra``, in seconds."""
    import torch
    import torch.distributed as dist

    groups = [dist.group.WORLD, ctx.dp_group, ctx.pp_group, ctx.tp_group, extra]  # type: ignore[attr-defined]
    return [g._get_backend(torch.device("cpu")).options._timeout.total_seconds() for g in groups]


def test_the_groups_wait_the_start_up_bound_until_started_then_the_runs(one_rank: None) -> None:
    """The default group joined with the start-up bound (the launcher's, 30 s in ``one_rank``); the mesh's groups
    and a group made during start-up (the tied embedding's) get it too, and all of them --timeout once started."""
    import torch

    from pipeoffload.train.mesh import build_context

    ctx = build_context(1, 1, 1, torch.device("cpu"), timeout=5, startup=30)
    try:
        tied = ctx.new_group([0])
        assert _timeouts(ctx, tied) == [30.0] * 5
        ctx.started()
        assert _timeouts(ctx, tied) == [5.0] * 5
        later = ctx.new_group([0])  # made after start-up (none is today): the run's bound at once
        assert _timeouts(ctx, later)[-1] == 5.0
    finally:
        ctx.close()


def test_without_a_start_up_bound_every_group_keeps_the_runs(one_rank: None) -> None:
    """``build_context(timeout=...)`` alone, as the runtime's own callers use it: one bound throughout."""
    import torch

    from pipeoffload.train.mesh import build_context

    ctx = build_context(1, 1, 1, torch.device("cpu"), timeout=5)
    try:
        group = ctx.new_group([0])
        ctx.started()
        assert _timeouts(ctx, group)[1:] == [5.0] * 4
    finally:
        ctx.close()


def test_the_keys_have_flags_defaults_and_a_run_section(tmp_path: Path) -> None:
    assert "(default 600)" in flag_help("startup_timeout") and "(default 10)" in flag_help("stop_grace")
    assert "first step" in flag_help("timeout") and "first step" in flag_help("startup_timeout")
    toml = tmp_path / "run.toml"
    toml.write_text("[run]\ntimeout = 5\nstartup_timeout = 900\nstop_grace = 30\n")
    cfg = build_config(load_toml(toml))
    assert (cfg.run.timeout, cfg.run.startup_timeout, cfg.run.stop_grace) == (5, 900, 30)
    assert TrainConfig().run.startup_timeout == 600 and TrainConfig().run.stop_grace == 10


@pytest.mark.parametrize("flags, words", [
    (["--startup-timeout", "0.5"], ["startup_timeout=0.5", ">= 1", "e.g. --startup-timeout 1800"]),
    (["--startup-timeout", "inf"], ["--startup-timeout", "finite"]),
    (["--stop-grace", "1e300"], ["stop_grace=1e+300", "a week", "--stop-grace"]),
    (["--stop-grace", "x"], ["--stop-grace", "x"]),
])
def test_a_bad_bound_is_one_line_and_exit_2(tmp_path: Path, flags: list[str], words: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "pipeoffload", "train", "--out", str(tmp_path / "run"), *flags],
                          capture_output=True, text=True, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert all(w in lines[0] for w in words), lines[0]
    assert not (tmp_path / "run").exists()
