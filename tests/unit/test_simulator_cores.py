"""Processor sharing (``CostModel.cores``): CPU ranks on one host share its cores; timelines worked out on paper."""
from dataclasses import replace

import pytest

from pipeoffload import CostModel, DeadlockError, ScheduleError, generate, lower, simulate
from pipeoffload.costs import cost_model_from_dict, cost_model_to_dict
from pipeoffload.errors import ConfigError
from pipeoffload.ir import Schedule

UNIT = CostModel(time_f=1.0, time_i=1.0, time_w=1.0)  # F = 1, B = 2


def ends(timeline, rank):  # type: ignore[no-untyped-def]
    return {str(a): (start, end) for a, start, end in timeline.events(rank)}


def test_two_ranks_on_one_core_share_it_while_both_compute():
    # 1F1B, 2 ranks, 2 microbatches. Alone: 9. On one core: F0m0 [0,1] alone; F0m1 and F1m0 share
    # [1,3]; B1m0 alone [3,5]; B0m0 and F1m1 share from 5: F1m1 ends at 7 (B0m0 has 1 left), then
    # B0m0 and B1m1 share [7,9]: B0m0 ends at 9, B1m1 (1 left) alone [9,10]; B0m1 alone [10,12].
    schedule = generate("1f1b", 2, 2, 1)
    assert simulate(schedule, UNIT).makespan == 9.0
    t = simulate(schedule, replace(UNIT, cores=1))
    assert t.makespan == pytest.approx(12.0)
    r0, r1 = ends(t, 0), ends(t, 1)
    assert r0["0F1"] == pytest.approx((1.0, 3.0)) and r1["1F0"] == pytest.approx((1.0, 3.0))
    assert r1["1B0"] == pytest.approx((3.0, 5.0)) and r1["1F1"] == pytest.approx((5.0, 7.0))
    assert r0["0B0"] == pytest.approx((5.0, 9.0)) and r1["1B1"] == pytest.approx((7.0, 10.0))
    assert r0["0B1"] == pytest.approx((10.0, 12.0))
    assert t.per_rank[0].busy == pytest.approx(1 + 2 + 4 + 2)  # wall time in compute


def test_as_many_cores_as_ranks_is_the_plain_simulation():
    for family, v in (("1f1b", 1), ("interleaved-1f1b", 2), ("zb-v", 2)):
        costs = CostModel(time_f=(1.0, 1.5, 0.5, 2.0)[:2 * v], time_i=1.0, time_w=0.5, p2p_time=0.1,
                          message_time=0.05)
        schedule = lower(generate(family, 2, 4, v), costs)
        assert simulate(schedule, replace(costs, cores=2)).makespan == pytest.approx(simulate(schedule, costs).makespan)


def test_transport_cpu_competes_for_the_core_but_holds_no_lane():
    # One microbatch, 2 ranks, one core, each SEND/RECV costs its rank's transport 0.5 of CPU. At 1 F0
    # has sent: rank 1's F1 shares the core with both transports (1/3 each) until they are done at 2.5,
    # then ends at 3; B1 [3,5]; at 5 the gradient's send and receive load both transports again: B0 ends at 8.
    costs = replace(UNIT, cores=1, message_cpu=0.5)
    schedule = lower(generate("1f1b", 2, 1, 1), costs)
    t = simulate(schedule, costs)
    assert ends(t, 1)["1F0"] == pytest.approx((1.0, 3.0)) and ends(t, 1)["1B0"] == pytest.approx((3.0, 5.0))
    assert ends(t, 0)["0B0"] == pytest.approx((5.0, 8.0)) and t.makespan == pytest.approx(8.0)
    assert simulate(schedule, replace(costs, cores=None)).makespan == 6.0  # charged only with cores


def test_more_ranks_than_cores_is_bounded_by_the_work():
    costs = CostModel(time_f=1.0, time_i=1.0, time_w=1.0, message_time=0.1, message_cpu=0.2, cores=2)
    schedule = lower(generate("interleaved-1f1b", 4, 8, 2), costs)
    t = simulate(schedule, costs)
    messages = sum(1 for row in schedule.actions for a in row if a.kind.name.startswith(("SEND", "RECV")))
    work = 4 * 2 * 8 * 3 + messages * (0.1 + 0.2)
    assert t.makespan >= work / 2
    assert t.makespan > simulate(schedule, replace(costs, cores=None)).makespan


def test_cores_is_checked_refuses_copies_and_round_trips_through_a_cost_file():
    with pytest.raises(ConfigError, match="cores"):
        CostModel(cores=0)
    with pytest.raises(ConfigError, match="message_cpu"):
        CostModel(message_cpu=-1.0)
    with pytest.raises(ConfigError, match="other_load"):
        CostModel(other_load=-1.0)
    with pytest.raises(ScheduleError, match="copies"):
        simulate(Schedule.from_text("0F0 0OFFLOAD0 0RELOAD0 0B0"), replace(UNIT, cores=1).with_offload_ratio(0.5))
    costs = replace(UNIT, cores=2, message_cpu=1e-3, other_load=0.5)
    assert cost_model_from_dict(cost_model_to_dict(costs)) == costs
    assert "message_cpu" not in cost_model_to_dict(UNIT) and "cores" not in cost_model_to_dict(UNIT)


def test_other_load_takes_its_share_of_the_cores():
    # One rank alone on one core with one other runnable thread: half speed, F0 then B0 take 2 + 4.
    schedule = generate("1f1b", 1, 1, 1)
    assert simulate(schedule, replace(UNIT, cores=1)).makespan == pytest.approx(3.0)
    assert simulate(schedule, replace(UNIT, cores=1, other_load=1.0)).makespan == pytest.approx(6.0)
    assert simulate(schedule, replace(UNIT, cores=2, other_load=1.0)).makespan == pytest.approx(3.0)  # a core each


def test_other_load_is_read_from_the_measured_concurrency():
    pytest.importorskip("torch")
    from pipeoffload.profiling import other_load

    assert other_load((1.0, 2.0, 3.5), cores=2) == pytest.approx(4.0)  # 3 ranks at 3.5x: (3 + 4) / 2
    assert other_load((1.0, 1.02), cores=2) == pytest.approx(0.04)
    assert other_load((1.0, 0.9), cores=2) == 0.0
    with pytest.raises(ConfigError, match="other_load"):
        other_load((), cores=2)


def test_a_deadlock_is_reported_as_without_cores():
    crossing = Schedule.from_text("0F0 0RECV_B0 0B0 0SEND_F0\n1RECV_F0 1F0 1B0 1SEND_B0\n")
    with pytest.raises(DeadlockError, match=r"rank 0 step 1 0RECV_B0 waits for 1SEND_B0.*rank 1 step 0"):
        simulate(crossing, replace(UNIT, cores=1, message_cpu=0.5))
