"""Atomic file writes: a reader never sees half a file, and a failed write leaves nothing behind; and
reads of input files that always return."""
from __future__ import annotations

import errno
import os
import shlex
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from pipeoffload.errors import ConfigError


def check_writable(path: str | os.PathLike[str], what: str | None = None) -> None:
    """Refuse an output path that cannot be written (an empty name, a folder, a missing or read-only folder,
    a "folder" that is a file) before any work, with one line naming it (``what``, e.g. ``--plot out.png``;
    default ``output out.png``)."""
    what = what or f"output {shlex.quote(os.fspath(path))}"
    if not os.fspath(path).strip():  # Path("") is ".", the current folder: not a file name
        raise ConfigError(f"{what}: an empty file name; give a file name")
    target = Path(path)
    directory = _existing_parent(target, what, str)
    if target.is_dir():
        raise ConfigError(f"{what}: is a folder; give a file name inside it")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ConfigError(f"{what}: folder {directory} is not writable; choose another place")


NOT_REGULAR = "not a regular file (a FIFO, socket or device: reading it might never end)"


def why_not_a_file(path: Path) -> str:
    """Why ``path`` cannot be read as an input file, said after its name: it is a folder, something else
    than a regular file (``NOT_REGULAR``), or absent (for a path where ``is_file()`` is False)."""
    return "is a folder, not a file" if path.is_dir() else f"is {NOT_REGULAR}" if path.exists() else "does not exist"


def read_input_text(path: str | os.PathLike[str]) -> str:
    """The UTF-8 text of the input file ``path``. Anything but a regular file is refused with an OSError
    before it is read (a folder as ``IsADirectoryError``; a FIFO, socket or device with ``NOT_REGULAR``):
    reading a FIFO waits for a writer that may never come, and ``/dev/zero`` never ends. Opened without
    blocking, since opening a FIFO would wait too. Raises UnicodeDecodeError for text that is not UTF-8."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), os.fspath(path))
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, NOT_REGULAR, os.fspath(path))
        os.set_blocking(fd, True)
        with os.fdopen(fd, encoding="utf-8", closefd=False) as handle:  # universal newlines, as read_text()
            return handle.read()
    finally:
        os.close(fd)


# what a Chrome/Perfetto trace's name ends in, and what is written there (``check_extension``'s arguments)
TRACE_JSON = ((".json",), "a Chrome/Perfetto trace (JSON)")


def check_extension(path: str | os.PathLike[str], what: str, suffixes: tuple[str, ...], written: str) -> None:
    """Refuse an output name whose extension contradicts what is written there (``written``, e.g. "a JSON
    trace"): ``--trace tr.png`` would hold JSON under a picture's name. ``suffixes`` are lower case, with
    their dot; the first is the one suggested."""
    suffix = Path(path).suffix.lower()
    if suffix not in suffixes:
        ends = f"ends in {Path(path).suffix!r}" if suffix else "has no extension"
        raise ConfigError(f"{what}: {written} is written there, but the name {ends}; give a name ending in "
                          f"{' or '.join(suffixes)}")


def check_distinct(outputs: list[tuple[str, str | os.PathLike[str]]],
                   inputs: list[tuple[str, str | os.PathLike[str]]] | None = None) -> None:
    """Refuse two outputs on one file (the second would silently replace the first) and an output on an
    input (the input would be lost). Each entry is (how the user named it, e.g. "--plot", path); paths are
    compared after resolving ``.``, ``..`` and links."""
    seen: dict[str, str] = {}
    for name, path in inputs or []:
        seen.setdefault(os.path.realpath(path), name)
    for name, path in outputs:
        real = os.path.realpath(path)
        if real in seen:
            other = seen[real]
            if inputs and other in {n for n, _ in inputs}:
                raise ConfigError(f"{name} {path}: is {other}, which would be overwritten; give another output file")
            raise ConfigError(f"{other} and {name} name the same file {path}; give each output its own file")
        seen[real] = name


def check_new_folder(path: str | os.PathLike[str], what: str) -> None:
    """Refuse, before any work, a new output folder that cannot be made: an empty name, one that exists
    (nothing is overwritten), one whose parent is missing, is a file or cannot be written in. One line
    starting with ``what`` (e.g. ``--hf 'out'``)."""
    if not os.fspath(path).strip():
        raise ConfigError(f"{what}: an empty folder name; give a new folder")
    target = Path(path)
    if target.exists() or target.is_symlink():
        raise ConfigError(f"{what} already exists; pick a new folder (nothing is overwritten)")
    directory = _existing_parent(target, what, lambda p: repr(str(p)))
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ConfigError(f"{what}: folder {str(directory)!r} is not writable; choose another place")
    err = folder_write_error(directory)
    if err is not None:
        raise ConfigError(f"{what}: cannot write in folder {str(directory)!r} ({err.strerror}); "
                          "choose another place")


def folder_write_error(directory: Path) -> OSError | None:
    """Why no folder can be made in ``directory`` (None: one can). ``os.access`` passes root everywhere,
    special and read-only file systems (/proc, /sys, a read-only mount) included: one is made and removed."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".pipeoffload-check-", dir=directory))
    except OSError as err:
        return err
    return None


def _existing_parent(target: Path, what: str, shown: Callable[[Path], str]) -> Path:
    """The folder ``target`` goes in, refused in one line starting with ``what`` where it is missing or
    a file stands on its path (``shown`` writes a path in the caller's message style)."""
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        existing = next((p for p in [directory, *directory.parents] if p.exists()), None)
        if existing is not None and not existing.is_dir():
            raise ConfigError(f"{what}: {shown(existing)} is a file, not a folder; give a path in a folder")
        raise ConfigError(f"{what}: folder {shown(directory)} does not exist; create it first")
    return directory


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> Path:
    """Write ``data`` to a temporary file beside ``path``, then rename it into place."""
    check_writable(path)
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    mode = "wb" if isinstance(data, bytes) else "w"
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=directory)
    except OSError as err:  # e.g. a read-only or special file system that access() did not reveal
        if err.errno in FULL:  # a new directory entry may need a block the disk no longer has
            raise DiskFull.of(target, err) from None
        raise ConfigError(f"output {target}: cannot write in folder {directory} ({err.strerror})") from None
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would surprise: behave like open()
    try:
        with os.fdopen(fd, mode) as handle:
            handle.write(data)
        os.replace(tmp, target)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError) and err.errno in FULL:
            raise DiskFull.of(target, err) from None
        raise
    return target


