"""Error types: one for bad schedules (with a rendered grid), one for bad configuration; and the one
line for a missing optional extra, which every entry point (the ``pipeoffload`` commands, ``python -m
pipeoffload.runtime``) prints instead of a traceback."""
from __future__ import annotations

import importlib.util
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


# the packages of each optional extra (pyproject.toml): a command that needs one that is not installed
# says which extra brings it, in one line, instead of a traceback
EXTRAS = {"torch": "train", "tokenizers": "train", "safetensors": "train", "tqdm": "train"}


def missing_extra(err: ModuleNotFoundError) -> str | None:
    """The one line for an import of an optional extra's package that is not installed, else None."""
    top = (err.name or "").partition(".")[0]
    if top not in EXTRAS or (top != err.name and importlib.util.find_spec(top) is not None):
        return None  # not an extra's package, or the package is there and only a part of it is missing
    return extra_line(top)


def extra_line(package: str) -> str:
    extra = EXTRAS[package]
    return f"this command needs {package} (the '{extra}' extra): pip install 'pipeoffload[{extra}]'"
