"""``lower``: the one place lowering passes are chained, top to bottom."""
from __future__ import annotations

from pipeoffload.costs import CostModel
from pipeoffload.ir import Schedule
from pipeoffload.passes.comms import add_comms
from pipeoffload.validate import validate


def lower(schedule: Schedule, costs: CostModel | None = None, *, check: bool = True) -> Schedule:
    """Compute-only schedule -> executable schedule: (offload/reload: later issue) then SEND/RECV."""
    validate(schedule.compute_only()) if check else None
    lowered = add_comms(schedule)
    if check:
        validate(lowered)
    return lowered
