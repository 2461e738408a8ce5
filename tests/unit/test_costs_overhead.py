"""The runtime's fixed cost per compute action in the cost model: once per action, in the simulation."""
from __future__ import annotations

import pytest

from pipeoffload.costs import CostModel, cost_model_from_dict, cost_model_to_dict
from pipeoffload.errors import ConfigError
from pipeoffload.schedules import generate
from pipeoffload.simulator import simulate


def test_each_compute_action_pays_the_overhead_once():
    bare = CostModel(time_f=2.0, time_i=1.0, time_w=0.5)
    costs = CostModel(time_f=2.0, time_i=1.0, time_w=0.5, action_overhead=0.125)
    assert (costs.f(0), costs.i(0), costs.w(0), costs.r(0)) == (2.125, 1.125, 0.625, 2.125)
    assert costs.b(0) == bare.b(0) + 0.125  # B defaults to I + W but is one action: one overhead


@pytest.mark.parametrize("family, v", [("1f1b", 1), ("zb-h1", 1)])
def test_one_rank_step_grows_by_the_overhead_of_each_compute_action(family, v):
    schedule = generate(family, 1, 4, v)
    bare, costs = CostModel(time_f=2.0, time_i=1.0, time_w=0.5), CostModel(time_f=2.0, time_i=1.0, time_w=0.5,
                                                                           action_overhead=0.25)
    actions = len(schedule.actions[0])
    assert simulate(schedule, costs).makespan == pytest.approx(simulate(schedule, bare).makespan + 0.25 * actions)


def test_overhead_round_trips_through_a_cost_file_and_is_checked():
    costs = CostModel(time_f=(1.0, 2.0), time_i=1.0, time_w=1.0, action_overhead=1e-4)
    assert cost_model_from_dict(cost_model_to_dict(costs)) == costs
    with pytest.raises(ConfigError, match="action_overhead"):
        CostModel(action_overhead=-1.0)
