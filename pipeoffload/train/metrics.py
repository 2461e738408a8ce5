"""Per-step measurements of every rank (brought to every rank with the gradient norm's all-reduce) and ``metrics.jsonl``.

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
from pathlib import Path
from typing import Any

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


class MetricsFile:
    """``metrics.jsonl`` of a run (rank 0 only); on resume, lines after the checkpoint are dropped."""

    def __init__(self, path: Path, resume_step: int | None) -> None:
        self.path = path
        if resume_step is not None and path.is_file():
            kept = [line for line in path.read_text().splitlines() if line.strip()
                    and json.loads(line).get("step", 0) <= resume_step]
            write_atomic(path, "".join(line + "\n" for line in kept))
        elif resume_step is None and path.exists():
            path.unlink()

    def write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as fh:
            fh.write(json.dumps(record) + "\n")


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
