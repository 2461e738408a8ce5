"""An advisory lock on a run directory, held by the launcher for the run's life.

Two runs writing one ``--out`` would interleave ``metrics.jsonl``, overwrite ``config.toml`` and
fight over checkpoints. ``RUN/.lock`` is locked with ``fcntl.flock`` (released by the kernel when
the holder dies, so a lock left by a killed run is never stale) and holds the holder's pid and host,
which the refusal names. Where ``flock`` is not supported the file's pid and host decide: a pid of
this host that no longer runs is a stale lock and is taken over.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
from pathlib import Path
from types import TracebackType

from pipeoffload.errors import ConfigError
from pipeoffload.fileio import FULL, full_disk_text

LOCK_FILE = ".lock"


class RunLock:
    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / LOCK_FILE
        self._fd: int | None = None
        self._made: list[Path] = []  # the folders acquire() created, outermost first (removed with the lock)
        self._made_file = False  # whether acquire() created the lock file

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()

    def acquire(self) -> None:
        # what this lock creates (the run folder and its parents, the lock file) goes again with it when the run
        # leaves nothing else there (a refusal, a full disk): nothing is left behind that was not there
        self._made = [p for p in [self.path.parent, *self.path.parent.parents] if not p.exists()][::-1]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._made_file = not self.path.exists()
        try:
            self._lock()
        except BaseException:
            self._remove_made()
            raise

    def _lock(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise ConfigError(self._refusal(_holder(self.path))) from None
            if _holder_alive(self.path):  # no flock here (some network file systems): trust pid and host
                os.close(fd)
                raise ConfigError(self._refusal(_holder(self.path))) from None
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
        except OSError as err:
            os.close(fd)
            if err.errno in FULL:
                raise ConfigError(full_disk_text(self.path, err)) from None
            raise
        self._fd = fd

    def _refusal(self, holder: tuple[int, str] | None) -> str:
        who = f"pid {holder[0]} on host {holder[1]}" if holder else "another process"
        return (f"out={str(self.path.parent)!r} is in use by a running training run ({who}); wait for it to "
                "finish, stop it, or pick another --out")

    def release(self) -> None:
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None
                self._remove_made()

    def _remove_made(self) -> None:
        """Remove the lock file and folders this lock created, where the run put nothing else in them."""
        with contextlib.suppress(OSError):
            if self._made_file and [p.name for p in self.path.parent.iterdir()] == [LOCK_FILE]:
                self.path.unlink()
        for folder in reversed(self._made):
            with contextlib.suppress(OSError):
                folder.rmdir()  # only while empty


def _holder(path: Path) -> tuple[int, str] | None:
    try:
        pid, host = path.read_text().split()[:2]
        return int(pid), host
    except (OSError, ValueError):
        return None


def _holder_alive(path: Path) -> bool:
    holder = _holder(path)
    if holder is None:
        return False
    pid, host = holder
    if host != socket.gethostname():
        return True  # cannot tell from here: assume it runs
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid != os.getpid()
