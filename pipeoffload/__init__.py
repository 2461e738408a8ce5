"""pipeoffload: pipeline-parallel training whose schedule manages activation memory.

The building blocks (``generate``, ``lower``, ``simulate``, ``validate``) are here, and so are the typed
requests of whole operations (what the CLI and the playground run) with ``run`` to carry one out, e.g.
``run(SimulateRequest("zb-v", ranks=8, offload="all")).timeline``; their results and the operations one
by one are in ``pipeoffload.service``.
"""
from pipeoffload.costs import CostModel
from pipeoffload.errors import ConfigError, ScheduleError
from pipeoffload.ir import Action, ActionKind, Schedule
from pipeoffload.passes.lower import lower
from pipeoffload.placement import Placement
from pipeoffload.schedules import generate, schedule_names
from pipeoffload.service import (
    CompareRequest,
    CompareTPRequest,
    OffloadRatioRequest,
    PlanRequest,
    SimulateRequest,
    run,
)
from pipeoffload.simulator import DeadlockError, Timeline, simulate
from pipeoffload.validation import validate

__version__ = "0.2.0.dev0"

__all__ = [
    "Action", "ActionKind", "CompareRequest", "CompareTPRequest", "ConfigError", "CostModel", "DeadlockError",
    "OffloadRatioRequest", "Placement", "PlanRequest", "Schedule", "ScheduleError", "SimulateRequest", "Timeline",
    "generate", "lower", "run", "schedule_names", "simulate", "validate",
]
