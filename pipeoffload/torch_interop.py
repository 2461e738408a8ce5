"""Round trips with ``torch.distributed.pipelining`` through its compute-only CSV format.

- ``torch_order_csv``: the order one of torch's schedule classes builds (e.g. ``ZBVZeroBubble``,
  ``InterleavedZeroBubble``, ``DualPipeV``), written the way its ``_dump_csv(format="compute_only")``
  writes it: one row per rank, empty cells where torch leaves a deliberate bubble.
- ``schedule_from_torch_csv``: such a CSV as our ``Schedule``. Torch's overlapped forward+backward
  cells, ``(0F3;7B1)OVERLAP_F_B`` (DualPipeV), become the forward followed by the backward: our IR
  has no overlap action, so the simulator times them back to back (``ir.expand_overlaps``, torch-free:
  ``pipeoffload simulate FILE.csv`` reads this form too).
- ``load_in_torch_runtime``: our schedule's CSV loaded into torch's private
  ``_PipelineScheduleRuntime``: torch validates it, lowers it with its own SEND/RECV pass and
  dry-runs the result for deadlocks (``_simulate``).

Torch builds a schedule's order from its stage objects but reads only their sizes and rank
(``num_stages``, ``group_size``, ``group_rank``, ``submod``); ``_ShapeOnlyStage`` carries exactly
those, so no process group or model is needed (torch's own ``_schedule_visualizer`` does the same
with ``unittest.mock``). torch is imported inside the functions: the pure core never imports it.
"""
from __future__ import annotations

import csv
import io
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

from pipeoffload.errors import ConfigError
from pipeoffload.ir import TORCH_BOOKKEEPING, Schedule, expand_overlaps
from pipeoffload.schedules import schedule_specs

# Our family -> torch's schedule class of the same algorithm (for side-by-side benchmarks): a registry fact.
TORCH_EQUIVALENTS = {spec.name: spec.torch_class for spec in schedule_specs() if spec.torch_class}


@dataclass
class _ShapeOnlyStage:
    """What torch's schedule constructors read from a stage, and nothing else (no module, no comms)."""

    group_rank: int
    group_size: int
    num_stages: int
    submod: Any = None
    stage_index_to_group_rank: dict[int, int] = field(default_factory=dict)


def _torch_schedule(class_name: str, num_ranks: int, num_microbatches: int, stages_per_rank: int) -> Any:
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

    try:
        cls = get_schedule_class(class_name)
    except ValueError as err:
        raise ConfigError(f"torch schedule={class_name!r}: {err}") from None
    num_stages = num_ranks * stages_per_rank
    if issubclass(cls, PipelineScheduleSingle):
        if stages_per_rank != 1:
            raise ConfigError(f"stages_per_rank={stages_per_rank}: torch's {class_name} holds one stage per rank")
        return cls(_ShapeOnlyStage(0, num_ranks, num_stages), num_microbatches)
    stages = [_ShapeOnlyStage(0, num_ranks, num_stages) for _ in range(stages_per_rank)]
    return cls(stages, num_microbatches)


def torch_order_csv(class_name: str, num_ranks: int, num_microbatches: int, stages_per_rank: int = 1) -> str:
    """Torch's compute-only order for ``class_name`` (a ``get_schedule_class`` name), as CSV text."""
    schedule = _torch_schedule(class_name, num_ranks, num_microbatches, stages_per_rank)
    order = schedule.pipeline_order
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for rank in range(num_ranks):
        writer.writerow(["" if a is None else str(a) for a in order[rank]])
    return out.getvalue()


def schedule_from_torch_csv(text: str, name: str = "") -> Schedule:
    """A torch compute-only CSV (bubbles, overlapped F&B cells and all) as our compute-only Schedule."""
    return Schedule.from_csv(expand_overlaps(text), name=name)


def torch_schedule(class_name: str, num_ranks: int, num_microbatches: int, stages_per_rank: int = 1) -> Schedule:
    """Torch's order for ``class_name`` read back through its CSV form."""
    text = torch_order_csv(class_name, num_ranks, num_microbatches, stages_per_rank)
    return schedule_from_torch_csv(text, name=f"torch:{class_name}")


def load_in_torch_runtime(schedule: Schedule) -> dict[int, list[str]]:
    """Load ``schedule``'s CSV into torch's ``_PipelineScheduleRuntime`` and dry-run it there.

    Torch validates the order, lowers it with its own comm pass and dry-runs the lowered order; any
    of those raises on a bad schedule. Returns torch's lowered order (rank -> action strings).
    The dry run (``_simulate_comms_compute``) is given the lowered order without the UNSHARD/RESHARD
    /REDUCE_GRAD actions torch's lowering adds for FSDP: in torch 2.13 it rejects those kinds
    ("Unsupported action type"), and they carry no stage-to-stage data.
    """
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    if any(a.kind.value not in ("F", "B", "I", "W") for row in schedule.actions for a in row):
        raise ConfigError(
            f"schedule={schedule.name!r}: torch's CSV loader takes compute-only F/B/I/W orders; pass "
            "schedule.compute_only() (R, OFFLOAD and RELOAD have no torch equivalent)"
        )
    stages = [_ShapeOnlyStage(0, schedule.num_ranks, schedule.num_stages) for _ in range(schedule.stages_per_rank)]
    runtime = _PipelineScheduleRuntime(stages, schedule.num_microbatches)
    fd, path = tempfile.mkstemp(suffix=".csv")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(schedule.to_csv())
        runtime._load_csv(path, format="compute_only")
    finally:
        os.unlink(path)
    from torch.distributed.pipelining.schedules import _simulate_comms_compute

    lowered = {rank: [a for a in actions if not TORCH_BOOKKEEPING.match(str(a))]
               for rank, actions in runtime.pipeline_order_with_comms.items()}
    _simulate_comms_compute(lowered, lambda s: runtime.stage_index_to_group_rank[s], schedule.num_stages)
    return {rank: [str(a) for a in actions] for rank, actions in runtime.pipeline_order_with_comms.items()}
