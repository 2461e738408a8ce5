"""The runtime's own cost per message (``CostModel.message_time``): charged on the sender's and the
receiver's lanes by the simulator, carried by cost files, applied by ``simulate --costs``."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pipeoffload.costs import CostModel, cost_model_from_dict, cost_model_to_dict
from pipeoffload.errors import ConfigError
from pipeoffload.ir import ActionKind
from pipeoffload.passes.lower import lower
from pipeoffload.schedules import generate
from pipeoffload.service import SimulateRequest
from pipeoffload.service import simulate as service_simulate
from pipeoffload.simulator import simulate

COSTS = CostModel(time_f=1.0, time_i=0.5, time_w=0.5, p2p_time=0.5)


@pytest.mark.parametrize("shared_host_link", [False, True])  # both event loops
def test_each_hop_costs_the_message_time_on_both_lanes(shared_host_link):
    # 2 ranks, 1 microbatch: F0 | send | p2p | recv | F1 B1 | send | p2p | recv | B0; two hops
    schedule = lower(generate("1f1b", 2, 1))
    bare = replace(COSTS, shared_host_link=shared_host_link)
    costs = replace(bare, message_time=0.25)
    assert simulate(schedule, bare).makespan == pytest.approx(5.0)
    timeline = simulate(schedule, costs)
    assert timeline.makespan == pytest.approx(5.0 + 4 * 0.25)
    for rank in range(2):
        for action, start, end in timeline.events(rank):
            if action.kind in (ActionKind.SEND_F, ActionKind.SEND_B):
                assert end - start == pytest.approx(0.25)  # the sender's lane holds it
    assert timeline.per_rank[0].busy == simulate(schedule, bare).per_rank[0].busy  # not compute


def test_a_receive_whose_data_arrived_long_ago_still_holds_the_lane():
    # rank 1 finishes F of microbatch 0 long before rank 0 needs its gradient: the receive is late anyway
    schedule = lower(generate("gpipe", 2, 2))
    bare = CostModel(time_f=1.0, time_i=5.0, time_w=5.0)
    timeline = simulate(schedule, replace(bare, message_time=0.125))
    receives = [end - start for a, start, end in timeline.events(0) if a.kind is ActionKind.RECV_B]
    assert min(receives) >= 0.125 - 1e-12


def test_a_compute_only_schedule_pays_the_same_per_transfer():
    costs = replace(COSTS, message_time=0.25)
    schedule = generate("1f1b", 2, 1)
    assert simulate(schedule, costs).makespan == pytest.approx(simulate(lower(schedule, costs), costs).makespan)


def test_zero_message_time_changes_nothing():
    schedule = lower(generate("interleaved-1f1b", 4, 8, 2))
    costs = CostModel(time_f=1.0, time_i=0.7, time_w=0.3, p2p_time=0.1)
    a, b = simulate(schedule, costs), simulate(schedule, replace(costs, message_time=0.0))
    assert a.start == b.start and a.end == b.end


def test_message_time_round_trips_through_a_cost_file_and_is_checked():
    costs = CostModel(time_f=(1.0, 2.0), time_i=1.0, time_w=1.0, message_time=1e-3)
    assert cost_model_from_dict(cost_model_to_dict(costs)) == costs
    with pytest.raises(ConfigError, match="message_time"):
        CostModel(message_time=-1.0)
    with pytest.raises(ConfigError, match="message_time"):
        CostModel(message_time=float("inf"))


def test_simulate_with_a_cost_file_applies_the_message_time(tmp_path):
    def makespan(message_time: float) -> float:
        path = tmp_path / f"costs{message_time}.json"
        path.write_text(json.dumps({"time_f": 1.0, "time_i": 0.5, "time_w": 0.5, "p2p_time": 0.5,
                                    "message_time": message_time}))
        return service_simulate(SimulateRequest("1f1b", ranks=2, microbatches=1, costs_file=str(path))).timeline.makespan

    assert makespan(0.25) == pytest.approx(makespan(0.0) + 4 * 0.25)


def test_message_samples_take_the_lane_from_sends_alone_and_the_transfer_from_waiting_receivers():
    pytest.importorskip("torch")  # profiling imports torch
    from pipeoffload.profiling import _message_samples

    # rank 0 sends F0 alone (batch 1.0-1.2), then F1 with the receive of B0 (2.0-3.6); rank 1 waited for
    # F0 since 0.5 and got it at 1.7; it sends B0 alone at 3.0 (3.0-3.1) and gets F1 (sent at 2.0,
    # possibly still in flight) in a batch of its own from 3.2
    rank0 = [("F", 0, 0, 0.0, 1.0), ("SEND_F", 0, 0, 1.0, 1.2), ("F", 0, 1, 1.2, 2.0), ("SEND_F", 0, 1, 2.0, 3.6),
             ("RECV_B", 0, 0, 2.0, 3.6)]
    rank1 = [("RECV_F", 1, 0, 0.5, 1.7), ("F", 1, 0, 1.7, 2.0), ("B", 1, 0, 2.0, 3.0), ("SEND_B", 1, 0, 3.0, 3.1),
             ("RECV_F", 1, 1, 3.2, 3.3)]
    posted, waited = _message_samples([rank0, rank1])
    assert sorted(posted) == pytest.approx([0.1, 0.2])  # the two batches of sends only
    # rank 0's receive began (2.0) before B0's send (3.0): it waited; rank 1's second receive gives nothing
    assert sorted(waited) == [(1.0, 1.7), (3.0, 3.6)]  # (send batch start, receive end)


def test_measure_message_costs_reads_the_runtimes_traces():
    pytest.importorskip("torch")
    from pipeoffload.profiling import measure_message_costs

    costs = measure_message_costs(4 * 128 * 8, ranks=2, microbatches=4, depth=1, steps=3, warmup=1)
    assert 0 < costs.message_time < 1.0 and 0 <= costs.p2p_time < 1.0
    assert costs.samples[0] > 0 and costs.samples[1] > 0 and costs.measured_step > 0 and costs.simulated_step > 0
    assert 0 <= costs.fitted_p2p_time < costs.measured_step
    with pytest.raises(ConfigError, match="ranks"):
        measure_message_costs(4096, ranks=1)


def test_the_fitted_transfer_is_the_p2p_time_that_gives_the_measured_step():
    pytest.importorskip("torch")  # profiling imports torch
    from pipeoffload.profiling import _fitted_transfer

    schedule = generate("1f1b", 2, 1)  # two hops on the critical path: 4.0 + 2 * p2p_time
    costs = replace(COSTS, p2p_time=0.0)
    assert _fitted_transfer(schedule, costs, 5.0) == pytest.approx(0.5, abs=1e-6)
    assert _fitted_transfer(schedule, costs, 3.0) == 0.0  # shorter than the compute alone
