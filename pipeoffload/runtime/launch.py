"""Starting pipeline processes: under ``torchrun`` (environment variables) or spawned from Python.

``spawn`` runs ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes started by torch's
elastic agent (``torch.distributed.elastic``, the machinery behind ``torchrun``): it rendezvouses
on a port the system picks (parallel runs cannot clash), gives each rank its environment, starts
the processes and collects what each returned. No restarts (a failed step is not retried).

The agent stops every rank as soon as one fails and tolerates a stopped one, so our supervisor
(``_Supervisor``) decides when the agent sees the ranks' fate: every wait is bounded (``deadline``);
once a rank has failed the others get ``grace`` seconds to exit naming the failure themselves (``settle``
seconds where its failure names itself: its own error, or a death the launcher blames); a
rank stopped (SIGSTOP) for ``timeout`` seconds is killed and blamed, as is a rank that exits with a code
of its own and no Python error (``os._exit``); with ``forward_signals``
SIGINT/SIGTERM go to the ranks (recorded in the run's folder first, so that a rank still starting takes it
up later: ``pending_signal``), which get ``stop_grace`` seconds to stop (a second signal kills
them at once; the same signal again within ``REPEAT`` seconds is one signal delivered twice, e.g. to a
process group and once more by ``timeout``, and is ignored). The ranks die with their launcher: a parent-death signal (Linux ``prctl``) plus a
thread watching the launcher's pid, either of which removes the run's folder and exits.
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import datetime
import faulthandler
import inspect
import logging
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerSpec, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous import registry as rdzv_registry
from torch.distributed.launcher.api import LaunchConfig

from pipeoffload.errors import ConfigError

log = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1  # linux/prctl.h
ORPHAN_SIGNAL = signal.SIGUSR2  # sent to a rank when its launcher dies; its handler cleans up and exits
_POLL = 0.05
# The same signal again within this many seconds is the first one delivered twice, not a second Ctrl-C:
# `kill -TERM -- -PGID` reaches the launcher, and `timeout` (in that group) forwards it once more.
REPEAT = 1.0


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

    NCCL and one GPU per local rank when CUDA is available, else gloo on CPU. Outside torchrun (no
    RANK/WORLD_SIZE in the environment) it refuses in one line (``ConfigError``)."""
    missing = [k for k in ("RANK", "WORLD_SIZE") if k not in os.environ]
    if missing:
        raise ConfigError(f"init_from_env: {' and '.join(missing)} not set: this is not a torchrun process; launch "
                          "with torchrun (e.g. torchrun --standalone --nproc_per_node 2 script.py), or start the "
                          "ranks with pipeoffload.runtime.launch.spawn(fn, world) instead")
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
    faults: dict[int, str] = field(default_factory=dict)  # rank: faulthandler's dump of its crash (SIGSEGV, ...)
    forced: int = 0  # a second signal, which killed the ranks before they had stopped by themselves; 0 if none

    @property
    def ok(self) -> bool:
        # a culprit with code 0 left before its function returned (it has no result): no success either
        return all(code == 0 for code in self.exitcodes) and self.culprit is None

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
        if not own and (late := [(r, e) for r, e in found if _LATE in e]):
            # every error only reports a peer gone silent: the rank still running when the others had given
            # up (stuck in its own code, e.g. the user's model build) is the one they were waiting for
            r, e = late[0]
            # the one that timed out waiting says most (the others lost their connection to it afterwards)
            others = sorted(((q, x) for q, x in found if q != r and _LATE not in x),
                            key=lambda qx: "timed out" not in qx[1].split("\n\n")[0].lower())
            why = f"; rank {others[0][0]}: {others[0][1].splitlines()[0]}" if others else ""
            killed = e.strip().splitlines()[-1].split(_LATE, 1)[1].replace(" (stuck or stopped?)", "").strip()
            return (f"rank {r} was still running when its peers gave up waiting for it (stuck in its own code, or "
                    f"computing longer than --timeout): killed {killed}{why}")
        for r, e in own or found:
            if e.startswith("ConfigError"):
                return f"rank {r}: {e.splitlines()[0]}"
        r, e = (own or found)[0]
        return f"rank {r}: {e.splitlines()[0]}"


_LATE = "still running: killed"  # the launcher's note for a rank it killed at the limit (``_outcome``)
_CONSEQUENCES = ("connection reset", "connection closed", "lost the connection", "timed out", "peererror",
                 _LATE, "stopped responding", "broken pipe")


