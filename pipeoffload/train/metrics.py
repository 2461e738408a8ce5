"""Per-step measurements of every rank and the loggers that write them: ``metrics.jsonl`` and TensorBoard.

The loop brings every rank's measurements to every rank with one all-reduce of its own (not the
gradient norm's) and hands the record to each ``MetricsLogger`` on rank 0.

Keys (see docs/training.md): step, loss, val_loss, lr, grad_norm, tokens_per_s, step_s, and per
global rank peak_act_bytes (the runtime's measured peak of resident activations), sim_peak_act_bytes
(the simulator's peak for the same lowered schedule, with the measured bytes per stage as the unit
and the measured share of a slot kept between I and W),
host_bytes (peak bytes of offloaded activations on the host), reload_stall_s (seconds spent in
RELOAD actions: synchronous copies on CPU; on CUDA the wait for a reload happens inside the backward
that needs it and is not separated), cuda_max_allocated (``torch.cuda.max_memory_allocated`` or null).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Protocol

from pipeoffload.fileio import write_atomic
from pipeoffload.ir import ActionKind, Schedule


def reload_seconds(trace: Any) -> float:
    return sum(r.end - r.start for r in trace.records if r.action.kind == ActionKind.RELOAD)


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


class JsonlLogger:
    """``metrics.jsonl`` of a run: one JSON object per logged step; on resume, lines after the
    checkpoint are dropped, and a new run starts the file afresh."""

    def __init__(self, path: Path, resume_step: int | None) -> None:
        self.path = path
        if resume_step is not None and path.is_file():
            kept = [line for line in path.read_text().splitlines() if line.strip()
                    and json.loads(line).get("step", 0) <= resume_step]
            write_atomic(path, "".join(line + "\n" for line in kept))
        elif resume_step is None and path.exists():
            path.unlink()

    def log(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as fh:
            fh.write(json.dumps(record) + "\n")

    def close(self) -> None:
        pass


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
            if name == "step" or value is None:
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
        loggers.append(TensorBoardLogger(run_dir / "tensorboard", resume_step))
    return loggers


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
