"""Faults the review of the seventeenth session found (2 gloo ranks, a few seconds each)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist

HERE = Path(__file__).parent


def test_a_rank_function_whose_result_cannot_be_pickled_fails_naming_it() -> None:
    """``spawn`` pickles each rank's result to send it back. The pickling used to run after the rank had
    registered its exit 0: the error left the rank with code 0 and no result, and torch's agent waited for
    that result for ever (past ``deadline``). Now the rank fails with the pickling error, named in the
    verdict. Run in a subprocess so that the old hang fails the test rather than stopping the suite."""
    code = ("from failure_workers_s17 import returns_an_unpicklable_value as fn\n"
            "from pipeoffload.runtime.launch import spawn\n"
            "r = spawn(fn, 2, timeout=20, deadline=60, grace=5)\n"
            "print('ok', r.ok)\nprint('summary', r.summary())\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=150, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("spawn did not return: a rank's unpicklable result hung the launcher")
    assert "ok False" in done.stdout, done.stdout + done.stderr[-2000:]
    summary = next(line for line in done.stdout.splitlines() if line.startswith("summary"))
    assert "cannot pickle" in summary and "_thread.lock" in summary, summary


TINY = ["--layers", "2", "--hidden", "32", "--seq-len", "32", "--global-batch", "8", "--microbatches", "4",
        "--tokenizer", "byte"]


def test_sigterm_while_a_one_process_run_loads_its_checkpoint_stops_it_after_a_step(tmp_path: Path) -> None:
    """One rank in the CLI's own process: a SIGTERM during the resume's checkpoint load used to raise the
    CLI's ``Interrupted`` inside the load, reported as "checkpoint ... cannot be loaded onto this layout:
    Interrupted" (exit 2: blaming a sound checkpoint). The trainer's handler is now in place before the
    resume, as a spawned rank records a signal from its start: the run finishes a step, saves, exits 143."""
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    first = subprocess.run([sys.executable, "-m", "pipeoffload", "train", "--nproc", "1", "--steps", "4",
                            "--save-every", "2", "--stop-at", "2", "--out", str(run), *TINY],
                           capture_output=True, text=True, timeout=300, env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    code = ("import sys\nfrom failure_workers_s17 import resume_signalled_while_loading as resume\n"
            f"sys.exit(resume({str(run)!r}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert "cannot be loaded" not in done.stderr, done.stderr[-2000:]
    assert done.returncode == 143, (done.returncode, done.stdout[-1000:], done.stderr[-2000:])
    assert "interrupted (SIGTERM): saved checkpoint at step 3" in done.stdout, done.stdout[-1000:]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000002", "step-000003"]


def test_a_data_source_without_validation_batches_is_refused_not_a_val_loss_of_0() -> None:
    """``batches.val`` giving no batch used to log val_loss 0.0 at every validation (a mean over no losses,
    read as a perfect model); it now stops the run naming the call, as a failing ``val`` does."""
    import torch.nn.functional as F
    from failure_workers_s17 import batches_without_validation
    from train_workers import plain_layers

    from pipeoffload.train import TrainConfig, train_model
    from pipeoffload.train.launch import RankFailure

    cfg = TrainConfig.build(schedule="1f1b", pp=2, nproc=2, microbatches=2, global_batch=8, steps=2, timeout=30,
                            progress=False)
    with pytest.raises(RankFailure) as err:
        history = train_model(cfg, plain_layers, F.cross_entropy, batches_without_validation)["history"]
        pytest.fail(f"trained, with val losses {[h['val_loss'] for h in history]}")
    assert ("DataError: reading the validation batches after step 1 failed on rank 0: the batches' val(dp_rank=0) "
            "gave none") in str(err.value), str(err.value)
