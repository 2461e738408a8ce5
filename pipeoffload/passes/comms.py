"""Insert SEND/RECV actions: each send right after its producer, each receive right before its consumer.

Between two compute actions a rank then has one run of comm actions, [sends of the previous action,
receives for the next], which the runtime posts as one batch. With that grouping a schedule whose
compute order respects data dependencies cannot deadlock under blocking p2p semantics
(``validate.check_p2p_order`` proves it for each lowered schedule).
"""
from __future__ import annotations

from pipeoffload._perf import gc_paused
from pipeoffload.ir import COMM_KINDS, Action, ActionKind, Schedule
from pipeoffload.placement import Placement

K = ActionKind


def _receives(a: Action, placement: Placement, rank: int) -> list[Action]:
    last = placement.num_stages - 1
    if a.kind == K.F and a.stage > 0 and placement.rank_of(a.stage - 1) != rank:
        return [Action(K.RECV_F, a.stage, a.microbatch)]
    if a.kind in (K.B, K.I) and a.stage < last and placement.rank_of(a.stage + 1) != rank:
        return [Action(K.RECV_B, a.stage, a.microbatch)]
    return []


def _sends(a: Action, placement: Placement, rank: int) -> list[Action]:
    last = placement.num_stages - 1
    if a.kind == K.F and a.stage < last and placement.rank_of(a.stage + 1) != rank:
        return [Action(K.SEND_F, a.stage, a.microbatch)]
    if a.kind in (K.B, K.I) and a.stage > 0 and placement.rank_of(a.stage - 1) != rank:
        return [Action(K.SEND_B, a.stage, a.microbatch)]
    return []


def add_comms(schedule: Schedule) -> Schedule:
    """Return ``schedule`` with SEND/RECV inserted (existing comm actions are replaced)."""
    with gc_paused():
        return _add_comms(schedule)


def _add_comms(schedule: Schedule) -> Schedule:
    placement = schedule.placement
    rows = []
    for rank, row in enumerate(schedule.actions):
        out: list[Action] = []
        for a in row:
            if a.kind in COMM_KINDS:
                continue
            out.extend(_receives(a, placement, rank))
            out.append(a)
            out.extend(_sends(a, placement, rank))
        rows.append(out)
    return schedule.with_actions(rows)
