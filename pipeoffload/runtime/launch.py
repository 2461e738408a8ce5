"""Starting pipeline processes: under ``torchrun`` (environment variables) or spawned from Python.

``spawn`` starts one process per rank with the ``spawn`` start method, joins them through a
``FileStore`` in a private temporary directory (no port to choose, so parallel runs cannot clash),
runs ``fn(rank, world_size, *args)`` in each, and returns what every rank returned or raised.

The launcher supervises (``_Supervisor``): every wait is bounded (``deadline``); once a rank has
failed the others get ``grace`` seconds; a rank stopped (SIGSTOP) for ``timeout`` seconds is killed
and blamed; with ``forward_signals`` SIGINT/SIGTERM go to the ranks, which get ``stop_grace``
seconds to stop (a second signal kills them at once). The ranks die with their launcher: a
parent-death signal (Linux ``prctl``) plus a thread watching the launcher's pid, either of which
removes the store folder and exits.
"""
from __future__ import annotations

import ctypes
import datetime
import logging
import multiprocessing as mp
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

import torch
import torch.distributed as dist

PR_SET_PDEATHSIG = 1  # linux/prctl.h
ORPHAN_SIGNAL = signal.SIGUSR2  # sent to a rank when its launcher dies; its handler cleans up and exits
_POLL = 0.05


def exit_rank(code: int) -> NoReturn:
    """End a torchrun rank that has finished (its process group destroyed): flush the output, then
    ``os._exit``. Interpreter teardown is skipped because gloo's worker threads may still hold
    tensors whose release at finalisation aborts the process ("terminate called without an active
    exception", seen about once in a few hundred runs), which torchrun reports as a failed job."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be said
            pass
    os._exit(code)


def init_from_env(backend: str | None = None, timeout: float = 300.0) -> tuple[int, int, torch.device]:
    """Initialise the default process group from torchrun's variables; returns (rank, world, device).

    NCCL and one GPU per local rank when CUDA is available, else gloo on CPU."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout))
    return rank, world, device


@dataclass
class SpawnResult:
    exitcodes: list[int | None]
    results: list[Any]
    errors: list[str | None]
    seconds: list[float] = field(default_factory=list)  # per rank, from start to exit (or kill)
    interrupted: int = 0  # the signal (SIGINT/SIGTERM) that asked the run to stop, 0 if none
    culprit: int | None = None  # the rank whose own fault ended the run: killed by a signal, or stopped
    pids: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(code == 0 for code in self.exitcodes)

    def summary(self) -> str:
        """One line blaming the rank where the failure started: a rank killed or stopped from outside,
        then a rank's own error (a ``ConfigError`` first) before errors that are consequences of a
        peer's death (lost connections, timeouts)."""
        if self.culprit is not None and (self.errors[self.culprit] or "").strip():
            return (self.errors[self.culprit] or "").strip().splitlines()[-1]  # the launcher's note
        found = [(r, e) for r, e in enumerate(self.errors) if e]
        if not found:
            return f"ranks exited with codes {self.exitcodes}"
        own = [(r, e) for r, e in found if not _consequence(e)]
        for r, e in own or found:
            if e.startswith("ConfigError"):
                return f"rank {r}: {e.splitlines()[0]}"
        r, e = (own or found)[0]
        return f"rank {r}: {e.splitlines()[0]}"


_CONSEQUENCES = ("connection reset", "connection closed", "lost the connection", "timed out", "peererror",
                 "still running: killed", "stopped responding", "broken pipe")


def _consequence(error: str) -> bool:
    """Whether a rank's error only reports that a peer went away (the peer is the one to blame)."""
    first = error.split("\n\n")[0].lower()
    return any(word in first for word in _CONSEQUENCES)


# ---- inside a rank -----------------------------------------------------------------------------------
def _child(fn: Callable[..., Any], rank: int, world: int, args: tuple, folder: str, backend: str,
           timeout: float, threads: int, launcher: int = 0) -> None:
    code = 0
    try:
        if launcher:
            die_with_launcher(launcher, folder, rank)
        # the launcher started us with SIGINT ignored (no traceback from a Ctrl-C during start-up);
        # from here a KeyboardInterrupt is reported like any error
        signal.signal(signal.SIGINT, signal.default_int_handler)
        torch.set_num_threads(threads)
        dist.init_process_group(backend, init_method=f"file://{folder}/store", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout))
        result = fn(rank, world, *args)
        with open(f"{folder}/result-{rank}.pkl", "wb") as fh:
            pickle.dump(result, fh)
    except BaseException as exc:  # noqa: BLE001 - report anything, then exit non-zero
        code = 1
        try:
            with open(f"{folder}/error-{rank}.txt", "w") as fh:
                fh.write(f"{type(exc).__name__}: {exc}\n\n{traceback.format_exc()}")
        except OSError:  # the folder is gone with the launcher
            pass
    os._exit(code)  # skip interpreter teardown: a peer that died must not hang our exit


