"""The Llama model at sequence length 2048 on CPU: measured activation bytes equal the simulator's,
with each stage's unit taken from the profiler (bytes one microbatch's forward saves)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from llama_workers import memory_worker  # noqa: E402

from pipeoffload import Schedule  # noqa: E402
from pipeoffload.runtime.launch import spawn  # noqa: E402
from pipeoffload.runtime.trace import Trace, compare_with_simulation  # noqa: E402

pytestmark = pytest.mark.dist

CASES = [("1f1b", 1, "none"), ("1f1b", 1, "offload:all"), ("group-interleaved", 2, "offload:all")]


def test_llama_seq_2048_measured_equals_simulated() -> None:
    world = 2
    result = spawn(memory_worker, world, (CASES, 2048, 4), timeout=120, deadline=600)
    assert result.ok, result.errors
    per_rank = result.results
    for k, case in enumerate(CASES):
        ranks = [per_rank[r][k] for r in range(world)]
        schedule = Schedule.from_json(ranks[0]["schedule"])
        profiled = {int(s): b for s, b in ranks[0]["profiled"].items()}
        measured_units = {s: b for r in ranks for s, b in r["slot_bytes"].items()}
        assert measured_units == profiled, case  # the profiler's unit is what the runtime holds per slot
        rows = compare_with_simulation([Trace.from_dict(r["trace"]) for r in ranks], schedule, profiled)
        for row in rows:
            assert row["actions_match"], (case, row)
            assert row["measured_peak"] == row["simulated_peak"], (case, row)
        if case[2] == "offload:all":
            assert ranks[0]["trace"]["peak_host_bytes"] > 0  # the first rank offloaded
    # offload all holds less than no offload on the first rank (the one 1F1B loads most)
    peak = lambda k: Trace.from_dict(per_rank[0][k]["trace"]).peak_bytes  # noqa: E731
    assert peak(1) < peak(0)
