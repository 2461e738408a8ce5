"""A `pipeoffload train` run in a subprocess, for the fault tests: wait for steps, find the ranks' pids
(from train.log), signal them or the launcher."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

SMALL = ["--layers", "2", "--hidden", "32", "--seq-len", "32", "--global-batch", "8", "--microbatches", "2",
         "--eval-every", "1000", "--warmup", "1", "--no-progress"]


class Run:
    """``pipeoffload train`` started in the background with its own TMPDIR (to see the store folder)."""

    def __init__(self, base: Path, out: Path, *args: str, fault: str = "") -> None:
        self.out, self.tmp = out, base / "tmp"
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.stdout, self.stderr = base / f"{out.name}.stdout", base / f"{out.name}.stderr"
        env = {**os.environ, "TMPDIR": str(self.tmp), "OMP_NUM_THREADS": "1"}
        if fault:  # injected by fault_site/sitecustomize.py (PIPEOFFLOAD_TEST_FAULT)
            site = Path(__file__).with_name("fault_site")
            env.update(PIPEOFFLOAD_TEST_FAULT=fault, PYTHONPATH=os.pathsep.join([str(site), env.get("PYTHONPATH", "")]))
        with open(self.stdout, "w") as so, open(self.stderr, "w") as se:
            self.proc = subprocess.Popen([sys.executable, "-m", "pipeoffload", "train", *SMALL, "--out", str(out),
                                          *args], stdout=so, stderr=se, env=env, text=True)

    def steps(self) -> int:
        path = self.out / "metrics.jsonl"
        if not path.is_file():
            return 0
        return sum(1 for line in path.read_text().splitlines() if line.strip() and json.loads(line))

    def wait_steps(self, n: int, limit: float = 300) -> None:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline and self.proc.poll() is None and self.steps() < n:
            time.sleep(0.2)
        assert self.proc.poll() is None and self.steps() >= n, self.output()

    def pids(self) -> dict[int, int]:
        """rank: pid, from the ranks' start-up lines in train.log."""
        text = (self.out / "train.log").read_text()
        return {int(r): int(p) for r, p in re.findall(r"rank (\d+) of \d+: pid (\d+)", text)}

    def signal(self, signum: int) -> float:
        self.proc.send_signal(signum)
        return time.monotonic()

    def wait(self, limit: float = 240) -> int:
        try:
            return self.proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            for pid in self.pids().values():
                kill_quietly(pid)
            raise AssertionError(f"still running after {limit} s: {self.output()}") from None

    def output(self) -> str:
        return self.stdout.read_text()[-2000:] + "\n--- stderr ---\n" + self.stderr.read_text()[-4000:]

    def last_error_line(self) -> str:
        lines = [line for line in self.stderr.read_text().splitlines() if line.strip()]
        return lines[-1] if lines else ""

    def store_folders(self) -> list[Path]:
        return list(self.tmp.glob("pipeoffload-*"))


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (not a zombie waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def wait_dead(pids: list[int], limit: float) -> list[int]:
    """The pids still alive after up to ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
