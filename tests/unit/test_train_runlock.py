"""The run directory's lock: a second holder is refused naming the first's pid and host; a lock
file left by a dead process is not a lock; what the lock made goes with it, and never while another
launcher can take it (session 18)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from pipeoffload.errors import ConfigError
from pipeoffload.train.runlock import RunLock

HOLD = "import sys, time; from pathlib import Path; from pipeoffload.train.runlock import RunLock\n" \
       "with RunLock(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(60)\n"


def test_a_second_run_is_refused_naming_the_first(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError) as info:
            RunLock(tmp_path).acquire()
        assert f"pid {holder.pid} on host {socket.gethostname()}" in str(info.value)
        assert "--out" in str(info.value)
    finally:
        holder.kill()
        holder.wait()
    with RunLock(tmp_path):  # the kernel released the dead holder's lock: not stale
        assert (tmp_path / ".lock").read_text().split()[0] == str(os.getpid())


def test_a_lock_file_of_a_dead_process_is_taken_over(tmp_path: Path) -> None:
    (tmp_path / ".lock").write_text(f"999999999 {socket.gethostname()}\n")
    with RunLock(tmp_path):
        pass
    assert (tmp_path / ".lock").read_text() == ""  # released


# ---- removing what the lock made, with other launchers in between (session 18) -----------------------------
def _paused(monkeypatch: pytest.MonkeyPatch, module: object, name: str, thread: str) -> tuple[Any, Any]:
    """Pause thread ``thread`` at its first call of ``module.name`` (os.open, fcntl.flock: the real calls)
    until the test lets it go; (reached, go) events."""
    real = getattr(module, name)
    reached, go = threading.Event(), threading.Event()

    def call(*args: Any) -> Any:
        if threading.current_thread().name == thread and not reached.is_set():
            reached.set()
            assert go.wait(30)
        return real(*args)

    monkeypatch.setattr(module, name, call)
    return reached, go


def _in_thread(name: str, lock: RunLock) -> tuple[threading.Thread, list[BaseException | None]]:
    outcome: list[BaseException | None] = []

    def acquire() -> None:
        try:
            lock.acquire()
            outcome.append(None)
        except BaseException as err:  # noqa: BLE001 - handed to the test
            outcome.append(err)

    thread = threading.Thread(target=acquire, name=name)
    thread.start()
    return thread, outcome


def test_a_launcher_that_opened_the_lock_before_its_release_never_locks_the_removed_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The holder made the folder and the lock file, so its release removes both. A launcher that opened the
    file just before that release and locks it just after held a file no longer in the folder (the folder gone
    too), and a fourth launcher made a new one and ran beside it."""
    from pipeoffload.train import runlock

    run = tmp_path / "run"
    first = RunLock(run)
    first.acquire()
    reached, go = _paused(monkeypatch, runlock.fcntl, "flock", "third")
    third = RunLock(run)
    thread, outcome = _in_thread("third", third)
    assert reached.wait(30)  # the third has the file open, about to lock it
    first.release()
    go.set()
    thread.join(30)
    assert outcome == [None]
    try:
        assert (run / ".lock").read_text().split()[0] == str(os.getpid())  # the file at the path is held
        with pytest.raises(ConfigError, match="is in use by a running training run"):
            RunLock(run).acquire()
    finally:
        third.release()
    assert not run.exists()  # made again by the third, removed with its lock


def test_a_refused_launcher_never_removes_the_lock_of_the_run_that_holds_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A launcher that found no folder, then lost the race for the lock, removed the winner's lock file and
    folder as its own: a third launcher then ran beside the winner."""
    from pipeoffload.train import runlock

    run = tmp_path / "run"
    reached, go = _paused(monkeypatch, runlock.os, "open", "second")
    thread, outcome = _in_thread("second", RunLock(run))
    assert reached.wait(30)  # the second found no folder and is about to open the lock file
    with RunLock(run):
        go.set()
        thread.join(30)
        assert len(outcome) == 1 and isinstance(outcome[0], ConfigError), outcome
        assert "is in use by a running training run" in str(outcome[0])
        assert (run / ".lock").read_text().split()[0] == str(os.getpid())
        with pytest.raises(ConfigError, match="is in use by a running training run"):
            RunLock(run).acquire()
    assert list(run.iterdir()) == []  # the lock's file went with it (the folder is the refused launcher's)


STRESS = """
import os, sys
from pathlib import Path
from pipeoffload.errors import ConfigError
from pipeoffload.train.runlock import RunLock
run, marker, rounds = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
held = bad = 0
while held < rounds:
    lock = RunLock(run)
    try:
        lock.acquire()
    except ConfigError:
        continue
    held += 1
    try:
        os.mkdir(marker)  # fails where another process holds the lock as well
    except FileExistsError:
        bad += 1
    else:
        fd = lock._fd
        try:
            here, there = os.fstat(fd), os.stat(run / ".lock")
            bad += (here.st_ino, here.st_dev) != (there.st_ino, there.st_dev)
        except FileNotFoundError:
            bad += 1
        os.rmdir(marker)
    lock.release()
print(bad)
"""


def test_launchers_starting_and_ending_at_once_never_hold_the_lock_together(tmp_path: Path) -> None:
    """Real processes taking and releasing the lock of a folder that holds only the lock, as fast as they can:
    each holder checks that it alone holds it (a marker folder outside) and that its file is the folder's."""
    run, marker = tmp_path / "run", tmp_path / "held"
    procs = [subprocess.Popen([sys.executable, "-c", STRESS, str(run), str(marker), "300"], stdout=subprocess.PIPE,
                              text=True) for _ in range(4)]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4
    assert [int(out) for out in outs] == [0] * 4
    assert not (run / ".lock").exists() or (run / ".lock").read_text() == ""  # released (its maker may be a refused one)
