"""`trace compare` (and `POST /api/trace`, which shares viz.trace_compare) simulates a run's copies at
their measured times, the I -> W window's (OFFLOAD_W/RELOAD_W) included: a run offloading only that
window had its copies simulated as free, and one offloading both had them at the first window's times."""
from collections import defaultdict

import pytest

from pipeoffload import generate, lower
from pipeoffload.costs import CostModel
from pipeoffload.ir import COPY_KINDS
from pipeoffload.runtime.trace import Trace, TraceRecord, chrome_events
from pipeoffload.simulator import Timeline, simulate
from pipeoffload.viz.trace_compare import compare_trace, load_measured


def _copy_means(timeline: Timeline, ranks: int) -> dict[str, float]:
    spans: dict[str, list[float]] = defaultdict(list)
    for r in range(ranks):
        for a, start, end in timeline.events(r):
            if a.kind in COPY_KINDS:
                spans[a.kind.value].append(end - start)
    return {k: sum(v) / len(v) for k, v in spans.items()}


def _measured_vs_simulated(costs: CostModel, **policies: str) -> tuple[dict[str, float], dict[str, float]]:
    """(mean copy time per kind as "measured", as `trace compare` simulates it) for a zb-h1 run whose
    measured times are the simulator's own under ``costs`` (seconds)."""
    schedule = lower(generate("zb-h1", 2, 4), **policies)
    truth = simulate(schedule, costs)
    traces = [Trace(r, 0, [TraceRecord(a, s, e, 0) for a, s, e in truth.events(r)], epoch=1000.0) for r in range(2)]
    data = {"traceEvents": chrome_events(traces)}
    _, timeline, run = compare_trace(data, load_measured(data))
    measured = _copy_means(truth, 2)
    return measured, _copy_means(timeline, 2)


def test_second_window_only_copies_take_their_measured_times() -> None:
    costs = CostModel(d2h_time=0.3, h2d_time=0.2)
    measured, simulated = _measured_vs_simulated(costs, offload="all", recompute="first:1")
    assert set(measured) == {"OFFLOAD_W", "RELOAD_W"}
    assert simulated == pytest.approx(measured, rel=1e-6)  # before: 0.0 for both


def test_both_windows_imply_the_part_the_second_moves() -> None:
    costs = CostModel(d2h_time=0.4, h2d_time=0.2, w_fraction=0.5)
    measured, simulated = _measured_vs_simulated(costs, offload="all")
    assert measured["OFFLOAD_W"] == pytest.approx(0.2) and measured["RELOAD_W"] == pytest.approx(0.1)
    assert simulated == pytest.approx(measured, rel=1e-6)  # before: OFFLOAD_W 0.4, RELOAD_W 0.2
