"""Atomic file writes: a reader never sees half a file, and a failed write leaves nothing behind."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> Path:
    """Write ``data`` to a temporary file beside ``path``, then rename it into place."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        from pipeoffload.errors import ConfigError

        raise ConfigError(f"output {str(target)!r}: folder {str(directory)!r} does not exist; create it first")
    mode = "wb" if isinstance(data, bytes) else "w"
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=directory)
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
