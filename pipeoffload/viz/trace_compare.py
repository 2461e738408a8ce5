"""A measured run beside its simulation: rebuild the schedule a runtime trace executed, simulate it
with the durations the run measured, and write both into one Chrome/Perfetto trace (measured ranks
above simulated ranks, each rank with compute, copy and comm lanes and a memory counter).

The simulation uses per-(kind, stage) mean measured durations; copies take the measured OFFLOAD and
RELOAD times (the runtime records when a copy is issued and completed on its rank) and P2P transfers
are free, so differences point at waits the cost model does not have.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from pipeoffload.costs import CostModel
from pipeoffload.errors import ConfigError
from pipeoffload.ir import Action, ActionKind, Schedule
from pipeoffload.simulator import Timeline, simulate
from pipeoffload.viz.chrome_trace import SIM_PID_BASE, timeline_trace

K = ActionKind


@dataclass(frozen=True)
class MeasuredRun:
    rows: tuple[tuple[tuple[Action, float, float], ...], ...]  # per rank: (action, start s, end s) in list order
    events: tuple[dict, ...]  # the run's own Chrome events, kept as they are

    @property
    def schedule(self) -> Schedule:
        return Schedule.from_rows([[a for a, _, _ in row] for row in self.rows], name="measured run")


def load_measured(data: dict) -> MeasuredRun:
    """Read a runtime trace (``runtime.trace.write_chrome_trace`` or the older one-process layout)."""
    events = data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(events, list):
        raise ConfigError("not a Chrome trace: expected an object with a 'traceEvents' list")
    by_rank: dict[int, list[tuple[float, int, Action, float, float]]] = defaultdict(list)
    for e in events:
        if e.get("ph") != "X":
            continue
        args = e.get("args") or {}
        try:
            action = Action.parse(args.get("action", e.get("name", "")))
        except ValueError as err:
            raise ConfigError(f"trace event {e.get('name')!r}: {err}") from None
        rank = int(args["rank"]) if "rank" in args else int(e.get("tid", 0))  # old layout: one thread per rank
        start, end = e["ts"] / 1e6, (e["ts"] + e.get("dur", 0.0)) / 1e6
        by_rank[rank].append((float(args.get("index", 0)), len(by_rank[rank]), action, start, end))
    if not by_rank:
        raise ConfigError("the trace has no actions: expected 'X' events named like 0F3 (a pipeoffload runtime trace)")
    if sorted(by_rank) != list(range(len(by_rank))):
        raise ConfigError(f"the trace has ranks {sorted(by_rank)}; expected 0..{len(by_rank) - 1}")
    rows = tuple(tuple((a, s, e) for *_, a, s, e in sorted(by_rank[r], key=lambda x: (x[0], x[3], x[1])))
                 for r in range(len(by_rank)))
    return MeasuredRun(rows, tuple(events))


def measured_costs(run: MeasuredRun, num_stages: int) -> CostModel:
    """Mean measured seconds per (kind, stage); stages without a kind fall back to the mean of that kind."""
    spans: dict[tuple[ActionKind, int], list[float]] = defaultdict(list)
    for row in run.rows:
        for action, start, end in row:
            spans[(action.kind, action.stage)].append(end - start)

    def per_stage(kind: ActionKind) -> tuple[float, ...] | None:
        found = {s: sum(v) / len(v) for (k, s), v in spans.items() if k == kind}
        if not found:
            return None
        fallback = sum(found.values()) / len(found)
        return tuple(found.get(s, fallback) for s in range(num_stages))

    def mean(kind: ActionKind) -> float:
        values = [x for (k, _), v in spans.items() if k == kind for x in v]
        return sum(values) / len(values) if values else 0.0

    zeros = (0.0,) * num_stages
    f, i, w, b, r = (per_stage(k) for k in (K.F, K.I, K.W, K.B, K.R))
    return CostModel(time_f=f or zeros, time_i=i or (b or zeros), time_w=w or zeros, time_b=b, time_r=r,
                     d2h_time=mean(K.OFFLOAD), h2d_time=mean(K.RELOAD))


def compare_trace(data: dict) -> tuple[dict, Timeline, MeasuredRun]:
    """(merged Chrome trace, the simulation, the measured run) for a runtime trace object."""
    run = load_measured(data)
    schedule = run.schedule
    timeline = simulate(schedule, measured_costs(run, schedule.num_stages))
    d = schedule.num_ranks
    sim = timeline_trace(timeline, scale=1e6, pid_base=SIM_PID_BASE, label="simulated", sort_base=d)
    measured_end = [max((e for _, _, e in row), default=0.0) for row in run.rows]
    other = {
        "kind": "pipeoffload trace compare: measured ranks first, then their simulation (seconds)",
        "measured_step_s": max(measured_end), "simulated_makespan_s": timeline.makespan,
        "per_rank": [{"rank": r, "measured_end_s": measured_end[r], "simulated_end_s": max(timeline.end[r], default=0.0)}
                     for r in range(d)],
    }
    merged = {"traceEvents": list(run.events) + sim["traceEvents"], "displayTimeUnit": "ms", "otherData": other}
    return merged, timeline, run
