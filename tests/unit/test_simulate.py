"""The simulator on hand-written schedules whose timelines can be worked out on paper."""
import pytest

from pipeoffload import CostModel, DeadlockError, Schedule, generate, lower, simulate
from pipeoffload.ir import Action, ActionKind

K = ActionKind


def curve(timeline, rank=0):  # type: ignore[no-untyped-def]
    return list(timeline.per_rank[rank].memory)


def test_offload_frees_at_copy_end_and_late_reload_stalls() -> None:
    # F = 1, B = I + W = 2, copies take 0.5 each way.
    costs = CostModel.uniform(1, 1, 1).with_offload_ratio(1 / 3)
    assert costs.d2h_time == pytest.approx(0.5)
    schedule = Schedule.from_text("0F0 0OFFLOAD0 0F1 0B1 0RELOAD0 0B0")
    t = simulate(schedule, costs)
    starts = dict(zip(map(str, schedule[0]), t.start[0]))
    ends = dict(zip(map(str, schedule[0]), t.end[0]))
    assert (starts["0OFFLOAD0"], ends["0OFFLOAD0"]) == (1.0, 1.5)
    assert (starts["0RELOAD0"], ends["0RELOAD0"]) == (4.0, 4.5)
    assert starts["0B0"] == 4.5 and t.makespan == 6.5
    # memory: F0 allocates at 0, F1 at 1, the offload frees at its end (1.5), not at its start;
    # B1 frees at 4 and the reload allocates at its start (4), frees applied first.
    assert curve(t) == [(0.0, 1.0), (1.0, 2.0), (1.5, 1.0), (4.0, 0.0), (4.0, 1.0), (6.5, 0.0)]
    assert t.per_rank[0].stall == pytest.approx(0.5) and t.stall == pytest.approx(0.5)
    assert t.stalls == {Action(K.B, 0, 0): pytest.approx(0.5)}
    assert t.peak_activation_units == 2 and t.peak_host_units == 1
    assert list(t.per_rank[0].host_memory) == [(1.0, 1.0), (4.5, 0.0)]


def test_reload_in_time_does_not_stall() -> None:
    costs = CostModel.uniform(1, 1, 1).with_offload_ratio(1 / 3)
    t = simulate(Schedule.from_text("0F0 0OFFLOAD0 0F1 0RELOAD0 0B1 0B0"), costs)
    assert t.stall == 0 and t.makespan == 6.0
    assert max(level for _, level in curve(t)) == 2.0


def test_split_backward_frees_part_at_i_and_rest_at_w() -> None:
    costs = CostModel.uniform(1, 1, 1, w_fraction=0.25)
    t = simulate(Schedule.from_text("0F0 0I0 0W0"), costs)
    assert curve(t) == [(0.0, 1.0), (2.0, 0.25), (3.0, 0.0)]


def test_recomputed_forward_keeps_nothing_until_r() -> None:
    t = simulate(Schedule.from_text("0F0 0F1 0R0 0B0 0B1"), CostModel.uniform(1, 1, 1))
    assert curve(t) == [(0.0, 0.0), (1.0, 1.0), (2.0, 2.0), (5.0, 1.0), (7.0, 0.0)]
    assert t.makespan == 7.0 and t.per_rank[0].busy == 7.0


def test_p2p_time_delays_receiver() -> None:
    costs = CostModel.uniform(1, 1, 1, p2p=0.5)
    for schedule in (generate("1f1b", 2, 1), lower(generate("1f1b", 2, 1))):
        t = simulate(schedule, costs)
        assert t.makespan == 7.0  # F 0-1, arrives 1.5, F 1.5-2.5, B 2.5-4.5, arrives 5, B 5-7


def test_a_transfer_still_in_flight_delays_a_rank_that_is_already_free() -> None:
    """Rank 1 is free at 4.25, after the sender's F1 ended (4) but before its data arrives (4.5):
    its F1 starts at 4.5, not when the rank came free. Rank 0: F0 0-2, F1 2-4; rank 1: F0 2.5-4.25."""
    costs = CostModel(time_f=(2.0, 1.75), p2p_time=0.5)
    t = simulate(Schedule.from_text("0F0 0F1\n1F0 1F1"), costs)
    assert t.start[1] == (2.5, 4.5) and t.end[1] == (4.25, 6.25)


def _offload_everything(schedule: Schedule) -> Schedule:
    """OFFLOAD right after each F, RELOAD right before each backward: the simplest hand placement."""
    rows = []
    for row in schedule:
        out = []
        for a in row:
            if a.kind in (K.B, K.I):
                out.append(Action(K.RELOAD, a.stage, a.microbatch))
            out.append(a)
            if a.kind == K.F:
                out.append(Action(K.OFFLOAD, a.stage, a.microbatch))
        rows.append(out)
    return schedule.with_actions(rows)


def _copy_windows(t, rank, kind):  # type: ignore[no-untyped-def]
    return [(s, e) for a, s, e in t.events(rank) if a.kind == kind and e > s]


def _overlaps(xs, ys) -> bool:  # type: ignore[no-untyped-def]
    return any(s1 < e2 - 1e-12 and s2 < e1 - 1e-12 for s1, e1 in xs for s2, e2 in ys)


