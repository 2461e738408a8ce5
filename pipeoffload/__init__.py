"""pipeoffload: pipeline-parallel training whose schedule manages activation memory.

The building blocks (``generate``, ``lower``, ``simulate``, ``validate``) are here, and so are the typed
requests of whole operations (what the CLI and the playground run) with ``run`` to carry one out, e.g.
``run(SimulateRequest("zb-v", ranks=8, offload="all")).timeline``; their results and the operations one
by one are in ``pipeoffload.service``.
"""
from typing import TYPE_CHECKING

from pipeoffload._lazy import lazy_names

if TYPE_CHECKING:  # for type checkers; at run time ``__getattr__`` below loads them
    from pipeoffload.costs import CostModel
    from pipeoffload.errors import ConfigError, ScheduleError
    from pipeoffload.ir import Action, ActionKind, Schedule
    from pipeoffload.passes.lower import lower
    from pipeoffload.placement import Placement
    from pipeoffload.schedules import generate, schedule_names
    from pipeoffload.service import (
        CompareRequest,
        CompareTPRequest,
        EstimateRequest,
        OffloadRatioRequest,
        PlanRequest,
        SimulateRequest,
        run,
    )
    from pipeoffload.simulator import DeadlockError, Timeline, simulate
    from pipeoffload.validation import validate

__version__ = "0.2.0.dev0"

# Every name loads on first use, from its module: ``import pipeoffload`` imports nothing else, so the
# ``pipeoffload`` command takes a Ctrl-C from its first line (``cli.main``), not after the core and numpy
# have loaded (1.1-1.4 s on a loaded machine, whose KeyboardInterrupt printed a traceback). The service's
# names bring the planner with them.
_HOMES = {
    "CostModel": "costs", "ConfigError": "errors", "ScheduleError": "errors", "Action": "ir", "ActionKind": "ir",
    "Schedule": "ir", "lower": "passes.lower", "Placement": "placement", "generate": "schedules",
    "schedule_names": "schedules", "DeadlockError": "simulator", "Timeline": "simulator", "simulate": "simulator",
    "validate": "validation", "CompareRequest": "service", "CompareTPRequest": "service", "EstimateRequest": "service",
    "OffloadRatioRequest": "service", "PlanRequest": "service", "SimulateRequest": "service", "run": "service",
}


__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())


__all__ = [
    "Action", "ActionKind", "CompareRequest", "CompareTPRequest", "ConfigError", "CostModel", "DeadlockError",
    "EstimateRequest", "OffloadRatioRequest", "Placement", "PlanRequest", "Schedule", "ScheduleError", "SimulateRequest", "Timeline",
    "generate", "lower", "run", "schedule_names", "simulate", "validate",
]