def _consequence(error: str) -> bool:
    """Whether a rank's error only reports that a peer went away (the peer is the one to blame)."""
    first = error.split("\n\n")[0].lower()
    return any(word in first for word in _CONSEQUENCES)


# ---- inside a rank -----------------------------------------------------------------------------------
def _child(fn: Callable[..., Any], world: int, args: tuple, folder: str, backend: str, timeout: float,
           threads: int, launcher: int, stop_signals: bool = False) -> Any:
    """A rank's entry point, started by torch's elastic agent (``RANK``, ``MASTER_ADDR``/``PORT`` and the
    agent's store in the environment). Returns ``fn``'s result, which the agent collects; any error is
    written to ``error-<rank>.txt`` and ends the process at once (exit 1). ``stop_signals`` (``spawn``'s
    ``forward_signals``): SIGINT/SIGTERM are kept for ``fn`` to take up (``pending_signal``)."""
    rank = int(os.environ["RANK"])
    try:
        die_with_launcher(launcher, folder, rank)
        _faults_to_file(folder, rank)
        if stop_signals:
            # a signal is recorded, never lost: the launcher writes it to the run's folder before forwarding it
            # (one sent while we still ignored SIGINT, before this line, is dropped), and ``fn`` asks
            # ``pending_signal`` once its own handler is in place
            _stop_file[:] = [f"{folder}/{STOP_FILE}"]
            for s in (signal.SIGINT, signal.SIGTERM):
                signal.signal(s, _record_signal)
        else:
            # the launcher started us with SIGINT ignored (no traceback from a Ctrl-C during start-up);
            # from here a KeyboardInterrupt is reported like any error
            signal.signal(signal.SIGINT, signal.default_int_handler)
        torch.set_num_threads(threads)
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout))
        # pickled here, where its error is reported as the rank's: raised after the return below, it left the
        # process with exit 0 (our atexit) and no result, and the agent waited for that result for ever
        payload = pickle.dumps(fn(rank, world, *args))  # bytes: torch's queue would move tensors to shared memory
        open(f"{folder}/done-{rank}", "w").close()
    except BaseException as exc:  # noqa: BLE001 - report anything, then exit non-zero
        try:
            with open(f"{folder}/error-{rank}.txt", "w") as fh:
                fh.write(f"{type(exc).__name__}: {exc}\n\n{traceback.format_exc()}")
        except OSError:  # the folder is gone with the launcher
            pass
        os._exit(1)  # skip interpreter teardown: a peer that died must not hang our exit
    # the agent takes the result and lets us go once every rank has returned; then skip the teardown
    # too (gloo's threads may still hold tensors whose release at finalisation aborts the process)
    atexit.register(exit_rank, 0)
    return payload


STOP_FILE = "signal"  # in the run's folder: the number of the signal the launcher received and forwards
_stop_file: list[str] = []  # this rank's STOP_FILE, where the launcher forwards signals (``_child``)
_recorded: list[int] = []  # a SIGINT/SIGTERM received before ``fn`` installed its handler


def _record_signal(signum: int, _frame: Any) -> None:
    if not _recorded:
        _recorded.append(signum)


def pending_signal() -> int:
    """Inside a spawned rank whose launcher forwards signals: the SIGINT/SIGTERM sent to the run so far, 0 if
    none. A rank's handler for them (the trainer's) asks once it is installed, so that a signal sent while the
    rank was starting (ignored then, or only recorded) still stops it; 0 outside such a rank."""
    if _recorded:
        return _recorded[0]
    if _stop_file:
        with contextlib.suppress(OSError, ValueError):
            return int(Path(_stop_file[0]).read_text().strip() or 0)
    return 0


def _faults_to_file(folder: str, rank: int) -> None:
    """torch's agent runs each rank under its ``record``, which enables faulthandler on stderr for all
    threads: a crash in C code (SIGSEGV, SIGBUS, ...) then shows the Python stack where it happened. Ranks
    crashing together (every rank reads a data file that shrank) interleaved their dumps, some 90 lines
    each, above the launcher's verdict. The dump goes to ``fault-<rank>.txt`` in the run's folder instead;
    the launcher hands it on (``spawn``'s ``collect_faults``). Where faulthandler is off, it stays off."""
    if not faulthandler.is_enabled():
        return
    try:
        fh = open(f"{folder}/fault-{rank}.txt", "w")  # open for the process's life: faulthandler writes to its fd
    except OSError:  # the folder is gone with the launcher: stderr it stays
        return
    _fault_file[:] = [fh]
    faulthandler.enable(file=fh, all_threads=True)


