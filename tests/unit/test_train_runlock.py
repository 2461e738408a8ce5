"""The run directory's lock: a second holder is refused naming the first's pid and host; a lock
file left by a dead process is not a lock."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

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
