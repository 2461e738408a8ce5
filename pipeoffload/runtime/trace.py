"""What a rank did during one step: every action with its start, end and the resident activation
bytes after it, in the order it ran. A trace can be compared with the schedule it executed and
with the simulator's timeline, and exported as Chrome/Perfetto trace events to be drawn."""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from pipeoffload.costs import CostModel
from pipeoffload.fileio import write_atomic
from pipeoffload.ir import Action, Schedule
from pipeoffload.simulator import Timeline, simulate


class TraceRecord(NamedTuple):
    action: Action
    start: float  # seconds since the step began
    end: float
    resident_bytes: int  # managed activation bytes on the device after the action
    host_bytes: int = 0  # host bytes of offloaded activations after the action


@dataclass
class Trace:
    rank: int
    step: int  # the step's number as its failures name it: the caller's (train's and the runtime CLI's from 1)
    records: list[TraceRecord] = field(default_factory=list)
    peak_bytes: int = 0  # highest resident activation bytes at any moment of the step (not only after actions)
    end_bytes: int = 0  # resident activation bytes after the step (0 unless something leaked)
    peak_host_bytes: int = 0  # highest host bytes of offloaded activations during the step
    wall: float = 0.0  # seconds the step took on this rank
    # the wall clock (time.time) at this rank's step start: the records' times are seconds after it, so
    # ranks on one machine (or on NTP-synced machines, to their clocks' agreement) share one time axis
    epoch: float = 0.0
    measured: bool = True  # False: the step ran without the activation store; the byte fields are 0

    def actions(self) -> tuple[Action, ...]:
        return tuple(r.action for r in self.records)

    def matches(self, row: Sequence[Action]) -> bool:
        """True when the rank ran exactly ``row`` (its lowered action list), in order."""
        return self.actions() == tuple(row)

    def peak_after_actions(self) -> int:
        return max((r.resident_bytes for r in self.records), default=0)

    def memory_curve(self) -> list[tuple[float, int]]:
        return [(r.end, r.resident_bytes) for r in self.records]

    def host_curve(self) -> list[tuple[float, int]]:
        """(end s, host bytes of offloaded activations) after each action; its highest level is
        ``peak_host_bytes`` or less (the peak may fall inside an action)."""
        return [(r.end, r.host_bytes) for r in self.records]

    def as_dict(self) -> dict:
        return {
            "rank": self.rank, "step": self.step, "peak_bytes": self.peak_bytes, "end_bytes": self.end_bytes,
            "wall": self.wall, "peak_host_bytes": self.peak_host_bytes, "epoch": self.epoch,
            "measured": self.measured, "records": [[str(r.action), r.start, r.end, r.resident_bytes, r.host_bytes]
                                              for r in self.records],
        }

    @classmethod
    def from_dict(cls, data: dict) -> Trace:
        # a record written before host_bytes existed has four fields
        records = [TraceRecord(Action.parse(a), s, e, b, *host) for a, s, e, b, *host in data["records"]]
        return cls(data["rank"], data["step"], records, data["peak_bytes"], data["end_bytes"],
                   data.get("peak_host_bytes", 0), data["wall"], data.get("epoch", 0.0),
                   data.get("measured", True))


MIB = 1024 * 1024


def shared_clock_offsets(traces: Sequence[Trace]) -> dict[int, float] | None:
    """Per rank, seconds from the earliest rank's step start to its own (``Trace.epoch``), so that all
    ranks share one time axis; None when a trace has no epoch (written by an older version)."""
    if not traces or any(t.epoch <= 0 for t in traces):
        return None
    first = min(t.epoch for t in traces)
    return {t.rank: t.epoch - first for t in traces}


DEVICE_COUNTER = "device activation memory (MiB)"
HOST_COUNTER = "host activation memory (MiB)"


