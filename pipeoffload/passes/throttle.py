"""Throttled warm-up: a rank's forwards wait for its offloads, so they run no faster than its host link drains them.

In the warm-up of a pipeline schedule nothing frees an activation but its offload: a rank that runs a
forward every time unit while its copies leave slower (two ranks on one host link at k = 0.5 drain
one activation per 0.75 t between them) piles the difference up on the device. The warm-up forwards
of most schedules are early, though: they run as soon as their inputs are there, long before the
backwards that end the warm-up need them, so they can wait for copies at no cost in step time.

The rule, with a limit L (activations in flight per rank): before each warm-up forward (an F before
the rank's first backward in list order) the rank waits until its L-th most recently issued OFFLOAD
has completed (a ``WAIT`` action; none when it already waited for that one). At most L - 1 of its offloads are then still copying when a warm-up
forward starts. The pass plans the copies against the compute timing that the waits give
(``throttled_timeline``: the schedule simulated with every forward offloaded right after it and the
waits before the warm-up forwards), emits the waits with the copies (``offload._emit``), and keeps
the throttled plan only where its simulation has a lower peak, no stall and no longer makespan.
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

from pipeoffload import semantics as sem
from pipeoffload.costs import CostModel
from pipeoffload.errors import ScheduleError
from pipeoffload.intervals import EPS
from pipeoffload.ir import COMPUTE_KINDS, Action, ActionKind, Schedule
from pipeoffload.simulator import Timeline, simulate

K = ActionKind
Key = tuple[int, int]


def warmup_forwards(actions: Sequence[Action]) -> frozenset[int]:
    """List positions of the forwards before the rank's first backward (B or I)."""
    out = []
    for p, a in enumerate(actions):
        if a.kind is K.B or a.kind is K.I:
            break
        if a.kind is K.F:
            out.append(p)
    return frozenset(out)


def wait_target(issued: Sequence[Key], limit: int) -> Key | None:
    """The offload a throttled forward waits for: the ``limit``-th most recently issued one (None while
    fewer than ``limit`` were issued)."""
    return issued[-limit] if limit > 0 and len(issued) >= limit else None


def with_waits(actions: Sequence[Action], limit: int) -> list[Action]:
    """A rank's list (copies already in it) with a WAIT before each warm-up forward, by the rule above."""
    warm = warmup_forwards([a for a in actions if a.kind in COMPUTE_KINDS])
    out: list[Action] = []
    issued: list[Key] = []
    waited: set[Key] = set()  # a copy already waited for needs no second wait
    compute = 0  # position among the rank's compute actions
    for a in actions:
        if a.kind is K.OFFLOAD:
            issued.append((a.stage, a.microbatch))
        elif a.kind in COMPUTE_KINDS:
            target = wait_target(issued, limit) if compute in warm else None
            if target is not None and target not in waited:
                waited.add(target)
                out.append(Action(K.WAIT, *target))
            compute += 1
        out.append(a)
    return out


def throttled_timeline(base: Schedule, costs: CostModel, limit: int, exclude: set[Key] | frozenset[Key]) -> Timeline:
    """The compute timing of ``base`` when its warm-up forwards wait by the rule above, every forward
    (but the ``exclude``d) being offloaded right after it: a timeline of ``base`` (its compute actions'
    start and end times) for the pass to plan against."""
    rows = []
    for row in base.actions:
        offloaded: list[Action] = []
        for a in row:
            offloaded.append(a)
            if a.kind is K.F and (a.stage, a.microbatch) not in exclude:
                offloaded.append(Action(K.OFFLOAD, a.stage, a.microbatch))
        rows.append(with_waits(offloaded, limit))
    helper = simulate(base.with_actions(rows), costs)
    start, end = [], []
    for rank, helper_row in enumerate(rows):
        keep = [i for i, a in enumerate(helper_row) if a.kind in COMPUTE_KINDS]
        start.append(tuple(helper.start[rank][i] for i in keep))
        end.append(tuple(helper.end[rank][i] for i in keep))
    makespan = max((max(r, default=0.0) for r in end), default=0.0)
    return Timeline(base, costs, tuple(start), tuple(end), makespan, helper.per_rank, {})


# ---- repair of a nearly fitting throttled plan -------------------------------------------------
# A throttled warm-up with limit L holds at most L activations on a rank while its forwards run, but
# the one wait rule can delay a forward that has no slack: the pair's link serves its copies in the
# order they reach it (ties: the lower rank), so at the end of a rank's first chunk the partner's
# copy it needs may come one copy too late (group-interleaved d = 8, g = 8, k = 0.4: 3 units at
# 206.2 t, where 206 t is the step without copies). ``repair`` moves single copies and waits of such
# a plan, one at a time, and keeps each move that pushes the earliest problem (a compute action that
# starts after its latest start, or a rank above the target peak) later, until none is left.

