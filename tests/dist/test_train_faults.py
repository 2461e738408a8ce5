"""Faults of a running `pipeoffload train` (4 gloo ranks): a stopped or killed rank, Ctrl-C, a killed
launcher. Every process must exit within --timeout plus a few seconds, naming the rank by its global
number; nothing may be left running or behind."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from faults import Run, alive, kill_quietly, wait_dead

pytestmark = pytest.mark.dist

# --timeout: the waits from the first step on (a tiny model's step takes well under a second at load 10); start-up,
# 4 ranks importing torch on a loaded 2-core machine, has --startup-timeout. Each stop test waits it out.
TIMEOUT = 5
STARTUP = 300  # --startup-timeout: long, and yet the stopped rank is found within --timeout
BOUND = TIMEOUT + 10  # every process gone this long after the fault (the promise)
STOP_GRACE = 3  # --stop-grace of the Ctrl-C tests whose ranks cannot finish their step (a stopped peer)


SLOW = 2 * TIMEOUT  # a start-up wait longer than --timeout: rank 0 loads its data this late (fault_site)


@pytest.mark.parametrize("how,rank,layout,fault", [
    # its pipeline peer 0 and its data-parallel peer 3 wait on it; the run started slowly: rank 0 loaded its data
    # SLOW s late while the others waited in the trainer's first collective, within --startup-timeout
    ("stop", 1, ["--pp", "2", "--dp", "2"], f"corpus:0:sleep{SLOW}"),
    ("kill", 2, ["--pp", "2", "--dp", "2"], ""),
    ("stop", 3, ["--pp", "2", "--tp", "2"], ""),  # a tensor-parallel peer
])
def test_a_stopped_or_killed_rank_ends_the_run_naming_it(tmp_path: Path, how: str, rank: int, layout: list[str],
                                                         fault: str) -> None:
    """Found within --timeout, though --startup-timeout is long (and start-up took longer than --timeout)."""
    run = Run(tmp_path, tmp_path / "run", "--nproc", "4", *layout, "--steps", "100000", "--save-every", "100000",
              "--timeout", str(TIMEOUT), "--startup-timeout", str(STARTUP), fault=fault)
    run.wait_steps(2)
    if fault:  # the slow start-up happened, and the run survived it
        assert f"[fault_site] rank 0: sleep{SLOW} at step 0" in run.stderr.read_text(), run.output()
    pids = run.pids()
    assert sorted(pids) == [0, 1, 2, 3], run.output()
    hit = time.monotonic()
    kill_quietly(pids[rank]) if how == "kill" else os.kill(pids[rank], signal.SIGSTOP)
    code = run.wait()
    took = time.monotonic() - hit
    try:
        assert code == 1, run.output()
        assert took < BOUND, (took, run.output())
        assert not [p for p in pids.values() if alive(p)], run.output()
        last = run.last_error_line()
        assert f"rank {rank} " in last and ("stopped" if how == "stop" else "SIGKILL") in last, run.output()
        assert "Traceback" not in run.stderr.read_text(), run.output()
        assert not run.store_folders()
        log = (run.out / "train.log").read_text()
        assert "[launcher] ERROR run failed" in log and f"rank {rank} " in log.splitlines()[-1]
    finally:
        for p in pids.values():
            kill_quietly(p)


def test_ctrl_c_with_a_stopped_rank_stops_everything(tmp_path: Path) -> None:
    """The hang of the issue: one rank stopped, then Ctrl-C. The ranks cannot finish their step, so
    the launcher kills them after its grace (--stop-grace): exit 130, 'interrupted'."""
    run = Run(tmp_path, tmp_path / "run", "--nproc", "4", "--pp", "2", "--dp", "2", "--steps", "100000",
              "--save-every", "100000", "--timeout", "300", "--stop-grace", str(STOP_GRACE))
    run.wait_steps(2)
    pids = run.pids()
    os.kill(pids[1], signal.SIGSTOP)
    time.sleep(1)
    hit = run.signal(signal.SIGINT)
    code = run.wait()
    took = time.monotonic() - hit
    try:
        assert code == 130, run.output()
        assert took < 25, (took, run.output())  # the launcher's grace, --stop-grace, is 3 s
        assert "interrupted" in run.last_error_line(), run.output()
        assert "Traceback" not in run.stderr.read_text(), run.output()
        assert not [p for p in pids.values() if alive(p)], run.output()
    finally:
        for p in pids.values():
            kill_quietly(p)


def test_ctrl_c_saves_and_exits_130(tmp_path: Path) -> None:
    run = Run(tmp_path, tmp_path / "run", "--nproc", "2", "--pp", "2", "--steps", "100000", "--save-every", "100000")
    run.wait_steps(2)
    run.signal(signal.SIGINT)
    code = run.wait()
    assert code == 130, run.output()
    out = run.stdout.read_text()
    assert "interrupted" in out and "--resume" in out, run.output()
    assert "Traceback" not in run.stderr.read_text() and "KeyboardInterrupt" not in run.stderr.read_text()


def test_sigterm_during_start_up_says_interrupted(tmp_path: Path) -> None:
    run = Run(tmp_path, tmp_path / "run", "--nproc", "2", "--pp", "2", "--steps", "100000")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (run.out / "train.log").is_file():  # ranks are starting
        time.sleep(0.05)
    run.signal(signal.SIGTERM)
    code = run.wait()
    assert code == 128 + signal.SIGTERM, run.output()
    # the ranks take the signal up once their trainer runs (it is recorded, not lost, while they start): they
    # finish step 1 and save; where they take longer than the launcher's 10 s to start, they are killed
    saved = "interrupted (SIGTERM): saved checkpoint at step 1" in run.stdout.read_text()
    assert saved or ("interrupted" in run.last_error_line() and "codes" not in run.last_error_line()), run.output()
    assert "Traceback" not in run.stderr.read_text(), run.output()


def test_killing_the_launcher_ends_its_ranks_and_leaves_no_store_folder(tmp_path: Path) -> None:
    """One rank is stopped first: it runs no handler, so a live peer must kill it."""
    run = Run(tmp_path, tmp_path / "run", "--nproc", "4", "--pp", "2", "--dp", "2", "--steps", "100000",
              "--save-every", "100000")
    run.wait_steps(2)
    pids = run.pids()
    assert run.store_folders()  # the spawned ranks' FileStore folder, under this run's TMPDIR
    os.kill(pids[2], signal.SIGSTOP)
    run.proc.kill()
    run.proc.wait()
    try:
        assert wait_dead(list(pids.values()), 10) == []
        steps = run.steps()
        time.sleep(2)
        assert run.steps() == steps  # nobody trains on, unsupervised
        assert not run.store_folders()
    finally:
        for p in pids.values():
            kill_quietly(p)


def test_a_second_run_on_the_same_out_is_refused(tmp_path: Path) -> None:
    first = Run(tmp_path, tmp_path / "run", "--nproc", "2", "--pp", "2", "--steps", "100000", "--seed", "0")
    first.wait_steps(2)
    try:
        second = Run(tmp_path / "b", tmp_path / "run", "--nproc", "2", "--pp", "2", "--steps", "100000",
                     "--seed", "1")
        assert second.wait() == 2, second.output()
        lines = second.stderr.read_text().strip().splitlines()
        assert len(lines) == 1 and f"pid {first.proc.pid} on host" in lines[0], second.output()
        assert "seed = 0" in (first.out / "config.toml").read_text()  # nothing of the second run written
        assert first.proc.poll() is None
    finally:
        first.signal(signal.SIGTERM)
        first.wait()


def test_one_signal_delivered_twice_is_not_a_second_signal(tmp_path: Path) -> None:
    """`kill -TERM -- -PGID` under `timeout`: the launcher gets the group's SIGTERM and `timeout`'s copy
    of it milliseconds apart. That is one request to stop: the ranks finish the step and save (the
    second copy killed them mid-save: 'there is no checkpoint to resume from')."""
    run = Run(tmp_path, tmp_path / "run", "--nproc", "2", "--pp", "2", "--steps", "100000", "--save-every", "100000")
    run.wait_steps(2)
    run.signal(signal.SIGTERM)
    time.sleep(0.3)  # two deliveries, each seen by the launcher's handler (not merged into one by Python)
    run.signal(signal.SIGTERM)
    code = run.wait()
    assert code == 128 + signal.SIGTERM, run.output()
    out, err = run.stdout.read_text(), run.stderr.read_text()
    assert "saved checkpoint at step" in out and "--resume" in out, run.output()
    assert "received SIGTERM again" in err and "Traceback" not in err, run.output()
    assert "[launcher] WARNING" in (run.out / "train.log").read_text()


def test_a_second_signal_kills_the_ranks_and_says_so(tmp_path: Path) -> None:
    """A rank stopped, so the run cannot finish its step; a second Ctrl-C (past the repeat window) kills
    the ranks at once. The last line says the second signal did it, and names the checkpoint on disk;
    train.log ends with the same verdict."""
    run = Run(tmp_path, tmp_path / "run", "--nproc", "2", "--pp", "2", "--steps", "100000", "--save-every", "1",
              "--timeout", "300")
    run.wait_steps(2)
    pids = run.pids()
    try:
        os.kill(pids[1], signal.SIGSTOP)
        time.sleep(0.5)
        run.signal(signal.SIGINT)
        time.sleep(1.5)
        hit = run.signal(signal.SIGINT)
        code = run.wait()
        took = time.monotonic() - hit
        assert code == 130, run.output()
        assert took < 8, (took, run.output())  # at once, not after the launcher's 10 s grace
        last = run.last_error_line()
        assert "interrupted (SIGINT), then a second signal (SIGINT) killed the ranks" in last, run.output()
        assert "the last complete checkpoint is" in last and "--resume" in last, run.output()
        assert "Traceback" not in run.stderr.read_text(), run.output()
        log_last = (run.out / "train.log").read_text().splitlines()[-1]
        assert "[launcher] ERROR run interrupted: interrupted (SIGINT), then a second signal" in log_last, log_last
        assert not [p for p in pids.values() if alive(p)], run.output()
    finally:
        for p in pids.values():
            kill_quietly(p)


def test_a_data_file_truncated_during_the_run_is_named(tmp_path: Path) -> None:
    """The ranks memory-map a --data token file; truncated under them, the next read is a SIGBUS. The
    last line names the file and the fix, and the way on from the last checkpoint; faulthandler's dump
    of the crashed rank (torch's agent enables it) goes to train.log, not the terminal."""
    import numpy as np

    data = tmp_path / "tokens.bin"
    np.random.default_rng(0).integers(0, 256, 200_000).astype(np.uint16).tofile(data)
    run = Run(tmp_path, tmp_path / "run", "--nproc", "2", "--pp", "2", "--steps", "100000", "--save-every", "1",
              "--data", str(data))
    run.wait_steps(2)
    pids = run.pids()
    try:
        os.truncate(data, 0)
        code = run.wait()
        assert code == 1, run.output()
        last, err = run.last_error_line(), run.stderr.read_text()
        assert "was killed by signal SIGBUS: a memory-mapped --data file (" in last, run.output()
        assert f"({data}) changed or was truncated during the run; do not modify it while training" in last, last
        assert "the last complete checkpoint is" in last and f"--resume {run.out}" in last, last
        assert "Fatal Python error" not in err and "Traceback" not in err, run.output()
        log = (run.out / "train.log").read_text()
        assert "Fatal Python error: Bus error" in log and "in window" in log, log[-3000:]
        assert f"(the rank's Python stack is in {run.out / 'train.log'})" in last, last
    finally:
        for p in pids.values():
            kill_quietly(p)