_fault_file: list[Any] = []  # never closed, so its descriptor is never reused while faulthandler holds it


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


def _exit_code(pid: int) -> int | None:
    """The exit code of our child ``pid`` (negative: killed by that signal), None while it runs. The
    child is left unreaped (``WNOWAIT``): torch's process context reaps it."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped already by someone else: it exited, how is unknown
        return 1
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def _wait_exits(pids: list[int], limit: float = 5.0) -> None:
    """Wait (bounded: a process in uninterruptible sleep may outlive SIGKILL) until ``pids`` exit."""
    end = time.monotonic() + limit
    while time.monotonic() < end and any(_exit_code(p) is None for p in pids):
        time.sleep(0.01)


class _Supervisor:
    """Our policy on top of torch's elastic agent, which stops every rank as soon as one fails and
    tolerates a stopped one: see the module docstring. ``settled`` is asked at each of the agent's
    monitoring ticks; until it says yes the agent is told the group is healthy."""

    def __init__(self, world: int, folder: str, timeout: float, deadline: float, grace: float | None,
                 stop_grace: float, settle: float | None = None) -> None:
        self.folder, self.timeout, self.deadline, self.grace, self.stop_grace = folder, timeout, deadline, grace, stop_grace
        self.settle = settle
        self.known = False  # whether the first failure says itself what failed (a rank's own error, a death blamed)
        self.pids: list[int] = []
        self.codes: list[int | None] = [None] * world
        self.start = time.monotonic()
        self.seconds = [0.0] * world
        self.notes: dict[int, str] = {}  # rank: why the launcher killed it, or how it died
        self.killed: set[int] = set()
        self.late: set[int] = set()
        self.culprit: int | None = None
        self.failed_at: float | None = None
        self.signal = 0
        self.signalled_at: float | None = None
        self.kill_now = False
        self.second = 0  # a second signal (not the first one again within REPEAT s)
        self.forced = 0  # the second signal, once it has killed running ranks
        self._stopped_since: dict[int, float] = {}
        self._next_probe = 0.0

    def started(self, pids: list[int]) -> None:
        self.pids, self.start = pids, time.monotonic()
        if self.signal:  # a signal came while the agent was starting them
            self._forward(self.signal)

    # signal handler (main thread)
    def on_signal(self, signum: int, _frame: Any) -> None:
        now = time.monotonic()
        if self.signal:
            since = now - self.signalled_at if self.signalled_at is not None else REPEAT
            if signum == self.signal and since < REPEAT and not self.kill_now:
                log.warning("received %s again %.3f s after the first: taken as the same signal delivered twice "
                            "(e.g. to the process group and once more by `timeout`), not a second one; the ranks "
                            "go on finishing their step and saving (send a signal again after %g s to kill them "
                            "at once)", signal.Signals(signum).name, since, REPEAT)
                return
            self.kill_now, self.second = True, self.second or signum  # a second Ctrl-C: stop waiting
            return
        self.signal, self.signalled_at = signum, now
        self._forward(signum)

    def _forward(self, signum: int) -> None:
        """Record the signal in the run's folder (``pending_signal``: a rank still starting, which ignores
        or only records it, takes it up once its handler is in place), then send it to the ranks."""
        with contextlib.suppress(OSError):
            tmp = f"{self.folder}/.{STOP_FILE}"
            with open(tmp, "w") as fh:
                fh.write(str(signum))
            os.replace(tmp, f"{self.folder}/{STOP_FILE}")
        for r, pid in enumerate(self.pids):
            if self.codes[r] is None:
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:
                    pass

    def _grace(self) -> float | None:
        """How long the others get once a rank has failed: ``settle`` where that failure says itself what failed
        (a peer still running could only report the loss of it, or is blocked where it cannot see it: a store
        wait in start-up), else ``grace``, for the rank that failed first to be seen to (a consequence)."""
        if self.known and self.settle is not None:
            return self.settle if self.grace is None else min(self.grace, self.settle)
        return self.grace

    def _failed(self, now: float, rank: int) -> None:
        """Note the run's first failure, at ``now``, by ``rank``."""
        if self.failed_at is not None:
            return
        self.failed_at = now
        if rank in self.notes:
            self.known = True
            return
        with contextlib.suppress(OSError):
            self.known = not _consequence(Path(f"{self.folder}/error-{rank}.txt").read_text(errors="replace"))

    def _limit(self) -> float:
        limit = self.start + self.deadline
        grace = self._grace()
        if self.failed_at is not None and grace is not None:
            limit = min(limit, self.failed_at + grace)
        if self.signalled_at is not None:
            limit = min(limit, self.signalled_at + self.stop_grace)
        return limit

    def _blame(self, rank: int, note: str) -> None:
        self.notes[rank] = note
        if self.culprit is None and not self.signal:
            self.culprit = rank

    def returned(self, rank: int) -> bool:
        """Whether the rank's function returned (it then waits for the agent to collect every result)."""
        return os.path.exists(f"{self.folder}/done-{rank}")

    def _reap(self, pending: set[int], now: float) -> None:
        for r in list(pending):
            code = _exit_code(self.pids[r])
            if code is None:
                continue
            self.codes[r], self.seconds[r] = code, now - self.start
            pending.discard(r)
            if code < 0 and r not in self.killed:  # killed from outside (OOM killer, kill -9)
                name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
                self._blame(r, f"rank {r} (pid {self.pids[r]}) was killed by signal {name}")
            elif code > 0 and not os.path.exists(f"{self.folder}/error-{r}.txt"):
                # no Python error reported (``_child`` writes one before its exit 1): os._exit(), or native
                # code calling exit(); its peers only see a lost connection
                self._blame(r, f"rank {r} (pid {self.pids[r]}) exited with code {code} without a Python error "
                               "(os._exit() or exit() in native code)")
            elif code == 0 and not self.returned(r):
                # success is an exit after ``fn`` returned (``_child`` marks it first): this one left before,
                # and its peers only see a lost connection, which would blame one of them
                self._blame(r, f"rank {r} (pid {self.pids[r]}) exited with code 0 before its work was done "
                               "(os._exit(0), or exit(0) in native code)")
            if code != 0 or r in self.notes:
                self._failed(now, r)

    def _probe_stopped(self, pending: set[int], now: float) -> None:
        """Kill (and blame) a rank that has been stopped (SIGSTOP, Ctrl-Z of one process) for ``timeout``:
        it would never exit by itself, and its peers only learn that one of them is silent."""
        if now < self._next_probe:
            return
        self._next_probe = now + 0.5
        for r in list(pending):
            if _state(self.pids[r]) != "T":
                self._stopped_since.pop(r, None)
                continue
            since = self._stopped_since.setdefault(r, now)
            if now - since >= self.timeout:
                self._blame(r, f"rank {r} (pid {self.pids[r]}) was stopped (SIGSTOP) for {self.timeout:g} s "
                               "(--timeout): killed")
                self._kill(r)
                self._failed(now, r)

    def _kill(self, r: int) -> None:
        self.killed.add(r)
        try:
            os.kill(self.pids[r], signal.SIGKILL)
        except ProcessLookupError:
            pass

    def settled(self) -> bool:
        """True once the agent may take over: every rank returned (it collects the results), or every
        rank has exited (it reports the failure). Kills the ranks still running past the limit."""
        if not self.pids:
            return False
        now = time.monotonic()
        pending = {r for r, code in enumerate(self.codes) if code is None}
        self._reap(pending, now)
        if self.failed_at is None and all(self.returned(r) for r in pending):
            return True
        running = {r for r in pending if not self.returned(r)}  # returned ones wait for the others
        if running and (self.kill_now or now >= self._limit()):
            self.late = running
            self.forced = self.second if self.kill_now else 0
            for r in sorted(pending):
                self._kill(r)
            _wait_exits([self.pids[r] for r in pending])
            self._reap(pending, time.monotonic())
        elif running:
            self._probe_stopped(running, now)
        if self.failed_at is not None and not running:  # the others returned; only the failed one was left
            for r in sorted(pending):
                self._kill(r)
            _wait_exits([self.pids[r] for r in pending])
            self._reap(pending, time.monotonic())
        return not pending

    def why_late(self) -> str:
        if self.kill_now:
            return "a second signal"
        if self.signalled_at is not None and self.failed_at is None:
            return f"{self.stop_grace:g} s after the signal"
        if self.failed_at is not None and (grace := self._grace()) is not None:
            return f"{grace:g} s after a rank failed"
        return f"the {self.deadline:.0f} s deadline"