_WINDOW = 6  # compute actions per rank before the earliest problem whose copies and waits may move
_BUDGET = 40  # simulations per rank the repair may spend


def latest_starts(base: Schedule, costs: CostModel, timeline: Timeline) -> list[list[float]]:
    """Per rank, per compute action of ``base`` (compute only, simulated as ``timeline``): the latest
    start that keeps the makespan (each action's successors are the next action of its rank and the
    actions that take its output, with their transfer delays)."""
    form = sem.coded(base)
    # the transfer delays the simulator gives a compute-only schedule's implicit messages
    inputs = form.inputs(costs.p2p_time if form.lowered else costs.p2p_time + 2 * costs.message_time)
    keys = form.keys.tolist()
    start = [x for row in timeline.start for x in row]
    end = [x for row in timeline.end for x in row]
    offsets = form.offsets.tolist()
    index = {key: i for i, key in enumerate(keys)}
    takers: list[list[tuple[int, float]]] = [[] for _ in keys]
    for i, (a, da, b, db) in enumerate(zip(inputs.first.tolist(), inputs.first_delay.tolist(),
                                           inputs.second.tolist(), inputs.second_delay.tolist())):
        for dep, delay in ((a, da), (b, db)):
            if dep >= 0 and dep in index:
                takers[index[dep]].append((i, delay))
    last = set(offsets[1:])
    latest = [0.0] * len(keys)
    for i in sorted(range(len(keys)), key=lambda i: (-start[i], -end[i], -i)):  # every successor first
        bound = timeline.makespan if i + 1 in last else latest[i + 1]
        for j, delay in takers[i]:
            bound = min(bound, latest[j] - delay)
        latest[i] = bound - (end[i] - start[i])
    return [latest[offsets[r]:offsets[r + 1]] for r in range(base.num_ranks)]


def eager_warmup(row: Sequence[Action], limit: int) -> list[Action]:
    """A rank's planned list with each warm-up forward's OFFLOAD (where it has one) right after the
    forward and the waits of ``with_waits(limit)``: the warm-up then holds at most ``limit`` units."""
    compute = [a for a in row if a.kind in COMPUTE_KINDS]
    warm = {(compute[p].stage, compute[p].microbatch) for p in warmup_forwards(compute)}
    moved = {(a.stage, a.microbatch) for a in row if a.kind is K.OFFLOAD and (a.stage, a.microbatch) in warm}
    out: list[Action] = []
    for a in row:
        if a.kind is K.WAIT or (a.kind is K.OFFLOAD and (a.stage, a.microbatch) in moved):
            continue
        out.append(a)
        if a.kind is K.F and (a.stage, a.microbatch) in moved:
            out.append(Action(K.OFFLOAD, a.stage, a.microbatch))
    return with_waits(out, limit)


def repair(base: Schedule, rows: list[list[Action]], costs: CostModel, peak: float,
           latest: list[list[float]]) -> list[list[Action]] | None:
    """``rows`` (``base`` with copies and waits) changed so that no compute action starts after its
    ``latest`` start and no rank holds more than ``peak`` units, without a stall; None if the moves
    below do not get there within the budget.

    Moves, on each rank's copies and waits among its ``_WINDOW`` compute actions up to the earliest
    problem: an OFFLOAD one compute action later or earlier (never before its F, never past an action
    of the same activation), a WAIT dropped or waiting for the offload issued before or after its own,
    a forward without a wait made to wait for the first of its rank's copying offloads to end.
    The first move that makes the earliest problem later (or, at the same time, leaves fewer problems)
    is kept; a move never has to be undone, so the search is greedy."""
    # the answer for lists already tried (a move and a later move can give the same lists, e.g. a copy moved
    # back): ``_problems`` depends on them alone here; each still counts against the budget, as before
    tried: dict[tuple[tuple[Action, ...], ...], tuple[tuple[float, int] | None, Timeline | None]] = {}

    def problems(rows: list[list[Action]]) -> tuple[tuple[float, int] | None, Timeline | None]:
        key = tuple(map(tuple, rows))
        if key not in tried:
            tried[key] = _problems(base, rows, costs, peak, latest)
        return tried[key]

    score, t = problems(rows)
    budget = _BUDGET * base.num_ranks
    while score is not None and t is not None and score[0] < math.inf:
        for rank, row in _moves(rows, t, score[0]):
            if budget <= 0:
                return None
            budget -= 1
            candidate = [row if r == rank else x for r, x in enumerate(rows)]
            found, found_t = problems(candidate)
            if found is not None and (found[0] > score[0] + EPS or (found[0] > score[0] - EPS and found[1] < score[1])):
                rows, score, t = candidate, found, found_t
                break
        else:
            return None  # no move helps
    return rows if score is not None else None