def die_with_launcher(launcher: int, folder: str, rank: int, poll: float = 0.5) -> None:
    """End this rank when the launcher ``launcher`` (our parent) dies, removing the store ``folder``.

    Two ways, because each can miss: the kernel's parent-death signal (Linux), handled in the main
    thread once it runs Python, and a thread that polls our parent pid (a rank blocked in a C++
    collective runs no Python handler, but the collective releases the GIL). A stopped peer (SIGSTOP)
    handles neither, so each rank records its pid in ``folder`` and the first orphan kills its peers."""
    _record_pid(folder, rank)

    def orphaned(*_: Any) -> None:
        _kill_peers(folder)
        shutil.rmtree(folder, ignore_errors=True)
        try:
            os.write(2, f"pipeoffload: rank process {os.getpid()}: launcher {launcher} is gone; exiting\n".encode())
        finally:
            os._exit(1)

    signal.signal(ORPHAN_SIGNAL, orphaned)
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(ORPHAN_SIGNAL), 0, 0, 0)
        except (OSError, AttributeError):  # no prctl: the thread below still watches
            pass

    def watch() -> None:
        while True:
            if os.getppid() != launcher:
                orphaned()
            time.sleep(poll)

    if os.getppid() != launcher:  # it died before the signal was armed
        orphaned()
    threading.Thread(target=watch, name="pipeoffload-launcher-watch", daemon=True).start()


def _started(pid: int) -> str:
    """The process's start time from /proc (clock ticks since boot), '' where unknown: with the pid,
    it names one process, never a later one that reuses the pid."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _record_pid(folder: str, rank: int) -> None:
    pid = os.getpid()
    try:
        with open(f"{folder}/pid-{rank}", "w") as fh:
            fh.write(f"{pid} {_started(pid)}")
    except OSError:  # the folder is gone with the launcher: orphaned() follows
        pass


def _kill_peers(folder: str) -> None:
    """SIGKILL every other rank recorded in ``folder`` that is still the same process (SIGKILL ends a
    stopped process too)."""
    try:
        names = [n for n in os.listdir(folder) if n.startswith("pid-")]
    except OSError:
        return
    for name in names:
        try:
            with open(os.path.join(folder, name)) as fh:
                pid_text, started = fh.read().split()
            pid = int(pid_text)
            if pid != os.getpid() and started and _started(pid) == started:
                os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError):  # gone already, or a half-written record
            pass


# ---- the launcher ------------------------------------------------------------------------------------
def _state(pid: int) -> str:
    """The process state letter from /proc ('T': stopped), or '' where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


