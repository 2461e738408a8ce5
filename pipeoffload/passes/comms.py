"""Insert SEND/RECV actions: each send right after its producer, each receive right before its consumer.

Which compute action gets which receive before it and which send after it is
``semantics.transfers`` (from the "waits for" rule and the placement), looked up once per (kind,
stage). Between two compute actions a rank then has one run of comm actions, [sends of the previous
action, receives for the next], which the runtime posts as one batch. With that grouping a schedule
whose compute order respects data dependencies cannot deadlock under blocking p2p semantics
(``validate.check_p2p_order`` proves it for each lowered schedule).
"""
from __future__ import annotations

from pipeoffload import semantics as sem
from pipeoffload._perf import gc_paused
from pipeoffload.ir import Action, ActionKind, Schedule

Around = tuple[tuple[ActionKind, ...], tuple[ActionKind, ...]]


def add_comms(schedule: Schedule) -> Schedule:
    """Return ``schedule`` with SEND/RECV inserted (existing comm actions are replaced)."""
    with gc_paused():
        return _add_comms(schedule)


def _plan(stage_to_rank: tuple[int, ...]) -> dict[ActionKind, list[Around | None]]:
    """Per kind and stage: (receives before, sends after), None where there are none (copies never
    have any). Send and receive kinds are absent: existing comm actions are dropped. A kind the
    semantics has no rule for raises here, before any action is placed."""
    plan: dict[ActionKind, list[Around | None]] = {}
    for kind in sem.KINDS:
        lane = sem.lane_of(kind)
        if lane == sem.SEND or lane == sem.RECV:
            continue
        arounds = [sem.transfers(kind, s, stage_to_rank) for s in range(len(stage_to_rank))]
        plan[kind] = [None if around == ((), ()) else around for around in arounds]
    return plan


def _add_comms(schedule: Schedule) -> Schedule:
    plan = _plan(schedule.placement.stage_to_rank)
    rows = []
    for row in schedule.actions:
        out: list[Action] = []
        append = out.append
        for a in row:
            per_stage = plan.get(a.kind)
            if per_stage is None:  # a comm action: replaced by the ones inserted here
                if sem.lane_of(a.kind) not in (sem.SEND, sem.RECV):
                    raise sem.unknown_kind(a.kind, "add_comms")
                continue
            around = per_stage[a.stage]
            if around is None:
                append(a)
                continue
            before, after = around
            for kind in before:
                append(Action(kind, a.stage, a.microbatch))
            append(a)
            for kind in after:
                append(Action(kind, a.stage, a.microbatch))
        rows.append(out)
    return schedule.with_actions(rows)