FULL = (errno.ENOSPC, errno.EDQUOT)  # a full file system, or the user's quota spent


class DiskFull(ConfigError):
    """``write_atomic`` found the disk full (``full_disk_text``'s line); ``error`` is the ``OSError``, so a
    caller with more to say (a resume: its last checkpoint and how to continue) can say it instead."""

    error: OSError

    @classmethod
    def of(cls, path: Path, err: OSError) -> DiskFull:
        made = cls(full_disk_text(path, err))
        made.error = err
        return made


FULL_BELOW = 1 << 20  # a file system with less than this free (to us) is full


def no_space_text(doing: str, free: int, removed: bool = False) -> str:
    """The start of the line for a write that failed with ENOSPC, true whatever ran out: ``free`` is what the file
    system has free now (``shutil.disk_usage``). Below ``FULL_BELOW`` the disk is full; above it the disk did not
    run out, as far as can be told: some file systems report a spent quota, or no free inode, as ENOSPC (not
    EDQUOT), unless the partial output was ``removed`` since, when the write may also have filled the disk."""
    shown = f"{free / (1 << 20):.1f} MiB"
    if free < FULL_BELOW:
        return f"disk full while {doing} ({shown} free)"
    if removed:
        return (f"disk full or a quota spent while {doing} (no space left on device; {shown} are free now that the "
                "partial output is removed: the write filled the disk, or a quota or the file system's inodes ran "
                "out, which quota -s and df -i show)")
    return (f"no space left on device while {doing}, although {shown} are free: a quota or the file system's "
            "inodes ran out, not the disk (quota -s and df -i show which)")


def full_disk_text(path: str | os.PathLike[str], err: OSError) -> str:
    """One line for a write that found the disk full: the path, the reason, the fix."""
    return (f"output {os.fspath(path)}: cannot be written ({err.strerror or err}); free space on that file system "
            "(df -h shows it), or choose another place")
