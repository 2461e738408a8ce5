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

from collections.abc import Sequence

from pipeoffload.costs import CostModel
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