@pytest.mark.parametrize("shared", [False, True])
def test_shared_host_link_serialises_a_pair_per_direction(shared: bool) -> None:
    schedule = lower(_offload_everything(generate("1f1b", 4, 8)))
    costs = CostModel.uniform(1, 1, 1, shared_host_link=shared).with_offload_ratio(0.5)
    t = simulate(schedule, costs)
    overlapping = [
        _overlaps(_copy_windows(t, a, kind), _copy_windows(t, b, kind))
        for kind in (K.OFFLOAD, K.RELOAD) for a, b in ((0, 1), (2, 3))
    ]
    # without sharing, neighbours do copy at the same time; with it, never in the same direction
    assert any(overlapping) is not shared
    assert t.as_dict()["offloaded"] == 8 * 4


def test_one_copy_engine_serialises_directions_two_engines_overlap() -> None:
    schedule = lower(_offload_everything(generate("1f1b", 2, 6)))
    both = []
    for shared_engine in (True, False):
        costs = CostModel.uniform(1, 1, 1, shared_copy_engine=shared_engine).with_offload_ratio(1.5)
        t = simulate(schedule, costs)
        both.append(_overlaps(_copy_windows(t, 0, K.OFFLOAD), _copy_windows(t, 0, K.RELOAD)))
    assert both == [False, True]


def test_crossing_receives_report_a_deadlock_instead_of_hanging() -> None:
    crossing = Schedule.from_text("0F0 0RECV_B0 0B0 0SEND_F0\n1RECV_F0 1F0 1B0 1SEND_B0\n")
    with pytest.raises(DeadlockError, match=r"rank 0 step 1 0RECV_B0 waits for 1SEND_B0.*rank 1 step 0"):
        simulate(crossing)


def test_compute_order_cycle_reports_deadlock() -> None:
    cyclic = Schedule.from_text("0F0 0B0 0F1 0B1\n1F1 1B1 1F0 1B0\n")
    with pytest.raises(DeadlockError) as info:
        simulate(cyclic)
    message = str(info.value)
    assert "rank 0 step 1 0B0 waits for 1B0" in message and "rank 1 step 0 1F1 waits for 0F1" in message
    assert "ERROR HERE" in message


def test_bytes_reported_when_the_cost_model_gives_them() -> None:
    t = simulate(generate("1f1b", 2, 4), CostModel.uniform(activation_bytes=1024.0))
    assert t.as_dict()["peak_activation_bytes"] == 2 * 1024.0
    assert t.as_dict()["per_rank"][1]["peak_activation_bytes"] == 1024.0


def test_per_stage_cost_tuple_must_match_stage_count() -> None:
    with pytest.raises(ValueError, match="time_f has 3 per-stage values but the schedule has 2 stages"):
        simulate(generate("1f1b", 2, 2), CostModel(time_f=(1.0, 1.0, 1.0)))


def test_figures_equal_the_timeline_figures() -> None:
    from pipeoffload.simulator import figures_of, simulate_figures
    schedule = generate("1f1b", 4, 8)
    for costs in (CostModel.uniform(f=2.0), CostModel.uniform(f=1.0).with_offload_ratio(0.5)):
        assert figures_of(simulate(schedule, costs)) == simulate_figures(schedule, costs)


def _rank_rows(stdout: str) -> tuple[float, list[tuple[float, str]]]:
    """(makespan, [(busy, printed bubble)] per rank) from `pipeoffload simulate`'s text."""
    lines = stdout.splitlines()
    makespan = float(lines[1].split()[1])
    header = next(i for i, line in enumerate(lines) if line.startswith("rank "))
    rows = [line.split() for line in lines[header + 1:] if line.split() and line.split()[0].isdigit()]
    return makespan, [(float(row[1]), row[2]) for row in rows]


def test_simulate_prints_each_ranks_own_bubble() -> None:
    """Worked out on paper: 1F1B on 2 ranks, 2 microbatches, F = I = W = 1. Rank 1 runs F0 [1,2] B0 [2,4]
    F1 [4,5] B1 [5,7]; rank 0 F0 F1 [0,2], B0 [4,6] after rank 1's, B1 [7,9]: makespan 9, each rank busy
    6, so each rank idles a third of the step."""
    from tests.conftest import run_cli
    code, out, err = run_cli("simulate", "1f1b", "--ranks", "2", "--microbatches", "2")
    assert code == 0, err
    makespan, rows = _rank_rows(out)
    assert makespan == 9 and rows == [(6.0, "33.33%"), (6.0, "33.33%")]
    # recomputing rank 0's forwards makes it busier than rank 1: each rank prints its own idle share
    code, out, err = run_cli("simulate", "1f1b", "--ranks", "4", "--microbatches", "8", "--recompute", "first:1")
    assert code == 0, err
    makespan, rows = _rank_rows(out)
    assert rows[0][0] > rows[-1][0]
    assert [bubble for _, bubble in rows] == [f"{1 - busy / makespan:.2%}" for busy, _ in rows]
    assert rows[0][1] != rows[-1][1]


@pytest.mark.parametrize("shared", [False, True])
def test_key_space_too_large_for_a_list_gives_the_same_timeline(monkeypatch: pytest.MonkeyPatch, shared: bool) -> None:
    # Above _LIST_KEYS the loops keep completion times in a dict that reads None for a key not done yet.
    from pipeoffload import simulator

    costs = CostModel(shared_host_link=shared).with_offload_ratio(0.5)
    schedule = lower(generate("zb-v", 4, 8), costs, offload="all")
    as_list = simulate(schedule, costs)
    monkeypatch.setattr(simulator, "_LIST_KEYS", 0)
    as_dict = simulate(schedule, costs)
    assert (as_dict.start, as_dict.end, as_dict.per_rank, as_dict.stalls) == (
        as_list.start, as_list.end, as_list.per_rank, as_list.stalls)
