"""The one validator: every schedule, generated, lowered or hand-written, passes through here.

Checks per (stage, microbatch): exactly one F and either one B or one I and one W, in dependency
order on the owning rank; R only between F and the backward, at most once; OFFLOAD after F and
before the backward, RELOAD after OFFLOAD and before the backward; each stage's actions on its
placement rank; and, for lowered schedules, SEND/RECV present exactly where ranks differ and in
order. ``check_p2p_order`` dry-runs the comm order with the runtime's p2p semantics.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Iterable

from pipeoffload.errors import ScheduleError
from pipeoffload.ir import COMM_KINDS, Action, ActionKind, Schedule

K = ActionKind


def validate(schedule: Schedule) -> None:
    """Raise ``ScheduleError`` (rank, step, action and the marked grid) at the first violation."""
    placement = schedule.placement
    rows = schedule.actions
    positions: dict[tuple[ActionKind, int, int], tuple[int, int]] = {}

    def fail(reason: str, rank: int | None = None, step: int | None = None) -> None:
        action = rows[rank][step] if rank is not None and step is not None else None
        raise ScheduleError(reason, rank, step, action, rows)

    for rank, row in enumerate(rows):
        for step, a in enumerate(row):
            if not 0 <= a.stage < placement.num_stages:
                fail(f"stage {a.stage} outside 0..{placement.num_stages - 1}", rank, step)
            if not 0 <= a.microbatch < schedule.num_microbatches:
                fail(f"microbatch {a.microbatch} outside 0..{schedule.num_microbatches - 1}", rank, step)
            if placement.rank_of(a.stage) != rank:
                fail(f"stage {a.stage} belongs to rank {placement.rank_of(a.stage)}", rank, step)
            key = (a.kind, a.stage, a.microbatch)
            if key in positions:
                r0, s0 = positions[key]
                fail(f"duplicate {a}: already at rank {r0} step {s0}", rank, step)
            positions[key] = (rank, step)

    def pos(kind: ActionKind, stage: int, mb: int) -> int | None:
        found = positions.get((kind, stage, mb))
        return None if found is None else found[1]

    def before(first: int | None, second: int | None) -> bool:
        return first is not None and second is not None and first < second

    lowered = schedule.is_lowered()
    last_stage = placement.num_stages - 1
    for stage in range(placement.num_stages):
        rank = placement.rank_of(stage)
        for mb in range(schedule.num_microbatches):
            f, b = pos(K.F, stage, mb), pos(K.B, stage, mb)
            i, w = pos(K.I, stage, mb), pos(K.W, stage, mb)
            r, off, rel = pos(K.R, stage, mb), pos(K.OFFLOAD, stage, mb), pos(K.RELOAD, stage, mb)
            here = f"stage {stage}, microbatch {mb}"
            if f is None:
                fail(f"{here} has no F ({stage}F{mb}) on rank {rank}")
            if b is not None and (i is not None or w is not None):
                fail(f"{here} has both B and I/W: use one full backward or the split pair", rank, b)
            if b is None and (i is None or w is None):
                missing = "B" if i is None and w is None else ("I" if i is None else "W")
                fail(f"{here} has no {missing}: every F needs one B, or one I and one W", rank, f)
            back = b if b is not None else i
            assert back is not None
            if not before(f, back):
                fail(f"backward of {here} runs before its F at step {f}", rank, back)
            if w is not None and not before(i, w):
                fail(f"W of {here} runs before its I at step {i}", rank, w)
            if r is not None and not (before(f, r) and before(r, back)):
                fail(f"R of {here} must come after its F (step {f}) and before its backward (step {back})", rank, r)
            if r is not None and off is not None:
                fail(f"{here} is both recomputed and offloaded: choose one per (stage, microbatch)", rank, off)
            if off is not None or rel is not None:
                if off is None or rel is None:
                    fail(f"{here} needs both OFFLOAD and RELOAD", rank, off if off is not None else rel)
                if not before(f, off):
                    fail(f"OFFLOAD of {here} runs before its F at step {f}", rank, off)
                if not before(off, rel):
                    fail(f"RELOAD of {here} runs before its OFFLOAD at step {off}", rank, rel)
                if not before(rel, back):
                    fail(f"RELOAD of {here} must come before its backward at step {back}", rank, rel)
            _check_local_chain(schedule, positions, stage, mb, back, fail)
            if lowered:
                _check_comms(schedule, positions, stage, mb, back, last_stage, fail)
    if lowered:
        check_p2p_order(schedule)


def _check_local_chain(schedule, positions, stage, mb, back, fail) -> None:  # type: ignore[no-untyped-def]
    """Neighbouring stages on the same rank must run in data-dependency order."""
    placement = schedule.placement
    rank = placement.rank_of(stage)
    f = positions[(K.F, stage, mb)][1]
    if stage > 0 and placement.rank_of(stage - 1) == rank:
        prev = positions.get((K.F, stage - 1, mb))
        if prev is not None and prev[1] > f:
            fail(f"F of stage {stage}, microbatch {mb} runs before F of stage {stage - 1} on the same rank", rank, f)
    if stage < placement.num_stages - 1 and placement.rank_of(stage + 1) == rank:
        nxt = positions.get((K.B, stage + 1, mb)) or positions.get((K.I, stage + 1, mb))
        if nxt is not None and nxt[1] > back:
            fail(f"backward of stage {stage}, microbatch {mb} runs before stage {stage + 1}'s on the same rank",
                 rank, back)


def _check_comms(schedule, positions, stage, mb, back, last_stage, fail) -> None:  # type: ignore[no-untyped-def]
    placement = schedule.placement
    rank = placement.rank_of(stage)
    f = positions[(K.F, stage, mb)][1]
    edges = []
    if stage < last_stage:  # activation to stage + 1
        edges.append((K.SEND_F, stage, f, +1, stage + 1))
    if stage > 0:  # activation from stage - 1
        edges.append((K.RECV_F, stage, f, -1, stage - 1))
        edges.append((K.SEND_B, stage, back, +1, stage - 1))
    if stage < last_stage:
        edges.append((K.RECV_B, stage, back, -1, stage + 1))
    for kind, st, anchor, direction, peer_stage in edges:
        found = positions.get((kind, st, mb))
        crosses = placement.rank_of(peer_stage) != rank
        if crosses and found is None:
            fail(f"{st}{kind.value}{mb} missing: stage {st} and {peer_stage} are on different ranks", rank, anchor)
        if not crosses and found is not None:
            fail(f"{found and str(Action(kind, st, mb))} is not needed: stage {peer_stage} is on the same rank",
                 rank, found[1])
        if found is not None:
            ok = found[1] > anchor if direction > 0 else found[1] < anchor
            if not ok:
                what = "after" if direction > 0 else "before"
                fail(f"{Action(kind, st, mb)} must come {what} step {anchor}", rank, found[1])


def _partner(a: Action) -> tuple[ActionKind, int, int]:
    """The action on the other rank that completes the same transfer."""
    if a.kind == K.SEND_F:
        return (K.RECV_F, a.stage + 1, a.microbatch)
    if a.kind == K.RECV_F:
        return (K.SEND_F, a.stage - 1, a.microbatch)
    if a.kind == K.SEND_B:
        return (K.RECV_B, a.stage - 1, a.microbatch)
    return (K.SEND_B, a.stage + 1, a.microbatch)


def comm_batches(row: Iterable[Action]) -> list[list[Action] | Action]:
    """Group each maximal run of consecutive comm actions into one batch (posted together)."""
    out: list[list[Action] | Action] = []
    for a in row:
        if a.kind in COMM_KINDS:
            if out and isinstance(out[-1], list):
                out[-1].append(a)
            else:
                out.append([a])
        else:
            out.append(a)
    return out


def check_p2p_order(schedule: Schedule) -> None:
    """Dry-run the comm order as the runtime executes it: each run of consecutive SEND/RECV actions
    is posted as one batch; sends never block (they are waited for at the end of the step), and the
    rank blocks until every receive of its batch has been matched by a posted send. Raises
    ``ScheduleError`` naming every stuck rank if the order can deadlock. (A strict rendezvous, in
    which a send blocks until its receive is posted, would reject GPipe with several stages per rank.)"""
    programs = [comm_batches(r) for r in schedule.actions]
    pointer = [0] * len(programs)
    completed: set[tuple[ActionKind, int, int]] = set()
    progress = True
    while progress:
        progress = False
        posted = {
            (a.kind, a.stage, a.microbatch)
            for rank, prog in enumerate(programs)
            if pointer[rank] < len(prog) and isinstance(prog[pointer[rank]], list)
            for a in prog[pointer[rank]]  # type: ignore[union-attr]
        }
        for rank, prog in enumerate(programs):
            while pointer[rank] < len(prog):
                item = prog[pointer[rank]]
                if isinstance(item, Action):
                    pointer[rank] += 1
                    progress = True
                    continue
                partners = [_partner(a) for a in item if a.kind in (K.RECV_F, K.RECV_B)]
                if all(p in posted or p in completed for p in partners):
                    completed.update((a.kind, a.stage, a.microbatch) for a in item)
                    pointer[rank] += 1
                    progress = True
                    continue
                break
    stuck = [r for r, prog in enumerate(programs) if pointer[r] < len(prog)]
    if stuck:
        lines = []
        for rank in stuck:
            batch = programs[rank][pointer[rank]]
            assert isinstance(batch, list)
            waiting = [str(a) for a in batch if a.kind in (K.RECV_F, K.RECV_B) and _partner(a) not in completed]
            lines.append(f"rank {rank} blocks on {{{', '.join(waiting)}}}")
        first = stuck[0]
        step = _step_of(schedule.actions[first], programs[first], pointer[first])
        raise ScheduleError("comm order deadlocks (receives wait on sends never posted): " + "; ".join(lines),
                            first, step, schedule.actions[first][step], schedule.actions)


def _step_of(row: tuple[Action, ...], program: list, index: int) -> int:  # type: ignore[type-arg]
    step = 0
    for item in program[:index]:
        step += len(item) if isinstance(item, list) else 1
    return min(step, len(row) - 1)
