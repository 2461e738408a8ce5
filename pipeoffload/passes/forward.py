"""The forward-only schedule of a training schedule: what an evaluation runs.

Each rank keeps its F actions in the training schedule's order (the same placement and microbatch
order, so the same values cross the same boundaries); every backward, recompute and copy action is
dropped (without autograd nothing is saved, so nothing is kept, recomputed or offloaded), and the
SEND_F/RECV_F actions are inserted by ``add_comms`` as for any schedule. The result is validated
as forward-only, comm order included.
"""
from __future__ import annotations

from pipeoffload.ir import ActionKind, Schedule
from pipeoffload.passes.comms import add_comms
from pipeoffload.validation import validate


def forward_only(schedule: Schedule) -> Schedule:
    """``schedule`` (compute-only or lowered) -> its lowered forward-only schedule (validated)."""
    kept = [[a for a in row if a.kind is ActionKind.F] for row in schedule.actions]
    name = f"{schedule.name} forward-only" if schedule.name else "forward-only"
    lowered = add_comms(Schedule(tuple(map(tuple, kept)), schedule.placement, schedule.num_microbatches, name))
    validate(lowered, forward_only=True)
    return lowered
