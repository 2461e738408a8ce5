"""The typed application API that the CLI, the playground and Python users share.

Each operation is a request dataclass in, a result dataclass out; requests check their values on
construction (``service.checks``: the same checks the CLI's flags and the playground's queries use) and
results give the JSON object the CLI prints with ``--json`` (``as_dict``)::

    from pipeoffload.service import SimulateRequest, simulate
    result = simulate(SimulateRequest("zb-v", ranks=8, offload="all", offload_ratio=0.5))
    result.timeline.makespan, result.as_dict()["peak_rank_units"]

- simulate: ``SimulateRequest`` -> ``SimulateResult``
- compare: ``CompareRequest`` (several simulate requests) -> ``CompareResult`` (labelled rows, one time unit)
- plan: the planner's ``PlanRequest`` -> ``PlanResult``; ``CompareTPRequest`` -> ``CompareTPResult``
- k: ``OffloadRatioRequest`` -> ``OffloadRatioResult``
- estimate: the planner's ``EstimateRequest`` (one exact layout, no search) -> ``EstimateResult``

``run(request)`` calls the operation a request is for (``pipeoffload.run`` is the same function). A bad
value raises ``ConfigError`` in one line naming the request's fields (``tp=3: must divide ...``); the
command line prints the same message naming its flags (``--tp 3: ...``: ``ConfigError.named``).
"""
from collections.abc import Callable
from typing import Any, overload

from pipeoffload.planner.estimate import EstimateRequest
from pipeoffload.planner.plans import PlanRequest
from pipeoffload.service.checks import strict_json
from pipeoffload.service.compare import CompareRequest, CompareResult, CompareRow, compare
from pipeoffload.service.estimate import EstimateResult, estimate
from pipeoffload.service.offload_ratio import OffloadRatioRequest, OffloadRatioResult, offload_ratio
from pipeoffload.service.plan import CompareTPRequest, CompareTPResult, PlanResult, compare_tp, plan
from pipeoffload.service.simulate import SimulateRequest, SimulateResult, simulate

_OPERATIONS: dict[type, Callable[[Any], Any]] = {
    SimulateRequest: simulate, CompareRequest: compare, PlanRequest: plan, CompareTPRequest: compare_tp,
    OffloadRatioRequest: offload_ratio, EstimateRequest: estimate,
}


@overload
def run(request: SimulateRequest) -> SimulateResult: ...
@overload
def run(request: CompareRequest) -> CompareResult: ...
@overload
def run(request: PlanRequest) -> PlanResult: ...
@overload
def run(request: CompareTPRequest) -> CompareTPResult: ...
@overload
def run(request: OffloadRatioRequest) -> OffloadRatioResult: ...
@overload
def run(request: EstimateRequest) -> EstimateResult: ...
def run(request: object) -> object:
    """The result of the operation ``request`` is for (e.g. a ``SimulateRequest`` is simulated)."""
    operation = _OPERATIONS.get(type(request))
    if operation is None:
        raise TypeError(f"{type(request).__name__} is not a service request; use one of "
                        f"{', '.join(t.__name__ for t in _OPERATIONS)}")
    return operation(request)


__all__ = [
    "CompareRequest", "CompareResult", "CompareRow", "CompareTPRequest", "CompareTPResult", "EstimateRequest",
    "EstimateResult", "OffloadRatioRequest",
    "OffloadRatioResult", "PlanRequest", "PlanResult", "SimulateRequest", "SimulateResult", "compare", "compare_tp",
    "estimate", "offload_ratio", "plan", "run", "simulate", "strict_json",
]
