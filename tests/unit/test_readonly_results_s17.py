"""Results are read-only all the way down: ``PlanResult.search`` (its plans and skipped counts) and
``Estimate.breakdown`` were a mutable dataclass, list and dicts inside frozen results. They refuse changes
now, as ``Timeline.stalls`` does, and still pickle (the planner's process pool) and print the same JSON."""
from __future__ import annotations

import dataclasses
import json
import pickle

import pytest

from pipeoffload import PlanRequest
from pipeoffload.planner import hardware_preset, model_preset
from pipeoffload.planner.estimate import EstimateRequest
from pipeoffload.planner.hardware import GIB
from pipeoffload.service import EstimateResult, PlanResult, estimate, plan

MODEL, GPU = model_preset("gpt3-1.3b"), hardware_preset("a100")


@pytest.fixture(scope="module")
def planned() -> PlanResult:
    return plan(PlanRequest(model=MODEL, hardware=GPU, gpus=4, global_batch=8, memory_budget=40 * GIB,
                            schedules=("1f1b",), workers=1))


@pytest.fixture(scope="module")
def estimated() -> EstimateResult:
    return estimate(EstimateRequest(model=MODEL, hardware=GPU, pp=4, global_batch=8))


def test_a_plan_results_search_cannot_be_changed(planned: PlanResult) -> None:
    search = planned.search
    with pytest.raises(dataclasses.FrozenInstanceError):
        search.plans = []  # type: ignore[misc]
    with pytest.raises(AttributeError):
        search.plans.append(search.plans[0])  # type: ignore[attr-defined]
    reason = next(iter(search.skipped), "any reason")
    with pytest.raises(TypeError):
        search.skipped[reason] = 0  # type: ignore[index]


def test_an_estimates_breakdown_cannot_be_changed(estimated: EstimateResult) -> None:
    with pytest.raises(TypeError):
        estimated.estimate.breakdown["compute"] = 0.0  # type: ignore[index]


def test_a_dict_given_as_breakdown_or_skipped_stays_the_callers(estimated: EstimateResult,
                                                                planned: PlanResult) -> None:
    mine = {"compute": 1.0}
    est = dataclasses.replace(estimated.estimate, breakdown=mine)
    skipped = {"a reason": 2}
    search = dataclasses.replace(planned.search, plans=list(planned.search.plans), skipped=skipped)
    mine.clear()
    skipped.clear()
    assert est.breakdown == {"compute": 1.0} and search.skipped == {"a reason": 2}
    assert isinstance(search.plans, tuple)


@pytest.mark.parametrize("which", ["planned", "estimated"])
def test_results_pickle_and_print_the_same_json(which: str, request: pytest.FixtureRequest) -> None:
    result = request.getfixturevalue(which)
    copy = pickle.loads(pickle.dumps(result))
    assert copy.as_dict() == result.as_dict()
    assert json.loads(json.dumps(result.as_dict())) == result.as_dict()  # plain JSON types throughout
    if which == "estimated":
        assert copy == result
        with pytest.raises(TypeError):  # the copy is read-only too
            copy.estimate.breakdown["compute"] = 0.0
        assert type(result.as_dict()["breakdown_seconds"]) is dict
    else:
        assert copy.search.skipped == result.search.skipped and copy.search.plans == result.search.plans