def _problems(base: Schedule, rows: list[list[Action]], costs: CostModel, peak: float, latest: list[list[float]]
              ) -> tuple[tuple[float, int] | None, Timeline | None]:
    """((time of the earliest problem, or inf; number of problems), simulation) of ``rows``; (None,
    None) where they stall or are not a valid schedule. Problems: a compute action that starts after
    its latest start, a memory level above ``peak``."""
    try:
        t = simulate(base.with_actions(rows), costs)
    except ScheduleError:
        return None, None
    if t.stall > 0:
        return None, None
    times = []
    for rank, row in enumerate(rows):
        compute = 0
        for a, start in zip(row, t.start[rank]):
            if a.kind in COMPUTE_KINDS:
                if start > latest[rank][compute] + EPS:
                    times.append(start)
                compute += 1
        times += [at for at, level in t.per_rank[rank].memory if level > peak + EPS]
    return (min(times, default=math.inf), len(times)), t


def _moves(rows: list[list[Action]], t: Timeline, horizon: float) -> Iterator[tuple[int, list[Action]]]:
    """(rank, changed list) for each move of ``repair`` among the rank's last ``_WINDOW`` compute
    actions that start at or before ``horizon``."""
    for rank, row in enumerate(rows):
        computes = [p for p, a in enumerate(row) if a.kind in COMPUTE_KINDS and t.start[rank][p] <= horizon + EPS]
        if not computes:
            continue
        lo, hi = computes[max(0, len(computes) - 1 - _WINDOW)], computes[-1]
        for p in range(lo, hi + 1):
            a = row[p]
            if a.kind is K.OFFLOAD:
                yield from ((rank, new) for new in (_shifted(row, p, 1), _shifted(row, p, -1)) if new is not None)
            elif a.kind is K.WAIT:
                yield rank, row[:p] + row[p + 1:]
                issued = [(b.stage, b.microbatch) for b in row[:p] if b.kind is K.OFFLOAD]
                at = issued.index((a.stage, a.microbatch))
                for other in (at - 1, at + 1):
                    wait = Action(K.WAIT, *issued[other]) if 0 <= other < len(issued) else None
                    if wait is not None and wait not in row:  # one wait per offload
                        yield rank, [*row[:p], wait, *row[p + 1:]]
            elif a.kind is K.F:
                wait = _first_to_drain(row, t.start[rank], t.end[rank], p)
                if wait is not None:  # (a later wait for the same offload has nothing left to wait for)
                    yield rank, [*row[:p], wait, *(b for b in row[p:] if b != wait)]


def _first_to_drain(row: list[Action], start: Sequence[float], end: Sequence[float], p: int) -> Action | None:
    """A WAIT for the offload issued before position ``p`` that is still copying when the action at
    ``p`` starts and ends first (None without one): the shortest wait that frees a unit before it."""
    waited = {(a.stage, a.microbatch) for a in row[:p] if a.kind is K.WAIT}  # (those after p may move here)
    copying = [(end[q], a) for q, a in enumerate(row[:p])
               if a.kind is K.OFFLOAD and end[q] > start[p] and (a.stage, a.microbatch) not in waited]
    if not copying:
        return None
    first = min(copying, key=lambda c: c[0])[1]
    return Action(K.WAIT, first.stage, first.microbatch)


def _shifted(row: list[Action], p: int, step: int) -> list[Action] | None:
    """``row`` with its copy at ``p`` moved past the next (step 1) or previous (step -1) compute
    action; None where that would pass an action of the same activation or leave the list."""
    a = row[p]
    q = p + step
    while 0 <= q < len(row) and row[q].kind not in COMPUTE_KINDS:
        if (row[q].stage, row[q].microbatch) == (a.stage, a.microbatch):
            return None
        q += step
    if not 0 <= q < len(row) or (row[q].stage, row[q].microbatch) == (a.stage, a.microbatch):
        return None
    rest = row[:p] + row[p + 1:]  # the compute action is at q - 1 there when q > p: the copy goes after it
    return [*rest[:q], a, *rest[q:]]
