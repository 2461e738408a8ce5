"""Megatron's blocking batched exchanges (planner/exchange.py) against the eager simulator."""
import pytest

from pipeoffload.costs import CostModel
from pipeoffload.ir import ActionKind
from pipeoffload.planner.exchange import lockstep_makespan, megatron_order, megatron_steps
from pipeoffload.schedules import generate
from pipeoffload.simulator import simulate


@pytest.mark.parametrize("family, d, m, v", [("1f1b", 4, 12, 1), ("interleaved-1f1b", 4, 12, 2),
                                             ("interleaved-1f1b", 3, 9, 3)])
def test_without_transfer_time_the_lockstep_equals_the_eager_simulation(family: str, d: int, m: int, v: int) -> None:
    """Megatron's warm-up depth leaves exactly the slack its delayed sends need: with free transfers and
    equal stages both timings agree (so any difference below comes from the transfers)."""
    schedule = generate(family, d, m, v)
    costs = CostModel(time_f=1.0, time_b=2.0)
    makespan, busy = lockstep_makespan(schedule, costs, interleaved=v > 1)
    timeline = simulate(schedule, costs)
    assert makespan == pytest.approx(timeline.makespan)
    assert busy == pytest.approx(tuple(r.busy for r in timeline.per_rank))


def test_blocking_exchanges_expose_transfers_the_eager_timing_hides() -> None:
    schedule = generate("interleaved-1f1b", 4, 12, 2)
    costs = CostModel(time_f=1.0, time_b=2.0, p2p_time=0.05)
    eager = simulate(schedule, costs).makespan
    blocking, _ = lockstep_makespan(schedule, costs, interleaved=True)
    # every steady step waits for its exchange: at least one transfer per step on the busiest rank
    assert blocking > eager + 0.05 * 12
    assert blocking < eager + 2 * 0.05 * 2 * 12 * 2 + 1e-9


def test_interleaved_steady_steps_pair_a_forward_with_a_backward() -> None:
    row = generate("interleaved-1f1b", 4, 8, 2).actions[3]
    steps = megatron_steps(row, interleaved=True)
    kinds = ["".join(a.kind.value for a in step) for step in steps]
    assert kinds[0] == "F" and "FB" in kinds and kinds[-1] == "B"
    assert sum(len(s) for s in steps) == len(row)
    assert all(len(s) == 1 for s in megatron_steps(row, interleaved=False))
    assert {a.kind for a in row} == {ActionKind.F, ActionKind.B}


Step = tuple[tuple[tuple[str, int], ...], tuple[bool, bool, bool, bool]]  # (F/B, stage)s, then one exchange's
# send-next, send-prev, recv-prev, recv-next


def _megatron_2021_interleaved(p: int, v: int, m: int, r: int) -> list[Step]:
    """Rank r's loop in Megatron-LM's 2021 ``forward_backward_pipelining_with_interleaving`` (commit
    6985e58938), transcribed from its code, not from our generator."""
    n = m * v

    def chunk(k: int, forward: bool) -> int:
        c = (k % (p * v)) // p
        return c if forward else v - 1 - c

    def f(k: int) -> tuple[str, int]:
        return ("F", chunk(k, True) * p + r)

    def b(k: int) -> tuple[str, int]:
        return ("B", chunk(k, False) * p + r)

    all_warmup = m == p
    warmup = n if all_warmup else min((p - r - 1) * 2 + (v - 1) * p, n)
    steps: list[Step] = [((), (False, False, r > 0, False))]  # recv_forward
    for k in range(warmup):
        recv_prev = not (r == 0 and chunk(k + 1, True) == 0) and k != n - 1
        recv_next = k == warmup - 1 and not all_warmup and r != p - 1
        steps.append(((f(k),), (not (r == p - 1 and chunk(k, True) == v - 1), False, recv_prev, recv_next)))
    rest = n - warmup
    for k in range(rest):
        fk = k + warmup
        recv_prev = not (r == 0 and chunk(fk - (p - 1), True) == v - 1) and k != rest - 1
        recv_next = not (r == p - 1 and chunk(k - (p - 1), False) == 0)
        steps.append(((f(fk), b(k)), (not (r == p - 1 and chunk(fk, True) == v - 1),
                                       not (r == 0 and chunk(k, False) == 0), recv_prev, recv_next)))
    if all_warmup:
        steps.append(((), (False, False, False, r != p - 1)))  # recv_backward
    for k in range(rest, n):
        recv_next = not (r == p - 1 and chunk(k + 1, False) == v - 1) and k != n - 1
        steps.append(((b(k),), (False, not (r == 0 and chunk(k, False) == 0), False, recv_next)))
    return steps


def _megatron_2021_1f1b(p: int, m: int, r: int) -> list[Step]:
    """Rank r's loop in the same tree's ``forward_backward_pipelining_without_interleaving``: separate
    recv_forward / send_forward (recv_backward / send_backward) exchanges in the warm-up (cool-down)."""
    warmup, first, last = min(p - r - 1, m), r == 0, r == p - 1
    rest = m - warmup
    steps: list[Step] = []
    for _ in range(warmup):
        steps += [((), (False, False, not first, False)), ((("F", r),), (not last, False, False, False))]
    if rest:
        steps.append(((), (False, False, not first, False)))
    for i in range(rest):
        steps.append(((("F", r),), (not last, False, False, not last)))
        steps.append(((("B", r),), (False, not first, not first and i != rest - 1, False)))
    for _ in range(warmup):
        steps += [((), (False, False, False, not last)), ((("B", r),), (False, not first, False, False))]
    return steps


