"""Per-step measurements of every rank and the loggers that write them: ``metrics.jsonl`` and TensorBoard.

The loop brings every rank's measurements to every rank with one all-reduce of its own (not the
gradient norm's) and hands the record to each ``MetricsLogger`` on rank 0.

Keys (see docs/training.md): step, loss, val_loss, lr, grad_norm, tokens_per_s, step_s, and per
global rank peak_act_bytes (the runtime's measured peak of resident activations), sim_peak_act_bytes
(the simulator's peak for the same lowered schedule, with the measured bytes per stage as the unit
and the measured share of a slot kept between I and W),
host_bytes (peak bytes of offloaded activations on the host), reload_stall_s (seconds spent in
RELOAD and RELOAD_W actions: synchronous copies on CPU; on CUDA the wait for a reload happens inside the backward
that needs it and is not separated), cuda_max_allocated (``torch.cuda.max_memory_allocated`` or null).
"""
from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Protocol

from pipeoffload.fileio import DiskFull, no_space_text, write_atomic
from pipeoffload.ir import ActionKind, Schedule

log = logging.getLogger(__name__)


_RELOADS = (ActionKind.RELOAD, ActionKind.RELOAD_W)  # both windows' copies back (zb-h1, zb-v have the second)


def reload_seconds(trace: Any) -> float:
    """Seconds the step spent in reloads: RELOAD before a backward and RELOAD_W before a W."""
    return sum(r.end - r.start for r in trace.records if r.action.kind in _RELOADS)


class SimulatedPeaks:
    """The simulator's peak per pipeline rank for the measured per-stage bytes (cached). ``w_bytes``:
    per stage, the bytes a slot still held after its I (schedules that split B into I and W); the
    simulator holds that share of the slot until W, as the runtime does."""

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule
        self._key: tuple | None = None
        self._peaks: list[float] = []

    def __call__(self, unit_bytes: dict[int, int], w_bytes: dict[int, int] | None = None) -> list[float]:
        key = (tuple(sorted(unit_bytes.items())), tuple(sorted((w_bytes or {}).items())))
        if key != self._key:
            from pipeoffload.runtime.trace import measured_w_fractions, simulated_peaks

            fractions = measured_w_fractions(unit_bytes, w_bytes or {})
            # bytes are whole: a share times a slot's bytes may miss the integer by a rounding error
            self._peaks = [float(round(p)) for p in simulated_peaks(self.schedule, unit_bytes, fractions)]
            self._key = key
        return self._peaks