class _Supervisor:
    """Watches the rank processes until all have exited or been killed; see the module docstring."""

    def __init__(self, procs: list[Any], timeout: float, deadline: float, grace: float | None,
                 stop_grace: float) -> None:
        self.procs, self.timeout, self.deadline, self.grace, self.stop_grace = procs, timeout, deadline, grace, stop_grace
        self.start = time.monotonic()
        self.seconds = [0.0] * len(procs)
        self.notes: dict[int, str] = {}  # rank: why the launcher killed it, or how it died
        self.killed: set[int] = set()
        self.culprit: int | None = None
        self.failed_at: float | None = None
        self.signal = 0
        self.signalled_at: float | None = None
        self.kill_now = False
        self._stopped_since: dict[int, float] = {}
        self._next_probe = 0.0

    # signal handler (main thread)
    def on_signal(self, signum: int, _frame: Any) -> None:
        if self.signal:  # a second Ctrl-C: stop waiting
            self.kill_now = True
            return
        self.signal, self.signalled_at = signum, time.monotonic()
        for p in self.procs:
            if p.exitcode is None and p.pid:
                try:
                    os.kill(p.pid, signum)
                except ProcessLookupError:
                    pass

    def _limit(self) -> float:
        limit = self.start + self.deadline
        if self.failed_at is not None and self.grace is not None:
            limit = min(limit, self.failed_at + self.grace)
        if self.signalled_at is not None:
            limit = min(limit, self.signalled_at + self.stop_grace)
        return limit

    def _blame(self, rank: int, note: str) -> None:
        self.notes[rank] = note
        if self.culprit is None and not self.signal:
            self.culprit = rank

    def _reap(self, pending: set[int], now: float) -> None:
        for r in list(pending):
            code = self.procs[r].exitcode
            if code is None:
                continue
            self.seconds[r] = now - self.start
            pending.discard(r)
            if code < 0 and r not in self.killed:  # killed from outside (OOM killer, kill -9)
                name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
                self._blame(r, f"rank {r} (pid {self.procs[r].pid}) was killed by signal {name}")
            if code != 0 and self.failed_at is None:
                self.failed_at = now

    def _probe_stopped(self, pending: set[int], now: float) -> None:
        """Kill (and blame) a rank that has been stopped (SIGSTOP, Ctrl-Z of one process) for ``timeout``:
        it would never exit by itself, and its peers only learn that one of them is silent."""
        if now < self._next_probe:
            return
        self._next_probe = now + 0.5
        for r in list(pending):
            if _state(self.procs[r].pid) != "T":
                self._stopped_since.pop(r, None)
                continue
            since = self._stopped_since.setdefault(r, now)
            if now - since >= self.timeout:
                self._blame(r, f"rank {r} (pid {self.procs[r].pid}) was stopped (SIGSTOP) for {self.timeout:g} s "
                               "(--timeout): killed")
                self._kill(r)
                if self.failed_at is None:
                    self.failed_at = now

    def _kill(self, r: int) -> None:
        self.killed.add(r)
        self.procs[r].kill()

    def run(self) -> set[int]:
        """Wait; returns the ranks killed because they did not exit in time."""
        pending = set(range(len(self.procs)))
        while pending and not self.kill_now and time.monotonic() < self._limit():
            now = time.monotonic()
            self._reap(pending, now)
            if pending:
                self._probe_stopped(pending, now)
            time.sleep(_POLL)
        now = time.monotonic()
        self._reap(pending, now)
        late = set(pending)
        for r in pending:
            self._kill(r)
        for r in pending:
            self.procs[r].join(5)
            self.seconds[r] = time.monotonic() - self.start
        return late

    def why_late(self) -> str:
        if self.kill_now:
            return "a second signal"
        if self.signalled_at is not None and self.failed_at is None:
            return f"{self.stop_grace:g} s after the signal"
        if self.failed_at is not None and self.grace is not None:
            return f"{self.grace:g} s after a rank failed"
        return f"the {self.deadline:.0f} s deadline"


def spawn(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple = (),
    *,
    backend: str = "gloo",
    timeout: float = 60.0,
    deadline: float = 300.0,
    threads: int = 1,
    grace: float | None = None,
    forward_signals: bool = False,
    stop_grace: float = 10.0,
) -> SpawnResult:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes; collect the results.

    ``timeout`` is the process group's (and how long a stopped rank is tolerated); ``deadline``
    bounds the whole run (stragglers are killed); ``grace``: once a rank has failed, the others get
    this many seconds to exit before being killed. ``forward_signals``: SIGINT/SIGTERM received here
    are sent to the ranks, which get ``stop_grace`` seconds to exit (``SpawnResult.interrupted``)."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="pipeoffload-") as folder:
        procs = [
            ctx.Process(target=_child, args=(fn, r, world_size, args, folder, backend, timeout, threads, os.getpid()),
                        daemon=True)
            for r in range(world_size)
        ]
        sup = _Supervisor(procs, timeout, deadline, grace, stop_grace)
        main_thread = threading.current_thread() is threading.main_thread()
        previous: dict[int, Any] = {}
        if forward_signals and main_thread:
            previous = {s: signal.signal(s, sup.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            _start(procs, main_thread)
            sup.start = time.monotonic()
            late = sup.run()
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
        results, errors = [], []
        for r in range(world_size):
            path = f"{folder}/result-{r}.pkl"
            results.append(pickle.load(open(path, "rb")) if os.path.exists(path) else None)
            epath = f"{folder}/error-{r}.txt"
            err = open(epath).read() if os.path.exists(epath) else None
            if r in sup.notes:
                err = (err or "") + sup.notes[r]
            elif r in late:
                err = (err or "") + f"rank {r} still running: killed {sup.why_late()} (stuck or stopped?)"
            errors.append(err)
        codes = [p.exitcode for p in procs]
    return SpawnResult(codes, results, errors, sup.seconds, sup.signal, sup.culprit, [p.pid or 0 for p in procs])


def _start(procs: list[Any], main_thread: bool) -> None:
    """Start the processes with SIGINT ignored, which they inherit: a Ctrl-C (sent by the terminal
    to every process of the foreground group) cannot interrupt their start-up with a traceback; each
    rank restores it once it can report errors (``_child``)."""
    old = signal.signal(signal.SIGINT, signal.SIG_IGN) if main_thread else None
    try:
        for p in procs:
            p.start()
    finally:
        if old is not None:
            signal.signal(signal.SIGINT, old)
