"""Spawned-process fixtures: one spawn per world size runs every case, tests read the results."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from workers import Case, equivalence_worker  # noqa: E402

from pipeoffload.runtime.launch import spawn  # noqa: E402
from pipeoffload.schedules import schedule_specs  # noqa: E402

# Every registered family (the runtime runs them all) at its default stages per rank, from the
# registry so that a new family is tested without editing this list; plus GPipe with every B split
# into I then W (I/W on several stages per rank).
SCHEDULES = [(spec.name, spec.default_stages_per_rank()) for spec in schedule_specs()] + [("gpipe+iw", 2)]
POLICIES = ["none", "offload:all", "recompute:first:1"]
EXTRA = {name: ["offload:first:1"] for name in ("1f1b", "interleaved-1f1b", "group-interleaved")}  # memory test
CASES = [Case(name, v, policy) for name, v in SCHEDULES for policy in POLICIES + EXTRA.get(name, [])]
# a lowered schedule with WAIT actions: 1F1B's warm-up throttled to two ranks' shared host link at k = 0.5
WAIT_CASE = Case("1f1b", 1, "offload:all", costs=(("shared_host_link", True), ("offload_ratio", 0.5)))
CASES.append(WAIT_CASE)
# a stall budget's plan: ZB-V's copies planned as if 0.95x as long, run at k = 0.7 (4 ranks: 3.3 % longer)
STALL_CASE = Case("zb-v", 2, "offload:all", costs=(("offload_ratio", 0.7), ("max_stall", 10.0)))
CASES.append(STALL_CASE)

_cache: dict = {}


def run_cases(world: int) -> list[list[dict]]:
    """Per rank, the result dict of every case in CASES (cached per world size)."""
    if world not in _cache:
        result = spawn(equivalence_worker, world, (CASES,), timeout=60, deadline=600)
        if not result.ok:
            errors = "\n".join(f"rank {r}: {e}" for r, e in enumerate(result.errors) if e)
            pytest.fail(f"spawned ranks failed (exit codes {result.exitcodes}):\n{errors}")
        _cache[world] = result.results
    return _cache[world]