def agent_options(agent: type = LocalElasticAgent) -> dict[str, Any]:
    """Keyword arguments for the agent that this torch's ``LocalElasticAgent`` takes: no grace period
    at shutdown (``shutdown_timeout=0``) where it has that argument; torch 2.11 has not, and keeps its
    default grace there."""
    return {"shutdown_timeout": 0} if "shutdown_timeout" in inspect.signature(agent).parameters else {}


class _Agent(LocalElasticAgent):
    """torch's local elastic agent (rendezvous, worker environment, process start, result collection,
    shutdown) with our supervision policy (``_Supervisor``) deciding when it sees the ranks' fate."""

    def __init__(self, spec: WorkerSpec, logs: DefaultLogsSpecs, sup: _Supervisor, handler: Any) -> None:
        super().__init__(spec, logs, start_method="spawn", exit_barrier_timeout=30, **agent_options())
        self.sup, self.handler = sup, handler

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        """Start the processes with SIGINT ignored, which they inherit: a Ctrl-C (sent by the terminal
        to every process of the foreground group) cannot interrupt their start-up with a traceback;
        each rank restores it once it can report errors, or records it for ``fn`` (``_child``)."""
        main_thread = threading.current_thread() is threading.main_thread()
        old = signal.signal(signal.SIGINT, signal.SIG_IGN) if main_thread else None
        try:
            pids = super()._start_workers(worker_group)
        finally:
            if old is not None:
                signal.signal(signal.SIGINT, self.handler or old)
        self.sup.started([pids[r] for r in range(len(pids))])
        return pids

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        if not self.sup.settled():
            return RunResult(state=WorkerState.HEALTHY)
        return super()._monitor_workers(worker_group)


