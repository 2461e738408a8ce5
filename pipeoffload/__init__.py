"""pipeoffload: pipeline-parallel training whose schedule manages activation memory.

The building blocks (``generate``, ``lower``, ``simulate``, ``validate``) are here, and so are the typed
requests of whole operations (what the CLI and the playground run) with ``run`` to carry one out, e.g.
``run(SimulateRequest("zb-v", ranks=8, offload="all")).timeline``; their results and the operations one
by one are in ``pipeoffload.service``.
"""
from typing import TYPE_CHECKING

from pipeoffload.costs import CostModel
from pipeoffload.errors import ConfigError, ScheduleError
from pipeoffload.ir import Action, ActionKind, Schedule
from pipeoffload.passes.lower import lower
from pipeoffload.placement import Placement
from pipeoffload.schedules import generate, schedule_names
from pipeoffload.simulator import DeadlockError, Timeline, simulate
from pipeoffload.validation import validate

if TYPE_CHECKING:  # for type checkers; at run time ``__getattr__`` below loads them
    from pipeoffload.service import (
        CompareRequest,
        CompareTPRequest,
        EstimateRequest,
        OffloadRatioRequest,
        PlanRequest,
        SimulateRequest,
        run,
    )

__version__ = "0.2.0.dev0"

# The service's names load on first use: ``import pipeoffload`` stays as light as the core (the service
# brings the planner with it).
_SERVICE_NAMES = ("CompareRequest", "CompareTPRequest", "EstimateRequest", "OffloadRatioRequest", "PlanRequest",
                  "SimulateRequest", "run")


def __getattr__(name: str) -> object:
    if name in _SERVICE_NAMES:
        from pipeoffload import service

        return getattr(service, name)
    raise AttributeError(f"module 'pipeoffload' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names with the service's, which load on first use (tab completion lists them)."""
    return sorted({*globals(), *_SERVICE_NAMES})


__all__ = [
    "Action", "ActionKind", "CompareRequest", "CompareTPRequest", "ConfigError", "CostModel", "DeadlockError",
    "EstimateRequest", "OffloadRatioRequest", "Placement", "PlanRequest", "Schedule", "ScheduleError", "SimulateRequest", "Timeline",
    "generate", "lower", "run", "schedule_names", "simulate", "validate",
]