def chrome_events(traces: Iterable[Trace], label: str = "measured") -> list[dict]:
    """Chrome trace events of a measured step: one named process per rank with a compute, a copy and a
    comm lane, one box per action (its list index in ``args``, so the schedule can be rebuilt from the
    file), a counter of resident activation memory in MiB and, on a rank that offloaded, one of the
    host memory its offloaded activations held, in MiB (both after each action). Ranks share one clock (each shifted by
    its step start on the wall clock, see ``shared_clock_offsets``); without epochs each rank's clock
    starts at its own step."""
    from pipeoffload.viz.chrome_trace import LANES, lane_of, process_events

    traces = list(traces)
    offsets = shared_clock_offsets(traces) or {}
    events: list[dict] = []
    for trace in traces:
        pid = trace.rank
        shift = offsets.get(trace.rank, 0.0)
        events += process_events(pid, f"{label} rank {trace.rank} (step {trace.step})", trace.rank)
        for index, r in enumerate(trace.records):
            events.append({
                "name": str(r.action), "cat": r.action.kind.value, "ph": "X", "pid": pid,
                "tid": LANES[lane_of(r.action)], "ts": (shift + r.start) * 1e6, "dur": max(r.end - r.start, 0.0) * 1e6,
                "args": {"action": str(r.action), "index": index, "rank": trace.rank,
                         "stage": r.action.stage, "microbatch": r.action.microbatch},
            })
            events.append({"name": DEVICE_COUNTER, "ph": "C", "pid": pid, "ts": (shift + r.end) * 1e6,
                           "args": {"MiB": r.resident_bytes / MIB}})
            if trace.peak_host_bytes:  # as simulated traces: a host counter on the ranks that offloaded
                events.append({"name": HOST_COUNTER, "ph": "C", "pid": pid, "ts": (shift + r.end) * 1e6,
                               "args": {"MiB": r.host_bytes / MIB}})
    return events


def write_chrome_trace(traces: Iterable[Trace], path: str) -> None:
    """The measured step as a Chrome/Perfetto trace, written atomically; per-rank peaks in ``otherData``."""
    traces = list(traces)
    shared = shared_clock_offsets(traces) is not None
    other = {"kind": "pipeoffload measured trace", "time_unit": "s (1 s = 1e6 us in the events)",
             "clock": "shared: each rank's events start at its step start on the wall clock" if shared
             else "per rank: each rank's events start at its own step start",
             "peak_bytes": {t.rank: t.peak_bytes for t in traces},
             "peak_host_bytes": {t.rank: t.peak_host_bytes for t in traces}, "wall_s": {t.rank: t.wall for t in traces},
             "steps": "numbered as the run's log and failures name them (train and the runtime CLI: from 1)"}
    write_atomic(path, json.dumps({"traceEvents": chrome_events(traces), "displayTimeUnit": "ms",
                                   "otherData": other}))


def simulated_peaks(schedule: Schedule, unit_bytes: Mapping[int, int],
                    w_fraction: float | Mapping[int, float] = 1.0) -> list[float]:
    """The simulator's peak per rank in bytes, with each stage's activation unit set to the bytes
    the runtime measured for it (``PipelineRunner.slot_bytes`` gathered from every rank). ``w_fraction``:
    one value, or per stage (``measured_w_fractions``; stages missing take 1.0)."""
    return [r.peak_activation_units for r in _measured_units_timeline(schedule, unit_bytes, w_fraction).per_rank]


def _measured_units_timeline(schedule: Schedule, unit_bytes: Mapping[int, int],
                             w_fraction: float | Mapping[int, float]) -> Timeline:
    """The simulation of ``schedule`` in bytes: each stage's unit is its measured slot bytes."""
    sizes = tuple(float(unit_bytes.get(s, 0)) for s in range(schedule.num_stages))
    if isinstance(w_fraction, Mapping):
        per_stage = tuple(min(1.0, float(w_fraction.get(s, 1.0))) for s in range(schedule.num_stages))
        costs = CostModel(activation=sizes, w_fraction=max(per_stage, default=1.0), stage_w_fraction=per_stage)
    else:
        costs = CostModel(activation=sizes, w_fraction=w_fraction)
    return simulate(schedule, costs)


def measured_w_fractions(unit_bytes: Mapping[int, int], w_bytes: Mapping[int, int]) -> dict[int, float]:
    """Per stage, the share of a slot's bytes still held after its I (``PipelineRunner.w_bytes`` over
    ``slot_bytes``): the w_fraction the runtime actually has, for ``simulated_peaks``."""
    return {s: w_bytes.get(s, 0) / b for s, b in unit_bytes.items() if b > 0 and s in w_bytes}


def compare_with_simulation(traces: Sequence[Trace], schedule: Schedule, unit_bytes: Mapping[int, int],
                            w_fraction: float | Mapping[int, float] = 1.0) -> list[dict]:
    """Per rank: did it run its list exactly, its measured vs simulated peak device bytes, and the same
    for the host bytes of offloaded activations."""
    ranks = _measured_units_timeline(schedule, unit_bytes, w_fraction).per_rank
    out = []
    for trace in traces:
        sim = ranks[trace.rank].peak_activation_units
        out.append({
            "rank": trace.rank, "actions_match": trace.matches(schedule.actions[trace.rank]),
            "measured_peak": trace.peak_bytes, "simulated_peak": sim,
            "relative_difference": abs(trace.peak_bytes - sim) / sim if sim else float(trace.peak_bytes != 0),
            "measured_host_peak": trace.peak_host_bytes, "simulated_host_peak": ranks[trace.rank].peak_host_units,
        })
    return out