class MetricsLogger(Protocol):
    """Where rank 0 writes each logged step's record (the keys above)."""

    def log(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class MetricsError(RuntimeError):
    """A record could not be appended to ``metrics.jsonl`` (a full disk, above all); nothing of it was
    written. The message names the file, the step, the last complete checkpoint and how to continue."""


class JsonlLogger:
    """``metrics.jsonl`` of a run: one JSON object per logged step, each written whole or not at all
    (a write cut short is undone and stops the run: ``MetricsError``). On resume, lines after the
    checkpoint are dropped, and an incomplete last line (a write cut short by a crash) with a
    warning; a corrupt line before it is refused naming its line. A new run starts the file afresh
    (saying so when it held an earlier run's records)."""

    def __init__(self, path: Path, resume_step: int | None) -> None:
        self.path = path
        doing = f"rewriting {path} for the resume" if resume_step is not None else f"removing the earlier {path}"
        try:
            if resume_step is not None and path.is_file():
                kept = records_until(path, resume_step)
                write_atomic(path, "".join(line + "\n" for line in kept))
            elif resume_step is None:
                discard_earlier(path)
        except DiskFull as full:  # write_atomic's advice knows no checkpoint: say which one to continue from
            raise MetricsError(_write_failed(path, doing, full.error)) from full.error
        except OSError as err:
            raise MetricsError(_write_failed(path, doing, err)) from err

    def log(self, record: dict[str, Any]) -> None:
        data = (json.dumps(record) + "\n").encode()
        try:
            append_whole(self.path, data)
        except OSError as err:
            doing = f"appending the record of step {record.get('step')} to {self.path}"
            raise MetricsError(_write_failed(self.path, doing, err)) from err

    def close(self) -> None:
        pass


def append_whole(path: Path, data: bytes) -> None:
    """Append ``data`` to ``path``, or (on an error part-way: ENOSPC) cut the file back to where it ended,
    so a reader never finds part of a record."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        end = os.lseek(fd, 0, os.SEEK_END)
        try:
            done = 0
            while done < len(data):
                done += os.write(fd, data[done:])
        except OSError:
            with contextlib.suppress(OSError):  # truncating frees blocks: it works on a full disk
                os.ftruncate(fd, end)
            raise
    finally:
        os.close(fd)


def _write_failed(path: Path, doing: str, err: OSError) -> str:
    """One line: what failed on ``path`` (disk full or the error), the last complete checkpoint of its run
    and the command that continues it (the wording of a failed checkpoint save)."""
    from pipeoffload.train.checkpoint import list_checkpoints
    from pipeoffload.train.config import continue_with

    run_dir = path.parent
    found = list_checkpoints(run_dir) if run_dir.is_dir() else []
    if found:
        last = f"the last complete checkpoint is {found[-1].name}"
        then = f"continue with: {continue_with(run_dir)}"
    else:
        last, then = "no checkpoint was saved yet", "start the run again"
    if err.errno == errno.ENOSPC:
        free = shutil.disk_usage(run_dir).free if run_dir.is_dir() else 0
        return f"{no_space_text(doing, free)}; nothing of it was written; {last}; free some space, then {then}"
    reason = err.strerror or type(err).__name__
    return f"{doing} failed: {reason} (nothing of it was written); {last}; fix that, then {then}"


def parse_records(path: Path, then: str = "then resume again",
                  quiet: bool = False) -> list[tuple[int, str, dict[str, Any]]]:
    """(line number, text, record) of each line of ``metrics.jsonl``: what a resume rewrites and ``pipeoffload report``
    draws. An incomplete last line (no newline, not JSON: a write cut short by a crash or a full disk) is
    left out with a warning (none when ``quiet``); any other line that is not a JSON object raises
    ``ConfigError`` naming the file, the line and the fix (ending in ``then``)."""
    from pipeoffload.errors import ConfigError

    lines = path.read_bytes().split(b"\n")
    out = []
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
            row = json.loads(text)
        except (ValueError, RecursionError) as err:  # JSONDecodeError, UnicodeDecodeError, nesting too deep
            if number == len(lines):  # the last line, without its newline
                if not quiet:
                    log.warning("%s:%d: the last line is incomplete (%d bytes; a write cut short, e.g. by a crash or "
                                "a full disk): dropped", path, number, len(raw))
                continue
            reason = (err.msg if isinstance(err, json.JSONDecodeError) else "not UTF-8 text"
                      if isinstance(err, UnicodeDecodeError) else "nested too deeply")
            raise ConfigError(f"{path}:{number}: not a JSON object ({reason}); the file is corrupt: fix or delete "
                              f"that line (or the file), {then}") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{path}:{number}: expected a JSON object per line, got {type(row).__name__}; fix "
                              f"or delete that line (or the file), {then}")
        out.append((number, text, row))
    return out


def records_until(path: Path, step: int, quiet: bool = False) -> list[str]:
    """The lines of ``metrics.jsonl`` up to ``step`` (a resume's checkpoint), read by ``parse_records`` (an
    incomplete last line is dropped with a warning, none when ``quiet``: the launcher's check before the
    ranks start, ``check_records``); a line without a whole ``step`` raises ``ConfigError`` naming the file
    and line."""
    from pipeoffload.errors import ConfigError

    kept = []
    for number, text, row in parse_records(path, quiet=quiet):
        at = row.get("step", 0)
        if isinstance(at, bool) or not isinstance(at, int):
            raise ConfigError(f"{path}:{number}: step is {at!r}, not a whole number; fix or delete that line (or "
                              "the file), then resume again")
        if at <= step:
            kept.append(text)
    return kept


def check_records(path: Path, step: int) -> None:
    """Refuse (``ConfigError``, the ranks' own message) a ``metrics.jsonl`` a resume from ``step`` could not
    rewrite: in the launcher, before any rank starts, rather than in rank 0 once they all have."""
    if path.is_file():
        records_until(path, step, quiet=True)


def discard_earlier(path: Path) -> None:
    """A new run's ``metrics.jsonl`` starts empty: an earlier run's records there (a run without a
    checkpoint: else the new run is refused) are removed, with a warning saying so."""
    if not path.exists():
        return
    with contextlib.suppress(OSError):
        count = sum(1 for line in path.read_bytes().splitlines() if line.strip())
        if count:
            log.warning("%s held %d record%s of an earlier run in this folder (it saved no checkpoint): "
                        "replaced by this run's", path, count, "" if count == 1 else "s")
    path.unlink()


class TensorBoardLogger:
    """Event files under ``folder`` (``torch.utils.tensorboard``): one scalar per number of the record
    at its step, a per-rank list as ``KEY/rankR``; null values are left out. On resume the events
    after the checkpoint are purged (``purge_step``), as ``metrics.jsonl`` drops its lines."""

    def __init__(self, folder: Path, resume_step: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        if resume_step is None and folder.exists():
            shutil.rmtree(folder)
        self.writer = SummaryWriter(log_dir=str(folder),
                                    purge_step=None if resume_step is None else resume_step + 1)

    def log(self, record: dict[str, Any]) -> None:
        step = int(record["step"])
        for name, value in record.items():
            # the layout and the resume's mark are not scalars to plot
            if name == "step" or value is None or isinstance(value, (dict, str, bool)):
                continue
            if isinstance(value, list):
                for rank, v in enumerate(value):
                    self.writer.add_scalar(f"{name}/rank{rank}", v, step)
            else:
                self.writer.add_scalar(name, value, step)

    def close(self) -> None:
        self.writer.close()


def make_loggers(run_dir: Path | None, tensorboard: bool, resume_step: int | None) -> list[MetricsLogger]:
    """The run's loggers (rank 0 only): ``metrics.jsonl`` always, TensorBoard when asked; none without a run directory."""
    if run_dir is None:
        return []
    loggers: list[MetricsLogger] = [JsonlLogger(run_dir / "metrics.jsonl", resume_step)]
    if tensorboard:
        try:
            loggers.append(TensorBoardLogger(run_dir / "tensorboard", resume_step))
        except BaseException:
            close_loggers(loggers)
            raise
    return loggers


def close_loggers(loggers: list[MetricsLogger]) -> None:
    """Close every logger on a failure path: a close that fails too is logged, not raised over the failure."""
    for logger in loggers:
        try:
            logger.close()
        except Exception:  # noqa: BLE001 - the failure being raised is the one to report
            log.warning("closing the %s failed too", type(logger).__name__, exc_info=True)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
