"""Timing a pipeline schedule as Megatron-LM runs it: blocking, batched point-to-point exchanges.

The simulator (and pipeoffload's own runtime) posts a send as soon as a stage's output exists and
lets the receiver wait only for the data ("eager"). Megatron-LM's pipeline schedules instead run, on
every rank, a sequence of *steps*, each followed by ONE blocking exchange
(``torch.distributed.batch_isend_irecv`` + wait + ``torch.cuda.synchronize``, 2021-2022 code): it sends
the step's outputs and receives the next step's inputs, and the rank computes nothing until every
transfer of the exchange has completed, which needs each peer to have posted its matching exchange.

- 1F1B (``forward_backward_pipelining_without_interleaving``): a step is one F or one B
  (``send_forward_recv_backward`` after F, ``send_backward_recv_forward`` after B);
- interleaved 1F1B (``..._with_interleaving``): warm-up and cool-down steps are one F or one B, but a
  steady-state step is an F of one chunk AND a B of another, with one
  ``send_forward_backward_recv_forward_backward`` after both: a forward's output leaves only after
  the following backward, and the gradient a backward needs must have arrived before the step's
  forward starts. Neighbouring ranks therefore advance in lock-step, and a rank in its warm-up waits
  at each exchange for neighbours that are already running forward + backward steps. With as many
  microbatches as ranks (``all_warmup_microbatches``) every rank runs all its forwards, then all its
  backwards, the first gradient received in a ``recv_backward`` exchange of its own (``megatron_order``).

``lockstep_makespan`` times a compute-only F/B schedule under these rules (a max-plus recurrence over
exchanges: an exchange completes ``cost`` after the later of its rank and each of its peers reaches it,
``cost`` being one transfer per message in the busier direction, ``p2p_time`` each). It returns the
makespan and each rank's compute time, for ``estimate`` with ``p2p="megatron"``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from pipeoffload.costs import CostModel
from pipeoffload.errors import ScheduleError
from pipeoffload.ir import Action, ActionKind, Schedule

F, B = ActionKind.F, ActionKind.B
Message = tuple[str, int, int]  # ("f" activation | "b" gradient, receiving stage, microbatch)


@dataclass
class _Exchange:
    sends: list[tuple[int, Message]]  # (peer rank, message)
    recvs: list[tuple[int, Message]]


def megatron_steps(row: tuple[Action, ...], interleaved: bool) -> list[list[Action]]:
    """A rank's compute actions grouped into Megatron's steps (see the module docstring)."""
    if any(a.kind not in (F, B) for a in row):
        raise ScheduleError("Megatron's exchange timing applies to F/B schedules only (no I/W/R/copies)")
    kinds = [a.kind for a in row]
    if not interleaved or B not in kinds:
        return [[a] for a in row]
    first_b = kinds.index(B)
    if F not in kinds[first_b:]:  # all warm-up: an empty step stands for the recv_backward exchange
        return [[a] for a in row[:first_b]] + [[]] + [[a] for a in row[first_b:]]
    steady_from = first_b - 1
    steps: list[list[Action]] = []
    k = 0
    while k < len(row):
        if k >= steady_from and k + 1 < len(row) and row[k].kind == F and row[k + 1].kind == B:
            steps.append([row[k], row[k + 1]])
            k += 2
        else:
            steps.append([row[k]])
            k += 1
    return steps


def megatron_order(schedule: Schedule, interleaved: bool) -> Schedule:
    """``schedule`` in the order Megatron-LM runs it. Its interleaved loop (2021
    ``forward_backward_pipelining_with_interleaving``, commit 6985e58938) runs every forward and then every
    backward on EVERY rank when the microbatches number the ranks (``get_num_microbatches() ==
    pipeline_parallel_size``: ``all_warmup_microbatches``), where the generator's warm-up depth
    (v - 1) d + 2 (d - 1 - r) gives the ranks past the middle a steady state; otherwise the two orders
    agree (tests/unit/test_exchange.py checks both against a transcription of the loop)."""
    d = schedule.placement.num_ranks
    if not interleaved or schedule.num_microbatches != d:
        return schedule
    rows = tuple(tuple(a for a in row if a.kind == F) + tuple(a for a in row if a.kind != F)
                 for row in schedule.actions)
    return replace(schedule, actions=rows, coded=None)


def _io(action: Action, rank_of: tuple[int, ...]) -> tuple[list[tuple[int, Message]], list[tuple[int, Message]]]:
    """(inputs received from other ranks, outputs sent to other ranks) of one F or B."""
    s, mb, n, here = action.stage, action.microbatch, len(rank_of), rank_of[action.stage]
    ins: list[tuple[int, Message]] = []
    outs: list[tuple[int, Message]] = []
    if action.kind == F:
        if s > 0 and rank_of[s - 1] != here:
            ins.append((rank_of[s - 1], ("f", s, mb)))
        if s + 1 < n and rank_of[s + 1] != here:
            outs.append((rank_of[s + 1], ("f", s + 1, mb)))
    else:
        if s + 1 < n and rank_of[s + 1] != here:
            ins.append((rank_of[s + 1], ("b", s, mb)))
        if s > 0 and rank_of[s - 1] != here:
            outs.append((rank_of[s - 1], ("b", s - 1, mb)))
    return ins, outs


def lockstep_makespan(schedule: Schedule, costs: CostModel, interleaved: bool) -> tuple[float, tuple[float, ...]]:
    """Makespan and per-rank compute time of ``schedule`` under Megatron's blocking exchanges."""
    rank_of = schedule.placement.stage_to_rank
    d = len(schedule.actions)
    steps = [megatron_steps(row, interleaved) for row in schedule.actions]
    durations = [[sum(costs.f(a.stage) if a.kind == F else costs.b(a.stage) for a in st) for st in rs] for rs in steps]
    exchanges: list[list[_Exchange]] = []
    for rs in steps:
        ex = [_Exchange([], [])]
        for st in rs:
            for a in st:
                ex[-1].recvs += _io(a, rank_of)[0]
            ex.append(_Exchange([], []))
            for a in st:
                ex[-1].sends += _io(a, rank_of)[1]
        exchanges.append(ex)
    where_recv: dict[Message, int] = {}
    where_send: dict[Message, int] = {}
    for r in range(d):
        for i, e in enumerate(exchanges[r]):
            for _, msg in e.recvs:
                where_recv[msg] = i
            for _, msg in e.sends:
                where_send[msg] = i
    post: list[list[float | None]] = [[None] * len(ex) for ex in exchanges]
    for r in range(d):
        post[r][0] = 0.0
    nxt = [0] * d
    remaining = sum(len(ex) for ex in exchanges)
    while remaining:
        progressed = False
        for r in range(d):
            i = nxt[r]
            if i >= len(exchanges[r]):
                continue
            e = exchanges[r][i]
            mine = post[r][i]
            assert mine is not None
            peers = [post[q][where_recv[msg]] for q, msg in e.sends] + [post[q][where_send[msg]] for q, msg in e.recvs]
            if any(p is None for p in peers):
                continue
            n_msgs = max(len(e.sends), len(e.recvs))
            done = max([mine] + [p for p in peers if p is not None]) + n_msgs * costs.p2p_time
            nxt[r] = i + 1
            remaining -= 1
            progressed = True
            if i + 1 < len(exchanges[r]):
                post[r][i + 1] = done + durations[r][i]
            else:
                post[r].append(done)  # the end of the rank's last exchange
        if not progressed:
            raise ScheduleError("Megatron exchange timing deadlocked: the schedule's order does not match "
                                "blocking batched exchanges")
    ends = [p[-1] for p in post]
    return max(e for e in ends if e is not None), tuple(sum(x) for x in durations)