def _run_agent(entry: tuple, world: int, folder: str, sup: _Supervisor, handler: Any) -> dict[int, Any]:
    """Rendezvous on this host (a port the system picks) and run ``_child(*entry)`` on ``world`` ranks
    under ``_Agent``; returns the results by rank, ``{}`` when a rank failed."""
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=world, run_id=f"pipeoffload-{os.getpid()}",
                          rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", max_restarts=0,
                          monitor_interval=_POLL, local_addr="127.0.0.1",
                          logs_specs=DefaultLogsSpecs(log_dir=f"{folder}/elastic"))
    params = RendezvousParameters(backend=config.rdzv_backend, endpoint=config.rdzv_endpoint, run_id=config.run_id,
                                  min_nodes=1, max_nodes=1, local_addr=config.local_addr, **config.rdzv_configs)
    spec = WorkerSpec(role="rank", local_world_size=world, entrypoint=_child, args=entry,
                      rdzv_handler=rdzv_registry.get_rendezvous_handler(params), max_restarts=0,
                      monitor_interval=config.monitor_interval, local_addr=config.local_addr)
    agent = _Agent(spec, config.logs_specs, sup, handler)  # type: ignore[arg-type]
    try:
        result = agent.run()
    finally:
        spec.rdzv_handler.shutdown()
    return {} if result.is_failed() else result.return_values


