"""An advisory lock on a run directory, held by the launcher for the run's life.

Two runs writing one ``--out`` would interleave ``metrics.jsonl``, overwrite ``config.toml`` and
fight over checkpoints. ``RUN/.lock`` is locked with ``fcntl.flock`` (released by the kernel when
the holder dies, so a lock left by a killed run is never stale) and holds the holder's pid and host,
which the refusal names. Where ``flock`` is not supported the file's pid and host decide: a pid of
this host that no longer runs is a stale lock and is taken over.

What the lock made (the folder, the file) goes with it where the run left nothing else there. The file is
removed only while held, and a launcher that locked a file checks it is still the folder's (else it
retries): removed after the unlock, one launcher could lock the removed file while another made a new one.
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
        self._made_file = False  # whether acquire() created the lock file (removed with the lock)

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()

    def acquire(self) -> None:
        # what this lock creates (the run folder and its parents, the lock file) goes again with it when the run
        # leaves nothing else there (a refusal, a full disk): nothing is left behind that was not there
        self._made, self._made_file = [], False
        try:
            for _ in range(_ATTEMPTS):
                if self._lock():
                    return
            raise ConfigError(f"out={str(self.path.parent)!r}: its lock file {self.path.name} kept being removed "
                              "and made again by other runs ending and starting; try again")
        except BaseException:
            self._remove_folders()
            raise

    def _lock(self) -> bool:
        """Take the lock (True), or False where the file locked is no longer the one at the path: its holder
        removed it on release after this opened it (then a fresh one is made)."""
        if self.path.is_symlink() and not self.path.exists():
            # opening it would create its target elsewhere, or fail as if another run had just removed the file
            # (retried, then blamed on other runs): the CLI's check of the folder (``preflight.check_out``) says the same
            raise ConfigError(f"out={str(self.path.parent)!r}: {str(self.path)!r} is a link to "
                              f"{os.readlink(self.path)!r}, which does not exist, where the run keeps its lock (a "
                              "file); move or remove it, or choose another --out")
        missing = [p for p in [self.path.parent, *self.path.parent.parents] if not p.exists()]
        self._made = sorted({*self._made, *missing}, key=lambda p: len(p.parts))  # again: another may remove them
        self._made_file = self._made_file or not self.path.exists()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # the folder or a parent went meanwhile (removed by a launcher that made it)
            return False
        except (FileExistsError, NotADirectoryError):
            # mkdir's exist_ok checks is_dir() after its EEXIST: a launcher that made the folder removed it in
            # between (retry), unless a file stands where a folder must be
            self._refuse_a_file_in_the_way()
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES) or _holder_alive(self.path):
                # another run holds the file (also where this made it: that run locked it first): never removed
                os.close(fd)
                raise ConfigError(self._refusal(_holder(self.path))) from None
            # no flock here (some network file systems): the pid and host of the file decided it is stale
        if not _same_file(fd, self.path):
            os.close(fd)
            return False
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
        except OSError as err:
            self._remove_file()  # still held: no other run can have taken it
            os.close(fd)
            if err.errno in FULL:
                raise ConfigError(full_disk_text(self.path, err)) from None
            raise
        self._fd = fd
        return True

    def _refuse_a_file_in_the_way(self) -> None:
        for path in (self.path.parent, *self.path.parent.parents):
            if path.exists() and not path.is_dir():
                raise ConfigError(f"out={str(self.path.parent)!r}: {str(path)!r} exists and is not a folder; give a "
                                  "folder for the run (--out DIR)")

    def _refusal(self, holder: tuple[int, str] | None) -> str:
        who = f"pid {holder[0]} on host {holder[1]}" if holder else "another process"
        return (f"out={str(self.path.parent)!r} is in use by a running training run ({who}); wait for it to "
                "finish, stop it, or pick another --out")

    def release(self) -> None:
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)
                self._remove_file()  # while the lock is held: a run that opened the file before finds it gone
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None
                self._remove_folders()

    def _remove_file(self) -> None:
        """Remove the lock file where this lock made it and the run put nothing else beside it; only ever
        while holding it (a launcher that opened it meanwhile then sees it is no longer the path's, and retries:
        removed after the unlock, a third launcher could lock the removed file while a fourth locks a new one)."""
        with contextlib.suppress(OSError):
            if self._made_file and [p.name for p in self.path.parent.iterdir()] == [LOCK_FILE]:
                self.path.unlink()

    def _remove_folders(self) -> None:
        """Remove the folders this lock created, where they are empty (``rmdir`` refuses any other: a launcher
        that made its lock file in one meanwhile keeps it; one about to make it finds the folder gone and retries)."""
        for folder in reversed(self._made):
            with contextlib.suppress(OSError):
                folder.rmdir()


_ATTEMPTS = 100  # each retry follows another run's release or start in the same instant: a few at most


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``fd`` is still the file at ``path`` (not one its holder removed on release)."""
    try:
        here, there = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


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
