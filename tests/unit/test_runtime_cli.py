"""``python -m pipeoffload.runtime``: flags are checked once, before any rank starts."""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from pipeoffload import generate
from pipeoffload.errors import ConfigError
from pipeoffload.runtime import PipelineRunner
from pipeoffload.runtime.demo import _lower, check, main, parse


def _run(*flags: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    env.pop("RANK", None)
    return subprocess.run([sys.executable, "-m", "pipeoffload.runtime", *flags], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.parametrize("flags,needle", [
    (("--spawn", "-1"), "--spawn: -1 must be >= 0"),
    (("--spawn", "2", "--schedule", "nope"), "unknown schedule 'nope'"),
    (("--spawn", "2", "--offload", "bogus"), "--offload 'bogus': the policy is not understood"),
    (("--spawn", "2", "--layers", "1", "--schedule", "zb-v"), "--layers 1: zb-v on 2 ranks has 4 stages"),
    (("--spawn", "4", "--layers", "1", "--schedule", "zb-v"), "use --layers 6 or more"),
    (("--spawn", "2", "--microbatches", "4", "--batch", "10"),
     "--batch 10: must be a multiple of --microbatches 4 (equal microbatches of at least one row); use --batch 8"),
    (("--spawn", "2", "--microbatches", "3"), "--batch 8: must be a multiple of --microbatches 3"),
    (("--spawn", "2", "--microbatches", "4", "--batch", "2"), "use --batch 4"),
    ((), "run under torchrun or pass --spawn N"),
    (("--spawn", "2", "--steps", "2", "--trace", "/nonexistent/dir/x.json"),
     "--trace /nonexistent/dir/x.json: folder /nonexistent/dir does not exist"),
    (("--spawn", "2", "--steps", "2", "--trace", "/"), "--trace /: is a folder"),
])
def test_bad_flags_one_line_exit_2(flags, needle, monkeypatch):
    """In this process (``demo.main``, what ``python -m pipeoffload.runtime`` runs): starting Python
    and torch once per case cost 2-10 s each; the process boundary is the next test's."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_:
        main(list(flags))
    assert exit_.value.code == 2, err.getvalue()
    assert needle in err.getvalue() and len(err.getvalue().strip().splitlines()) == 1, err.getvalue()


def test_a_bad_flag_of_the_module_run_is_one_line_exit_2():
    done = _run("--spawn", "2", "--schedule", "nope")
    assert done.returncode == 2, done.stderr
    assert "unknown schedule 'nope'" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr


def test_stages_per_rank_defaults_to_the_family_default():
    args = parse(["--spawn", "2", "--schedule", "zb-v"])
    assert args.stages_per_rank is None
    check(args, 2)
    assert _lower(args, 2).stages_per_rank == 2


def test_zb_v_alone_trains():
    done = _run("--spawn", "2", "--schedule", "zb-v", "--steps", "1", timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "peak activation bytes per rank" in done.stdout


def test_parameterless_stage_without_device_is_a_clear_error():
    schedule = generate("gpipe", 1, 2, 2)
    with pytest.raises(ConfigError, match=r"no parameters or buffers .* device="):
        PipelineRunner({0: nn.Identity(), 1: nn.Identity()}, schedule, 0, loss_fn=nn.functional.mse_loss)
    runner = PipelineRunner({0: nn.Identity(), 1: nn.Identity()}, schedule, 0, loss_fn=nn.functional.mse_loss,
                            device="cpu")
    x = torch.randn(4, 3, requires_grad=False)
    assert runner.step(x, x).item() == 0.0
