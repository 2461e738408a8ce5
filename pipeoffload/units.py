"""The one unit convention of every report, picture and command (see docs/decisions.md, "Units").

- Memory is reported in **rank units**: one microbatch's saved activations for all of a rank's
  layers (``stages_per_rank`` activation units). Plain 1F1B peaks at ``ranks`` rank units on rank 0,
  whatever the number of stages per rank, so families compare directly.
- Time is in the unit of the cost model. From the command line (``--time-f/-i/-w``), in a request
  (``time_f``, ``time_i``, ``time_w``) and in the pictures' defaults the times are **per rank**: the forward of one microbatch through all of a
  rank's layers, split evenly over its stages, so the work of a step does not change with
  ``stages_per_rank``. With default costs one time unit is one rank's forward of one microbatch.
  Measured costs (a profiler's cost file, the planner) are in seconds, written ``s``.
"""
from __future__ import annotations

from pipeoffload.costs import CostModel
from pipeoffload.errors import Naming

MEMORY_UNIT = "rank units"
MEMORY_UNIT_HELP = "rank units: one microbatch's saved activations for all of a rank's layers"
TIME_UNIT = "t"
SECONDS = "s"
SECONDS_HELP = "s: seconds"
TIME_UNITS = (TIME_UNIT, SECONDS)


def time_unit_help(time_unit: str, naming: Naming) -> str:
    """The one-line explanation of a time unit symbol (``t`` or ``s``) that outputs print; ``t``'s names the
    time that sets it as ``naming`` does (``FIELDS``: ``time_f=1``; ``FLAGS``, the command line: ``--time-f 1``)."""
    if time_unit == TIME_UNIT:
        return ("t: the cost model's time unit; by default one rank's forward of one microbatch "
                f"({naming.given('time_f', 1)})")
    return SECONDS_HELP if time_unit == SECONDS else f"{time_unit}: the cost model's time unit"


def units_dict(time_unit: str, naming: Naming) -> dict[str, str]:
    """What the numbers of a report are in; every JSON output carries it under ``units``.
    ``time_unit`` is the symbol (``t`` or ``s``), explained in ``naming``'s words."""
    return {
        "time_unit": time_unit,
        "time": time_unit_help(time_unit, naming),
        "memory": MEMORY_UNIT_HELP,
        "activation_units": "one microbatch's saved activations for one stage (rank units x stages_per_rank)",
        "fields": "*_rank_units in rank units; peak_activation_units and peak_host_units in activation units; "
                  "makespan, busy and stall in the time unit (the top-level stall, as stall_summed_over_ranks, is "
                  "summed over ranks; stall_max_over_ranks is the worst rank's; per_rank's each rank's); offloaded "
                  "and recomputed count activations",
    }


def rank_costs(f: float, i: float, w: float, stages_per_rank: int, p2p: float = 0.0,
               **kwargs: object) -> CostModel:
    """Per-rank compute times split evenly over a rank's stages (the CLI's and the pictures' convention)."""
    v = max(stages_per_rank, 1)
    return CostModel.uniform(f / v, i / v, w / v, p2p, **kwargs)


def counted(value: float, singular: str, plural: str | None = None) -> str:
    """``value`` and its noun in the right number: "1 rank unit", "4 rank units", "0.5 rank units"."""
    return f"{value:g} {singular if value == 1 else plural or singular + 's'}"


def rank_units(value: float, digits: int = 6) -> str:
    """An amount of memory in rank units, e.g. "1 rank unit", "2.5 rank units"."""
    return counted(float(f"{value:.{digits}g}"), MEMORY_UNIT.removesuffix("s"))
