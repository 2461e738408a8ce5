"""Insert SEND/RECV actions: each send right after its producer, each receive right before its consumer.

Which compute action gets which receive before it and which send after it is
``semantics.transfers`` (from the "waits for" rule and the placement), looked up once per (kind,
stage). Between two compute actions a rank then has one run of comm actions, [sends of the previous
action, receives for the next], which the runtime posts as one batch. With that grouping a schedule
whose compute order respects data dependencies cannot deadlock under blocking p2p semantics
(``validate.check_p2p_order`` proves it for each lowered schedule).

The insertion runs on the integer-coded form (``semantics.CodedSchedule``): the new actions' codes are
written into widened arrays, the comm actions are built from them in bulk (the kept actions are moved,
not rebuilt), and the result carries its coded form, so that validating and simulating it do not build
that again.
"""
from __future__ import annotations

from itertools import chain

import numpy as np

from pipeoffload import semantics as sem
from pipeoffload._perf import gc_paused
from pipeoffload.ir import Action, Schedule, make_actions

_IS_COMM = (sem.LANE == sem.SEND) | (sem.LANE == sem.RECV)


def add_comms(schedule: Schedule) -> Schedule:
    """Return ``schedule`` with SEND/RECV inserted (existing comm actions are replaced), carrying its
    coded form (``Schedule.coded``)."""
    with gc_paused():
        return _add_comms(schedule)


def _plan(stage_to_rank: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Per (kind code, stage): the kind codes of the receives before such an action and of the sends
    after it, padded with -1 (arrays kinds x stages x most). Send and receive kinds have none: existing
    comm actions are dropped. A kind the semantics has no rule for raises here, before any action is
    placed."""
    num_stages = len(stage_to_rank)
    arounds = {(sem.CODE[kind], s): sem.transfers(kind, s, stage_to_rank)
               for kind in sem.KINDS if sem.lane_of(kind) not in (sem.SEND, sem.RECV) for s in range(num_stages)}
    most = max((len(side) for around in arounds.values() for side in around), default=0)
    before = np.full((len(sem.KINDS), num_stages, most), -1, dtype=np.int64)
    after = before.copy()
    for (code, s), (receives, sends) in arounds.items():
        before[code, s, :len(receives)] = [sem.CODE[k] for k in receives]
        after[code, s, :len(sends)] = [sem.CODE[k] for k in sends]
    return before, after


def _add_comms(schedule: Schedule) -> Schedule:
    c = sem.coded(schedule)
    before, after = _plan(schedule.placement.stage_to_rank)
    keep = np.flatnonzero(~_IS_COMM[c.kind])
    kind, stage = c.kind[keep], c.stage[keep]
    receives = (before[kind, stage] >= 0).sum(axis=1)
    sends = (after[kind, stage] >= 0).sum(axis=1)
    width = 1 + receives + sends
    at = np.cumsum(width) - width + receives  # where each kept action lands
    codes = np.repeat(kind, width)
    for j in range(before.shape[2]):  # the j-th receive before, the j-th send after
        sel = receives > j
        codes[at[sel] - receives[sel] + j] = before[kind[sel], stage[sel], j]
        sel = sends > j
        codes[at[sel] + 1 + j] = after[kind[sel], stage[sel], j]
    stages, microbatches = np.repeat(stage, width), np.repeat(c.microbatch[keep], width)
    lengths = np.bincount(c.rank[keep], weights=width, minlength=c.num_ranks).astype(np.int64)
    rows = _rows(schedule, keep, at, codes, stages, microbatches, lengths)
    lowered = Schedule(rows, schedule.placement, schedule.num_microbatches, schedule.name)
    return sem.with_coded(lowered, sem.CodedSchedule.of_arrays(lowered, lengths, codes, stages, microbatches))


def _rows(schedule: Schedule, keep: np.ndarray, at: np.ndarray, codes: np.ndarray, stages: np.ndarray,
          microbatches: np.ndarray, lengths: np.ndarray) -> tuple[tuple[Action, ...], ...]:
    """The per-rank action tuples: the kept actions of ``schedule`` (flat indices ``keep``) are the same
    objects, moved to their new flat positions ``at``; only the comm actions are built (in bulk). The
    moves run on object arrays, in C: about a tenth of what building every action anew costs."""
    old = np.fromiter(chain.from_iterable(schedule.actions), dtype=object, count=schedule.num_actions())
    flat = np.empty(len(codes), dtype=object)
    flat[at] = old[keep]
    fresh = np.ones(len(codes), dtype=bool)
    fresh[at] = False
    new = np.flatnonzero(fresh)
    flat[new] = np.fromiter(make_actions(map(sem.KINDS.__getitem__, codes[new].tolist()), stages[new].tolist(),
                                         microbatches[new].tolist()), dtype=object, count=len(new))
    actions = flat.tolist()
    offsets = np.concatenate(([0], np.cumsum(lengths))).tolist()
    return tuple(tuple(actions[offsets[r]:offsets[r + 1]]) for r in range(len(lengths)))
