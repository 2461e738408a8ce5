"""Atomic file writes: a reader never sees half a file, and a failed write leaves nothing behind."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def check_writable(path: str | os.PathLike[str], what: str | None = None) -> None:
    """Refuse an output path that cannot be written (a folder, a missing or read-only folder) before any
    work, with one line naming it (``what``, e.g. ``--plot out.png``; default ``output out.png``)."""
    from pipeoffload.errors import ConfigError

    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    what = what or f"output {target}"
    if not directory.is_dir():
        raise ConfigError(f"{what}: folder {directory} does not exist; create it first")
    if target.is_dir():
        raise ConfigError(f"{what}: is a folder; give a file name inside it")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ConfigError(f"{what}: folder {directory} is not writable; choose another place")


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> Path:
    """Write ``data`` to a temporary file beside ``path``, then rename it into place."""
    check_writable(path)
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    mode = "wb" if isinstance(data, bytes) else "w"
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=directory)
    except OSError as err:  # e.g. a read-only or special file system that access() did not reveal
        from pipeoffload.errors import ConfigError

        raise ConfigError(f"output {target}: cannot write in folder {directory} ({err.strerror})") from None
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would surprise: behave like open()
    try:
        with os.fdopen(fd, mode) as handle:
            handle.write(data)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
