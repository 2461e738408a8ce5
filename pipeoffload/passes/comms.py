"""Insert SEND/RECV actions: each send right after its producer, each receive right before its consumer.

Between two compute actions a rank then has one run of comm actions, [sends of the previous action,
receives for the next], which the runtime posts as one batch. With that grouping a schedule whose
compute order respects data dependencies cannot deadlock under blocking p2p semantics
(``validate.check_p2p_order`` proves it for each lowered schedule).
"""
from __future__ import annotations

from pipeoffload._perf import gc_paused
from pipeoffload.ir import COMM_KINDS, Action, ActionKind, Schedule

K = ActionKind


def add_comms(schedule: Schedule) -> Schedule:
    """Return ``schedule`` with SEND/RECV inserted (existing comm actions are replaced)."""
    with gc_paused():
        return _add_comms(schedule)


def _add_comms(schedule: Schedule) -> Schedule:
    owner = schedule.placement.stage_to_rank
    last = len(owner) - 1
    # per stage: does its input come from / its output go to another rank?
    cross_in = [s > 0 and owner[s - 1] != owner[s] for s in range(last + 1)]
    cross_out = [s < last and owner[s + 1] != owner[s] for s in range(last + 1)]
    F, B, I = K.F, K.B, K.I  # noqa: E741
    rows = []
    for row in schedule.actions:
        out: list[Action] = []
        append = out.append
        for a in row:
            kind = a.kind
            if kind is F:
                if cross_in[a.stage]:
                    append(Action(K.RECV_F, a.stage, a.microbatch))
                append(a)
                if cross_out[a.stage]:
                    append(Action(K.SEND_F, a.stage, a.microbatch))
            elif kind is B or kind is I:
                if cross_out[a.stage]:
                    append(Action(K.RECV_B, a.stage, a.microbatch))
                append(a)
                if cross_in[a.stage]:
                    append(Action(K.SEND_B, a.stage, a.microbatch))
            elif kind not in COMM_KINDS:
                append(a)
        rows.append(out)
    return schedule.with_actions(rows)
