"""Error types: one for bad schedules (with a rendered grid), one for bad configuration."""
from __future__ import annotations

from collections.abc import Sequence

from pipeoffload.textgrid import render_grid


class ConfigError(ValueError):
    """A value a user gave violates a constraint. The message names the value, the rule and the fix."""


class ScheduleError(ValueError):
    """A schedule breaks an invariant at one (rank, step).

    The message names rank, step and action and ends with the rank x step grid,
    the bad cell marked, so the problem can be seen rather than reconstructed.
    """

    def __init__(
        self,
        reason: str,
        rank: int | None = None,
        step: int | None = None,
        action: object | None = None,  # an ``ir.Action`` (typed loosely: the IR imports this module)
        ranks: Sequence[Sequence[object]] | None = None,
    ) -> None:
        self.reason = reason
        self.rank = rank
        self.step = step
        self.action = action
        where = ""
        if rank is not None:
            where = f"rank {rank}, step {step}, action {action}: "
        message = where + reason
        if ranks is not None:
            message += "\n" + render_grid(ranks, mark=(rank, step) if rank is not None else None)
        super().__init__(message)
