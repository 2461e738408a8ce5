"""Compare several simulations on one time axis: each row labelled by what makes it different."""
from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeoffload.errors import FIELDS, ConfigError, Naming
from pipeoffload.service.simulate import SimulateRequest, SimulateResult, join_label, simulate


@dataclass(frozen=True)
class CompareRequest:
    """Several simulations on one time axis (``pipeoffload compare``): ``run`` gives a ``CompareResult``
    whose rows are labelled by what differs between them."""

    runs: tuple[SimulateRequest, ...]

    def __post_init__(self) -> None:
        if isinstance(self.runs, SimulateRequest) or not isinstance(self.runs, (tuple, list)):
            raise ConfigError(f"runs={self.runs!r}: give a tuple of SimulateRequest, e.g. "
                              "CompareRequest((SimulateRequest('1f1b'), SimulateRequest('zb-v')))")
        object.__setattr__(self, "runs", tuple(self.runs))  # a list is kept as a tuple: the request stays hashable
        if not self.runs:
            raise ConfigError("nothing to compare: give at least one schedule")
        for index, run in enumerate(self.runs, 1):
            if not isinstance(run, SimulateRequest):
                example = f", e.g. SimulateRequest({run!r})" if isinstance(run, str) else ""
                raise ConfigError(f"run {index} is {run!r}, not a SimulateRequest; every run must be one{example}")


@dataclass(frozen=True)
class CompareRow:
    """One simulation of a ``compare``, named by what sets it apart from the other rows."""

    label: str  # schedule (a schedule file's path), then the sizes and options not every row shares; a repeat
    # of the same request gets "(repeat N)"
    result: SimulateResult


@dataclass(frozen=True)
class CompareResult:
    """What ``run(CompareRequest(...))`` gives: one ``CompareRow`` per simulation in the order asked, their
    shared time unit and the sizes and options every row has; ``as_dict`` is ``compare --json``'s list."""

    rows: tuple[CompareRow, ...]
    time_unit: str  # the rows share one time axis, so one unit
    shared: str = ""  # the sizes and options every row has (left out of the row labels), e.g. "d=8 m=32"

    @property
    def makespan(self) -> float:
        return max(r.result.timeline.makespan for r in self.rows)

    def as_dict(self, commands: Sequence[str] | None = None, naming: Naming = FIELDS) -> list[dict[str, Any]]:
        """The list ``compare --json`` prints (``naming``: ``FLAGS``): per row its label, the command that
        reproduces it (``commands``: the caller's own, e.g. as typed; default each request's ``pipeoffload
        simulate`` command) and its result's ``as_dict(naming)``. A list, not a dict: the rows are the
        comparison."""
        if commands is None:
            commands = [shlex.join(row.result.request.command()) for row in self.rows]
        if len(commands) != len(self.rows):
            raise ConfigError(f"{len(commands)} commands for {len(self.rows)} rows: give one per row")
        return [{"label": row.label, "command": command} | row.result.as_dict(naming)
                for row, command in zip(self.rows, commands)]


def compare(req: CompareRequest, names: Sequence[str] | None = None) -> CompareResult:
    """Simulate every run. A failing run's error is prefixed with ``names[i]`` (how the caller
    named that run, e.g. the command-line argument), or with its position."""
    results = []
    for index, run in enumerate(req.runs):
        try:
            results.append(simulate(run))
        except ConfigError as err:
            name = names[index] if names is not None else f"run {index + 1}"
            raise err.prefixed(name) from None
    rows, shared = _labelled(results)
    return CompareResult(rows, _one_time_unit(results), shared)


def _labelled(results: list[SimulateResult]) -> tuple[tuple[CompareRow, ...], str]:
    """Rows labelled by the schedule and what differs from the other rows, and what they all share."""
    parts = [r.label_parts() for r in results]
    common = set.intersection(*({*sizes[1:], *options} for sizes, options in parts)) if len(parts) > 1 else set()
    seen: dict[str, int] = {}
    rows = []
    for result, (sizes, options) in zip(results, parts):  # the same request twice: a visible repeat number
        label = join_label(sizes[:1] + [p for p in sizes[1:] if p not in common], [p for p in options if p not in common])
        seen[label] = seen.get(label, 0) + 1
        rows.append(CompareRow(label if seen[label] == 1 else f"{label} (repeat {seen[label]})", result))
    sizes, options = parts[0]
    shared = join_label([p for p in sizes[1:] if p in common], [p for p in options if p in common])
    return tuple(rows), shared


def _one_time_unit(results: list[SimulateResult]) -> str:
    units = sorted({r.time_unit for r in results})
    if len(units) > 1:
        raise ConfigError(f"the schedules mix time units ({' and '.join(units)}): their charts share one time axis; "
                          "give every schedule cost files in the same unit (or none)")
    return units[0]
