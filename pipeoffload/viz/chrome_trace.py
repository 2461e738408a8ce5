"""Timelines as Chrome trace JSON (open in https://ui.perfetto.dev or chrome://tracing).

One process per rank, named and ordered, with a compute, a copy and a comm thread; device and host
memory as counter tracks in rank units. The runtime's measured traces (``runtime.trace``) use the same
layout, so ``pipeoffload trace compare`` can lay a measured run above its simulation in one file.
"""
from __future__ import annotations

import json
from collections.abc import Iterable

from pipeoffload.errors import FLAGS
from pipeoffload.ir import COMM_KINDS, COPY_KINDS, Action
from pipeoffload.simulator import Timeline
from pipeoffload.units import MEMORY_UNIT, SECONDS, TIME_UNIT, time_unit_help, units_dict

LANES = {"compute": 0, "copy": 1, "comm": 2}
SIM_PID_BASE = 1000  # simulated ranks' process ids, below a measured run's 0..d-1 in `trace compare`


def lane_of(action: Action) -> str:
    if action.kind in COPY_KINDS:
        return "copy"
    if action.kind in COMM_KINDS:
        return "comm"
    return "compute"


def process_events(pid: int, name: str, sort_index: int) -> list[dict]:
    """Metadata naming a rank's process and its three lanes, and fixing its place in the view."""
    return [
        {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": sort_index}},
        *({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": lane}}
          for lane, tid in LANES.items()),
        *({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}}
          for tid in LANES.values()),
    ]


_NOISE = 1e-12  # relative: below this a span is rounding error of the simulator's float sums


def span_events(pid: int, events: Iterable[tuple[Action, float, float]], scale: float) -> list[dict]:
    """Chrome 'X' events for one rank's (action, start, end) triples; ``scale`` converts to microseconds."""
    out = []
    for index, (action, start, end) in enumerate(events):
        lane = lane_of(action)
        span = end - start
        if span < _NOISE * max(abs(start), abs(end), 1.0):
            span = 0.0  # a difference of two equal sums of floats, not a duration
        if lane == "comm" and span == 0.0:
            continue  # instant sends only clutter the view
        out.append({
            "ph": "X", "name": str(action), "cat": action.kind.value, "pid": pid, "tid": LANES[lane],
            "ts": start * scale, "dur": span * scale,
            "args": {"action": str(action), "index": index, "stage": action.stage, "microbatch": action.microbatch},
        })
    return out


def counter_events(pid: int, name: str, key: str, curve: Iterable[tuple[float, float]], scale: float,
                   factor: float = 1.0) -> list[dict]:
    return [{"ph": "C", "name": name, "pid": pid, "ts": t * scale, "args": {key: level * factor}} for t, level in curve]


def shown_as(time_unit: str, scale: float) -> str:
    """How a viewer, which reads every trace in microseconds, shows one ``time_unit``: said in the
    process names, the one place Perfetto shows beside the times (it does not show ``otherData``)."""
    return f"1 {time_unit} shown as 1 s" if scale == 1e6 else f"1 {time_unit} shown as {scale:g} us"


def timeline_trace(timeline: Timeline, scale: float = 1e6, pid_base: int = 0, label: str = "simulated",
                   sort_base: int = 0, time_unit: str = TIME_UNIT, time_help: str | None = None) -> dict:
    """The simulated timeline as a Chrome trace object; one time unit (``time_unit``: ``t`` or ``s``)
    becomes ``scale`` microseconds. ``time_help``: what one unit is, where not the unit's own note (a
    costs file's per-stage times)."""
    events: list[dict] = []
    v = max(timeline.schedule.stages_per_rank, 1)
    shown = "" if time_unit == SECONDS else f" ({shown_as(time_unit, scale)})"
    for rank in range(timeline.schedule.num_ranks):
        pid, result = pid_base + rank, timeline.per_rank[rank]
        events += process_events(pid, f"{label} rank {rank}{shown}", sort_base + rank)
        events += span_events(pid, timeline.events(rank), scale)
        events += counter_events(pid, f"device memory ({MEMORY_UNIT})", MEMORY_UNIT, result.memory, scale, 1 / v)
        if result.peak_host_units:
            events += counter_events(pid, f"host memory ({MEMORY_UNIT})", MEMORY_UNIT, result.host_memory, scale,
                                     1 / v)
    # a trace is a file the commands write (simulate --trace, trace compare): its notes name their flags
    unit_note = f"{time_help or time_unit_help(time_unit, FLAGS)}; 1 unit = {scale:g} us here"
    other = {k: v for k, v in timeline.as_dict().items() if k != "per_rank"} | {"time_unit": unit_note}
    # the counters are in rank units, peak_host_units in activation units: both, and which is which
    other["peak_host_rank_units"] = timeline.peak_host_rank_units
    other["units"] = units_dict(time_unit, FLAGS) | {"counters": f"the memory counters are in {MEMORY_UNIT}"}
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def timeline_trace_json(timeline: Timeline, time_unit: str = TIME_UNIT, time_help: str | None = None) -> str:
    return json.dumps(timeline_trace(timeline, time_unit=time_unit, time_help=time_help))
