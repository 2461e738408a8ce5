"""pipeoffload: pipeline-parallel training whose schedule manages activation memory."""
from pipeoffload.costs import CostModel
from pipeoffload.errors import ConfigError, ScheduleError
from pipeoffload.ir import Action, ActionKind, Schedule
from pipeoffload.passes.lower import lower
from pipeoffload.placement import Placement
from pipeoffload.schedules import generate, schedule_names
from pipeoffload.simulator import DeadlockError, Timeline, simulate
from pipeoffload.validation import validate

__version__ = "0.2.0.dev0"

__all__ = [
    "Action", "ActionKind", "ConfigError", "CostModel", "DeadlockError", "Placement", "Schedule",
    "ScheduleError", "Timeline", "generate", "lower", "schedule_names", "simulate", "validate",
]