def spawn(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple = (),
    *,
    backend: str = "gloo",
    timeout: float = 60.0,
    startup_timeout: float | None = None,
    deadline: float = 300.0,
    threads: int = 1,
    grace: float | None = None,
    forward_signals: bool = False,
    stop_grace: float = 10.0,
    collect_faults: bool = False,
    settle: float | None = None,
) -> SpawnResult:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes; collect the results.

    ``timeout`` is the process group's (and how long a stopped rank is tolerated); ``startup_timeout``, where
    given, is the process group's instead (joining it included): ``fn`` then bounds its later waits itself
    (``train``: ``RankContext.started``); ``deadline``
    bounds the whole run (stragglers are killed); ``grace``: once a rank has failed, the others get
    this many seconds to exit before being killed; ``settle`` (at most ``grace``), where that rank's failure says
    itself what failed (its own error, not a lost peer's; or a death the launcher blames), instead: the others
    could only report the loss of it, and one blocked in start-up (a store wait) cannot see it at all. ``forward_signals``: SIGINT/SIGTERM received here
    are sent to the ranks, which get ``stop_grace`` seconds to exit (``SpawnResult.interrupted``).
    faulthandler's dump of a rank that crashed (SIGSEGV, SIGBUS, ...) is in ``SpawnResult.faults`` and
    written to stderr after the run, one rank after the other; with ``collect_faults`` only returned."""
    with tempfile.TemporaryDirectory(prefix="pipeoffload-") as folder:
        sup = _Supervisor(world_size, folder, timeout, deadline, grace, stop_grace, settle)
        main_thread = threading.current_thread() is threading.main_thread()
        handler = sup.on_signal if forward_signals and main_thread else None
        watched = _AGENT_SIGNALS + (signal.SIGINT, signal.SIGTERM)
        previous = {s: h for s in watched if (h := signal.getsignal(s)) is not None} if main_thread else {}
        if handler is not None:
            for s in (signal.SIGINT, signal.SIGTERM):
                signal.signal(s, handler)
        joining = startup_timeout if startup_timeout is not None else timeout
        entry = (fn, world_size, args, folder, backend, joining, threads, os.getpid(), forward_signals)
        try:
            with _agent_signals(), _quiet_agent():
                results = _run_agent(entry, world_size, folder, sup, handler)
        except SignalException as exc:  # SIGHUP/SIGQUIT: the agent has stopped the ranks
            sup.signal, results = int(exc.sigval), {}
            _wait_exits(sup.pids)
        finally:
            if handler is not None:
                _hear_out_repeats(sup)
            for s, h in previous.items():
                signal.signal(s, h)
        outcome = _outcome(sup, folder, results, world_size)
    if not collect_faults:
        for r, dump in sorted(outcome.faults.items()):
            sys.stderr.write(f"rank {r} crashed; its Python stack (faulthandler):\n{dump.rstrip()}\n")
    return outcome


def _hear_out_repeats(sup: _Supervisor) -> None:
    """Keep our handler until ``REPEAT`` s past the first signal: ranks that finish their step and save
    quickly return before `timeout`'s copy of the signal arrives, which the restored default handler
    would take as a kill of this process (exit -15 after it had saved, not 143)."""
    if sup.signalled_at is not None:
        time.sleep(max(0.0, sup.signalled_at + REPEAT - time.monotonic()))


def _outcome(sup: _Supervisor, folder: str, results: dict[int, bytes], world: int) -> SpawnResult:
    """What each rank returned, raised or suffered, from the agent's results and the run's folder."""
    errors: list[str | None] = []
    faults: dict[int, str] = {}
    for r in range(world):
        with contextlib.suppress(OSError):
            if dump := Path(f"{folder}/fault-{r}.txt").read_text(errors="replace").strip():
                faults[r] = dump
        path = f"{folder}/error-{r}.txt"
        err = Path(path).read_text() if os.path.exists(path) else None
        if r in sup.notes:
            err = (err or "") + sup.notes[r]
        elif r in sup.late:
            err = (err or "") + f"rank {r} still running: killed {sup.why_late()} (stuck or stopped?)"
        errors.append(err)
    if results:
        codes: list[int | None] = [0] * world
    else:  # a rank that had returned and was only waiting for the others counts as a success
        codes = [0 if sup.returned(r) and r not in sup.late else c if c is not None else _exit_code(sup.pids[r])
                 for r, c in enumerate(sup.codes)] if sup.pids else [None] * world
    seconds = [s or time.monotonic() - sup.start for s in sup.seconds]
    values = [pickle.loads(results[r]) if r in results else None for r in range(world)]
    return SpawnResult(codes, values, errors, seconds, sup.signal, sup.culprit, list(sup.pids), faults, sup.forced)


_AGENT_SIGNALS = (signal.SIGHUP, signal.SIGQUIT)  # torch's agent stops the ranks on these; SIGINT/SIGTERM are ours


@contextlib.contextmanager
def _agent_signals() -> Iterator[None]:
    """torch's process context installs its handlers for the signals named in this variable; leave
    SIGINT and SIGTERM to us (forwarded to the ranks, which save and return their results)."""
    key, before = "TORCHELASTIC_SIGNALS_TO_HANDLE", os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE")
    os.environ[key] = ",".join(s.name for s in _AGENT_SIGNALS)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


@contextlib.contextmanager
def _quiet_agent() -> Iterator[None]:
    """The agent logs its routine at warning level and a rank's failure with a traceback of its own
    monitoring; our summary says what matters (one line naming the rank), so its loggers are off."""
    prefixes = ("torch.distributed.elastic", "torch.multiprocessing")
    loggers = [logger for name, logger in logging.Logger.manager.loggerDict.items()
               if name.startswith(prefixes) and isinstance(logger, logging.Logger) and not logger.disabled]
    for logger in loggers:
        logger.disabled = True
    try:
        yield
    finally:
        for logger in loggers:
            logger.disabled = False
