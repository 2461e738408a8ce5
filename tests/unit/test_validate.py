"""The validator, one rule at a time, on schedules written in their own text form."""
import random

import pytest

from pipeoffload import Placement, Schedule, ScheduleError, generate, lower, validate
from pipeoffload.ir import Action
from pipeoffload.ir import ActionKind as K
from pipeoffload.passes.comms import add_comms
from pipeoffload.semantics import coded
from pipeoffload.validation import _check_p2p_order, _p2p_order_ok, _validate

GOOD = [
    "0F0 0B0",
    "0F0 0I0 0W0",
    "0F0 0F1 0I0 0I1 0W1 0W0",
    "0F0 0R0 0B0",
    "0F0 0OFFLOAD0 0RELOAD0 0I0 0W0",
    "0F0 0SEND_F0 0RECV_B0 0B0\n1RECV_F0 1F0 1B0 1SEND_B0",
]


@pytest.mark.parametrize("text", GOOD)
def test_valid_schedules_pass(text: str) -> None:
    validate(Schedule.from_text(text))


BAD = [
    ("0B0 0F0", "backward of stage 0, microbatch 0 runs before its F", 0, 0),
    ("0F0", "has no B (or I and W)", 0, 0),
    ("0F0 0I0", "has no W", 0, 0),
    ("0F0 0W0 0I0", "W of stage 0, microbatch 0 runs before its I", 0, 1),
    ("0F0 0B0 0B0", "duplicate 0B0", 0, 2),
    ("0F0 0I0 0W0 0B0", "has both B and I", 0, 3),
    ("0F0 0B0 0R0", "R of stage 0, microbatch 0 must come after its F and before its backward", 0, 2),
    ("0R0 0F0 0B0", "must come after its F", 0, 0),
    ("0OFFLOAD0 0F0 0B0", "OFFLOAD of stage 0, microbatch 0 must come after its F", 0, 0),
    ("0F0 0OFFLOAD0 0B0 0RELOAD0", "backward runs before its RELOAD", 0, 2),
    ("0F0 0RELOAD0 0OFFLOAD0 0B0", "RELOAD of stage 0, microbatch 0 must come after its OFFLOAD", 0, 1),
    ("0F0 0OFFLOAD0 0B0", "backward runs before its RELOAD", 0, 2),
    ("0F0 0R0 0OFFLOAD0 0RELOAD0 0B0", "both recomputed and offloaded", 0, 2),
    ("0F0 1F0 1B0 0B0\n", "stage 1 belongs to rank 1", 0, 1),
    ("0F0 0SEND_F0 0B0\n1F0 1B0", "backward of stage 0, microbatch 0 runs before its RECV_B", 0, 2),
    ("0F0 0SEND_F0 0RECV_B0 0B0\n1RECV_F0 1F0 1B0", "has no SEND_B", 1, 2),
    ("0SEND_F0 0F0 0RECV_B0 0B0\n1RECV_F0 1F0 1B0 1SEND_B0", "0SEND_F0 must come after its F", 0, 0),
    ("0F0 0RECV_B0 0B0 0SEND_F0\n1RECV_F0 1F0 1B0 1SEND_B0", "comm order deadlocks", 0, 1),
]


@pytest.mark.parametrize("text,message,rank,step", BAD)
def test_invalid_schedules_name_rank_step_and_show_the_grid(text: str, message: str, rank, step) -> None:  # type: ignore[no-untyped-def]
    rows = [line.split() for line in text.splitlines()]
    schedule = Schedule.from_text(text) if "1F0" not in rows[0] else \
        Schedule(tuple(tuple(Schedule.from_text(text).actions[0]) if r == 0 else () for r in range(2)),
                 Placement.loop(2), 1)
    with pytest.raises(ScheduleError) as info:
        validate(schedule)
    err = info.value
    assert message in str(err)
    assert (err.rank, err.step) == (rank, step)
    assert f"rank {rank}, step {step}, action {rows[rank][step]}" in str(err)
    assert "ERROR HERE" in str(err) and "step | rank 0" in str(err)


def test_grid_in_errors_shows_a_window_of_big_schedules() -> None:
    schedule = generate("1f1b", 4, 64)
    rows = [list(r) for r in schedule.actions]
    late_backward = rows[2].pop(100)
    rows[2].insert(1, late_backward)  # a backward long before its forward
    with pytest.raises(ScheduleError) as info:
        validate(schedule.with_actions(rows))
    text = str(info.value)
    assert "ERROR HERE" in text and len(text.splitlines()) < 40 and "..." in text


def test_every_lowered_classic_schedule_validates() -> None:
    for name, v in (("gpipe", 2), ("1f1b", 1), ("interleaved-1f1b", 3)):
        validate(lower(generate(name, 4, 8, v)))


def test_lower_refuses_a_compute_order_valid_on_each_rank_that_deadlocks_across_ranks() -> None:
    """Why ``lower`` validates its output in full: the first validation checks orders on one rank only."""
    cycle = Schedule.from_text("0F0 0B0 0F1 0B1\n1F0 1F1 1B0 1B1\n")  # 0B0 needs 1B0, after 1F1, after 0F1
    validate(cycle)
    with pytest.raises(ScheduleError, match="comm order deadlocks"):
        lower(cycle)


def _shuffled_comms(rng: random.Random) -> Schedule:
    """A lowered schedule of a random family whose comm actions were moved, dropped, added or repeated."""
    name = rng.choice(["1f1b", "interleaved-1f1b", "gpipe", "zb-h1", "zb-v", "dualpipe-v"])
    base = generate(name, rng.choice([2, 3, 4]), rng.choice([1, 2, 4, 6]))
    rows = [list(r) for r in add_comms(base).actions]
    comm = [K.SEND_F, K.RECV_F, K.SEND_B, K.RECV_B]
    for _ in range(rng.choice([1, 2, 4])):
        row = rows[rng.randrange(len(rows))]
        move = rng.random()
        if move < 0.5:  # a comm action a few steps earlier or later (or dropped)
            steps = [i for i, a in enumerate(row) if a.kind in comm]
            a = row.pop(rng.choice(steps))
            if move < 0.45:
                row.insert(max(0, min(len(row), steps[0] + rng.randint(-4, 4))), a)
        else:  # an extra comm action anywhere, perhaps a repeat or on a rank not its stage's
            extra = Action(rng.choice(comm), rng.randrange(base.num_stages), rng.randrange(base.num_microbatches))
            row.insert(rng.randrange(len(row) + 1), extra)
    return base.with_actions(rows)


def test_the_array_dry_run_agrees_with_the_readable_one() -> None:
    """``_p2p_order_ok`` (arrays) never passes a comm order the readable dry run finds stuck, and
    answers like it on every schedule that is otherwise valid (elsewhere a False only costs the
    readable run)."""
    rng = random.Random(7)
    outcomes = set()
    for _ in range(400):
        schedule = _shuffled_comms(rng)
        try:
            _check_p2p_order(schedule)
            stuck = False
        except ScheduleError:
            stuck = True
        fast = _p2p_order_ok(coded(schedule))
        assert not (fast and stuck), schedule.to_text()
        try:
            _validate(schedule)
        except ScheduleError:
            continue
        assert fast == (not stuck), schedule.to_text()
        outcomes.add(stuck)
    assert outcomes == {True, False}  # both kinds of valid schedule were met