def _megatron_2021_makespan(loops: list[list[Step]], costs: CostModel) -> float:
    """Transcribed loops timed with every exchange blocking until its peers have posted theirs, sends and
    receives matched first in, first out per ordered pair of ranks (how NCCL matches them)."""
    p = len(loops)
    sends: dict[tuple[int, int], list[int]] = {}
    recvs: dict[tuple[int, int], list[int]] = {}
    for r, loop in enumerate(loops):
        for i, (_, (s_next, s_prev, r_prev, r_next)) in enumerate(loop):
            for flag, pair, book in ((s_next, (r, (r + 1) % p), sends), (s_prev, (r, (r - 1) % p), sends),
                                     (r_prev, ((r - 1) % p, r), recvs), (r_next, ((r + 1) % p, r), recvs)):
                if flag:
                    book.setdefault(pair, []).append(i)
    peers: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for (a, b), at_a in sends.items():
        assert len(at_a) == len(recvs[(a, b)])  # every send has its receive
        for i, j in zip(at_a, recvs[(a, b)]):
            peers.setdefault((a, i), []).append((b, j))
            peers.setdefault((b, j), []).append((a, i))
    clock, nxt = [0.0] * p, [0] * p
    post: dict[tuple[int, int], float] = {}
    while any(nxt[r] < len(loops[r]) for r in range(p)):
        moved = False
        for r in range(p):
            i = nxt[r]
            if i == len(loops[r]):
                continue
            work, flags = loops[r][i]
            post[(r, i)] = clock[r] + sum(costs.f(s) if kind == "F" else costs.b(s) for kind, s in work)
            if all(q in post for q in peers.get((r, i), [])):
                messages = max(flags[0] + flags[1], flags[2] + flags[3])
                clock[r] = max([post[(r, i)]] + [post[q] for q in peers.get((r, i), [])]) + messages * costs.p2p_time
                nxt[r], moved = i + 1, True
        assert moved, "the transcription deadlocked"
    return max(clock)


def _uneven(n: int) -> CostModel:
    """Stages of uneven cost (the head's on the last, the embedding's on the first) and costly transfers."""
    return CostModel(time_f=tuple(1.0 + 0.3 * (s == n - 1) + 0.1 * (s == 0) + 0.01 * s for s in range(n)),
                     time_b=tuple(2.0 + 0.5 * (s == n - 1) + 0.2 * (s == 0) + 0.02 * s for s in range(n)),
                     p2p_time=0.07)


@pytest.mark.parametrize("d, m, v", [(4, 8, 2), (3, 9, 3), (5, 10, 2), (4, 12, 3),
                                     (4, 4, 3), (3, 3, 2), (5, 5, 2)])  # the last three: all warm-up (m = d)
def test_lockstep_matches_a_transcription_of_megatrons_2021_interleaved_loop(d: int, m: int, v: int) -> None:
    """The model's steps, exchanges and order (``megatron_order``) time the schedule as Megatron's loop runs it."""
    costs = _uneven(d * v)
    schedule = megatron_order(generate("interleaved-1f1b", d, m, v), interleaved=True)
    makespan, _ = lockstep_makespan(schedule, costs, interleaved=True)
    loops = [_megatron_2021_interleaved(d, v, m, r) for r in range(d)]
    assert makespan == pytest.approx(_megatron_2021_makespan(loops, costs), rel=1e-12)


@pytest.mark.parametrize("d, m", [(4, 8), (4, 2), (5, 5), (2, 6)])
def test_lockstep_matches_a_transcription_of_megatrons_2021_1f1b_loop(d: int, m: int) -> None:
    """Its warm-up and cool-down exchange a step's send and the next step's receive one after the other;
    merged into one exchange in the model, the timing is the same."""
    costs = _uneven(d)
    makespan, _ = lockstep_makespan(megatron_order(generate("1f1b", d, m), interleaved=False), costs, interleaved=False)
    assert makespan == pytest.approx(_megatron_2021_makespan([_megatron_2021_1f1b(d, m, r) for r in range(d)], costs),
                                     rel=1e-12)


def test_with_as_many_microbatches_as_ranks_megatron_runs_every_forward_first() -> None:
    """Megatron's ``all_warmup_microbatches``: the generator's rank 3 of 4 has a steady state, Megatron's not."""
    generated = generate("interleaved-1f1b", 4, 4, 2)
    ordered = megatron_order(generated, interleaved=True)
    kinds = ["".join(a.kind.value for a in row) for row in ordered.actions]
    assert kinds == ["F" * 8 + "B" * 8] * 4
    assert "FB" in "".join(a.kind.value for a in generated.actions[3])
    assert sorted(map(sorted, ordered.actions)) == sorted(map(sorted, generated.actions))
    assert megatron_order(generate("interleaved-1f1b", 4, 8, 2), interleaved=True) == generate("interleaved-1f1b", 4, 8, 2)
    steps = megatron_steps(ordered.actions[0], interleaved=True)
    assert [len(s) for s in steps] == [1] * 8 + [0] + [1] * 8  # the first gradient: an exchange of its own
