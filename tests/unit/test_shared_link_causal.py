"""A shared host link serves copies in the order they reach it (issue #17): causal and FIFO."""
from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from pipeoffload import CostModel, Schedule, generate, lower, simulate
from pipeoffload import semantics as sem
from pipeoffload.simulator import _Simulation

# Rank 1 issues its offload at t = 2, rank 0 at t = 3, each 1.5 t on the pair's one D2H link. The
# simulator runs rank 0's lane first (rank 1 waits for 0F0), so a booking in processing order put
# rank 0's copy at [3, 4.5] and rank 1's, issued earlier, behind it at [4.5, 6].
LATER_ISSUED_FIRST = "0F0 0F1 0F2 0OFFLOAD0 0B2 0B1 0RELOAD0 0B0\n1F0 1OFFLOAD0 1F1 1F2 1RELOAD0 1B2 1B1 1B0\n"


def _windows(schedule: Schedule, costs: CostModel) -> dict[str, tuple[float, float]]:
    t = simulate(schedule, costs)
    return {str(a): (s, e) for r in range(schedule.num_ranks) for a, s, e in t.events(r)}


def test_a_copy_issued_earlier_is_served_first() -> None:
    costs = CostModel.uniform(1, 1, 1, shared_host_link=True).with_offload_ratio(1.0)
    w = _windows(Schedule.from_text(LATER_ISSUED_FIRST), costs)
    assert w["1OFFLOAD0"] == (2.0, 3.5)
    assert w["0OFFLOAD0"] == (3.5, 5.0)  # waits for the link: never takes a gap before an earlier copy
    assert w["1RELOAD0"] == (4.0, 5.5)  # the H2D link is the other direction's: not delayed by D2H


def test_equal_arrivals_go_lower_rank_first() -> None:
    costs = CostModel.uniform(1, 1, 1, shared_host_link=True).with_offload_ratio(1.0)
    both = "0F0 0F1 0OFFLOAD0 0B1 0RELOAD0 0B0\n1F0 1OFFLOAD0 1F1 1B1 1RELOAD0 1B0\n"  # both issued at t = 2
    w = _windows(Schedule.from_text(both), costs)
    assert w["0OFFLOAD0"] == (2.0, 3.5) and w["1OFFLOAD0"] == (3.5, 5.0)


def test_a_copy_waiting_for_its_engine_reaches_the_link_when_the_engine_frees() -> None:
    # all three offloads are issued at t = 2; rank 0's second one waits for rank 0's engine (one per
    # rank) until 3.5, so rank 1's, at the link since 2, goes before it
    costs = CostModel.uniform(1, 1, 1, shared_host_link=True).with_offload_ratio(1.0)
    text = "0F0 0F1 0OFFLOAD1 0OFFLOAD0 0RELOAD1 0B1 0RELOAD0 0B0\n1F0 1OFFLOAD0 1F1 1RELOAD0 1B1 1B0\n"
    w = _windows(Schedule.from_text(text), costs)
    assert w["0OFFLOAD1"] == (2.0, 3.5) and w["1OFFLOAD0"] == (3.5, 5.0) and w["0OFFLOAD0"] == (5.0, 6.5)
    assert w["1RELOAD0"] == (5.0, 6.5) and w["0RELOAD1"] == (6.5, 8.0)


def _own_link_copy_starts_are_engine_fifo(schedule: Schedule, costs: CostModel) -> int:
    """Check, by a recurrence of its own, that every copy of a simulation with own host links starts
    when it is issued (the lane's clock: the end of the rank's last non-copy action before it), its
    input has completed and its engine has finished the copy before it, whichever is last: the link
    never delays it. Returns the number of copies checked."""
    sim = _Simulation(schedule, costs)
    sim.run()
    lanes, keys = sem.LANE[sim.c.kind].tolist(), sim.c.keys.tolist()
    first = sim.inputs.first.tolist()
    engine = sim.copies[0].tolist()
    end_of = {key: sim.end[i] for i, key in enumerate(keys)}
    engine_free: dict[int, float] = {}
    checked = 0
    for rank in range(schedule.num_ranks):
        clock = 0.0
        for i in range(sim.offsets[rank], sim.offsets[rank + 1]):
            if lanes[i] != sem.COPY:
                clock = sim.end[i]
                continue
            ready = end_of[first[i]] if first[i] >= 0 else 0.0
            expected = max(clock, ready, engine_free.get(engine[i], 0.0))
            assert sim.start[i] == pytest.approx(expected, abs=1e-12), (rank, i)
            engine_free[engine[i]] = sim.end[i]
            checked += 1
    return checked


@pytest.mark.parametrize("name,v", [("1f1b", 1), ("group-interleaved", 2), ("zb-v", 2)])
def test_with_own_links_a_copy_starts_when_issued_ready_and_its_engine_is_free(name: str, v: int) -> None:
    """The one event loop books links for the shared case; with one link per rank it must delay no copy."""
    schedule = generate(name, 4, 8, v)
    for k, engine, message in itertools.product((0.3, 1.6), (True, False), (0.0, 0.05)):
        costs = replace(CostModel(time_i=0.7, time_w=0.4, p2p_time=0.1, message_time=message).with_offload_ratio(k),
                        shared_copy_engine=engine)
        assert _own_link_copy_starts_are_engine_fifo(lower(schedule, costs, offload="all"), costs) > 0
