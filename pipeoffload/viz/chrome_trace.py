"""Timelines as Chrome trace JSON (open in https://ui.perfetto.dev or chrome://tracing).

One process per rank with a compute, a copy and a comm thread; memory as counter tracks. The same
writer takes the runtime's measured traces, so simulated and measured runs can be opened side by side.
"""
from __future__ import annotations

import json
from collections.abc import Iterable

from pipeoffload.ir import COMM_KINDS, COPY_KINDS, Action
from pipeoffload.simulate import Timeline

_LANES = {"compute": 0, "copy": 1, "comm": 2}


def lane_of(action: Action) -> str:
    if action.kind in COPY_KINDS:
        return "copy"
    if action.kind in COMM_KINDS:
        return "comm"
    return "compute"


def trace_events(
    rank: int, events: Iterable[tuple[Action, float, float]], memory: Iterable[tuple[float, float]] = (),
    scale: float = 1e6, label: str = "",
) -> list[dict]:
    """Chrome 'X' events for one rank's (action, start, end) triples; ``scale`` converts to microseconds."""
    out: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"{label}rank {rank}"}},
        *({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": lane}}
          for lane, tid in _LANES.items()),
    ]
    for action, start, end in events:
        lane = lane_of(action)
        if lane == "comm" and end <= start:
            continue  # instant sends only clutter the view
        out.append({
            "ph": "X", "name": str(action), "cat": action.kind.value, "pid": rank, "tid": _LANES[lane],
            "ts": start * scale, "dur": max(end - start, 0.0) * scale,
            "args": {"stage": action.stage, "microbatch": action.microbatch},
        })
    for time, level in memory:
        out.append({"ph": "C", "name": "activation memory", "pid": rank, "ts": time * scale,
                    "args": {"units": level}})
    return out


def timeline_trace(timeline: Timeline, scale: float = 1e6) -> dict:
    """The whole simulated timeline as a Chrome trace object (time units scaled to microseconds)."""
    events: list[dict] = []
    for rank in range(timeline.schedule.num_ranks):
        events += trace_events(rank, timeline.events(rank), timeline.per_rank[rank].memory, scale, "sim ")
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": timeline.as_dict() | {"per_rank": None}}


def timeline_trace_json(timeline: Timeline) -> str:
    return json.dumps(timeline_trace(timeline))
