"""A measured run beside its simulation: rebuild the schedule a runtime trace executed, simulate it
with the durations the run measured, and write both into one Chrome/Perfetto trace (measured ranks
above simulated ranks, each rank with compute, copy and comm lanes and a memory counter).

The simulation uses per-(kind, stage) mean measured durations; copies take the measured times of both
windows as the cost model expresses them (``measured_copy_costs``: a per-unit D2H and H2D time and, per
stage, the part of an activation the I -> W window moves; the runtime records when a copy is issued and
completed on its rank) and P2P transfers are free, so differences point at waits the cost model does not have.
"""
from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeoffload.costs import CostModel
from pipeoffload.errors import ConfigError, ScheduleError
from pipeoffload.ir import COMM_KINDS, COMPUTE_KINDS, COPY_KINDS, Action, ActionKind, Schedule
from pipeoffload.simulator import Timeline, simulate
from pipeoffload.units import SECONDS, counted
from pipeoffload.validation import validate
from pipeoffload.viz.chartdata import KIND_ORDER, Box, ChartData, Curve, memory_curve
from pipeoffload.viz.chrome_trace import SIM_PID_BASE, timeline_trace

K = ActionKind
MIB = 2**20


# The runtime's memory counters (``runtime.trace.chrome_events``): resident activation MiB after each
# action, and the host MiB its offloaded activations held (only in traces of runs that offloaded).
MEMORY_COUNTER = "device activation memory (MiB)"
HOST_COUNTER = "host activation memory (MiB)"


@dataclass(frozen=True)
class MeasuredRun:
    rows: tuple[tuple[tuple[Action, float, float], ...], ...]  # per rank: (action, start s, end s) in list order
    events: tuple[dict, ...]  # the run's own Chrome events, kept as they are
    # per rank: (time s, resident activation bytes) after each action, from the memory counter; empty if absent
    memory: tuple[tuple[tuple[float, float], ...], ...] = ()
    host_memory: tuple[tuple[tuple[float, float], ...], ...] = ()  # the same from the host counter

    @property
    def schedule(self) -> Schedule:
        return Schedule.from_rows([[a for a, _, _ in row] for row in self.rows], name="measured run")


def _number(event: dict, key: str, where: str) -> float:
    value = event.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{where}: {key!r} is {value!r}; expected a finite number >= 0 (microseconds)")
    return float(value)


def _span(number: int, e: dict) -> tuple[int, float, Action, float, float]:
    """(rank, list index, action, start s, end s) of one 'X' event, or ConfigError naming it."""
    where = f"trace event {number} ({str(e.get('name'))[:40]!r})"
    args = e.get("args") or {}
    if not isinstance(args, dict):
        raise ConfigError(f"{where}: 'args' is not an object")
    name = args.get("action", e.get("name", ""))
    try:
        action = Action.parse(name) if isinstance(name, str) else Action.parse(repr(name))
        rank = int(args["rank"]) if "rank" in args else int(e.get("tid", 0))  # old layout: one thread per rank
        index = float(args.get("index", 0))
    except (ValueError, TypeError) as err:
        raise ConfigError(f"{where}: {str(err).splitlines()[0]}") from None
    if rank < 0 or not math.isfinite(index):
        raise ConfigError(f"{where}: rank {rank} and list index {index} must be a rank >= 0 and a finite index")
    start = _number(e, "ts", where)
    return rank, index, action, start / 1e6, (start + _number(e, "dur", where)) / 1e6


def read_trace_json(text: str, parse_constant: Callable[[str], Any] | None = None) -> Any:
    """``text`` as JSON (``json.loads``; it raises what that raises). The Chrome trace format's JSON
    array form may end without its closing ``]`` (a tracer stopped mid-write leaves it so), and
    Perfetto and chrome://tracing read such a file: so is it read here, a trailing comma included."""
    try:
        return json.loads(text, parse_constant=parse_constant)
    except json.JSONDecodeError:
        body = text.rstrip()
        if not body.lstrip().startswith("[") or body.endswith("]"):
            raise
        try:
            return json.loads(body.rstrip(",") + "]", parse_constant=parse_constant)
        except json.JSONDecodeError:
            pass
        raise  # the file's own error, not the mended text's


def not_strict_json(value: str) -> ConfigError:
    """The one message for NaN or an infinity in a trace file, whoever finds it: the playground's strict
    parser (``value`` the constant's text) or ``load_measured`` on what a lenient parser read."""
    return ConfigError(f"the file is not strict JSON ({value} is not JSON; strict JSON has no NaN or Infinity)")


def _check_finite(data: Any) -> None:
    """ConfigError naming the first NaN or infinity anywhere in ``data`` (``json.loads`` reads them by
    default; a trace holding one is not JSON, and its events are copied into ``trace compare``'s output)."""
    try:
        json.dumps(data, allow_nan=False)
        return
    except RecursionError:
        raise ConfigError("the file is not strict JSON (nested too deeply)") from None
    except ValueError:
        pass
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise not_strict_json("NaN" if item != item else ("Infinity" if item > 0 else "-Infinity"))
        if isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            stack.extend(reversed(item))


_RANK_NAME = re.compile(r"\brank (\d+)\b")


def _named_ranks(data: Any, events: list) -> set[int]:
    """The ranks a runtime trace names besides its actions: ``otherData``'s per-rank notes
    (``write_chrome_trace``'s peak_bytes and wall_s) and its processes' names ("measured rank 1 (step 0)")."""
    named: set[int] = set()
    other = data.get("otherData") if isinstance(data, dict) else None
    for key in ("peak_bytes", "wall_s"):
        notes = other.get(key) if isinstance(other, dict) else None
        if isinstance(notes, dict):
            named.update(int(r) for r in notes if isinstance(r, str) and r.isascii() and r.isdigit() and len(r) < 7)
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "M" and e.get("name") == "process_name":
            args = e.get("args")
            found = _RANK_NAME.search(str(args.get("name", "")) if isinstance(args, dict) else "")
            if found and len(found.group(1)) < 7:
                named.add(int(found.group(1)))
    return named


# The stage at the other end of a transfer (see validation._partner).
_PEER = {ActionKind.SEND_F: (1, "sends to"), ActionKind.RECV_F: (-1, "receives from"),
         ActionKind.SEND_B: (-1, "sends to"), ActionKind.RECV_B: (1, "receives from")}


def _check_whole(by_rank: dict[int, list], named: set[int]) -> None:
    """Every rank has events and every stage's transfers have a rank at their other end: a rank missing
    from the trace is named as such, not left to the simulator to report as a deadlock."""
    missing = sorted((set(range(max(by_rank) + 1)) | named) - set(by_rank))
    if missing:
        have = ", ".join(map(str, sorted(by_rank)[:8])) + (", ..." if len(by_rank) > 8 else "")
        which = (f"rank {missing[0]} has" if len(missing) == 1
                 else f"ranks {', '.join(map(str, missing[:8]))}{', ...' if len(missing) > 8 else ''} have")
        of = "rank" if len(by_rank) == 1 else "ranks"
        raise ConfigError(f"{which} no events (the trace has actions of {of} {have} only); give the trace "
                          "with every rank's events")
    stages = {a.stage for row in by_rank.values() for *_, a, _, _ in row}
    for rank in sorted(by_rank):
        for *_, a, _, _ in by_rank[rank]:
            if a.kind in COMM_KINDS:
                step, verb = _PEER[a.kind]
                if a.stage + step not in stages:
                    raise ConfigError(f"rank {rank}'s {a} {verb} stage {a.stage + step}, which no rank in the trace "
                                      f"runs: the rank that ran it has no events; give the trace with every rank's "
                                      "events")


def _check_ranks(by_rank: dict[int, list], actions: int) -> None:
    """A rank below the number of actions, as a whole run's ranks (0 to d - 1, each with actions) are:
    ``_check_whole`` counts the ranks up to the largest, which must not be a number the file chose
    (a rank of 1e20, or an OS thread id as the old layout's ``tid``, took all memory)."""
    top = max(by_rank)
    if top >= actions:
        shown = str(top) if len(str(top)) <= 24 else f"{str(top)[:12]}... ({len(str(top))} digits)"
        raise ConfigError(f"an action has rank {shown} but the trace has only {actions:,} action{'s' * (actions != 1)}: a run's "
                          "ranks are numbered from 0 and each has actions, so a rank must be below the number of "
                          "actions; give the trace a run wrote, its 'args.rank' (or the old layout's 'tid') the rank")


def load_measured(data: Any) -> MeasuredRun:
    """Read a runtime trace (``runtime.trace.write_chrome_trace``, ``python -m pipeoffload.runtime --trace``,
    or the older one-process layout; an object with ``traceEvents`` or, the Chrome trace format's JSON
    Array Format, the list of events alone) and check that its actions are the schedule of a whole run
    (``validation.validate``: no action twice, none missing, every rank present); ConfigError with one
    line for anything else."""
    _check_finite(data)
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ConfigError("not a Chrome trace: expected an object with a 'traceEvents' list, or a list of events")
    by_rank: dict[int, list[tuple[float, int, Action, float, float]]] = defaultdict(list)
    rank_of_pid: dict[Any, int] = {}
    counters: dict[str, list[tuple[Any, float, float]]] = {MEMORY_COUNTER: [], HOST_COUNTER: []}  # (pid, s, MiB)
    for number, e in enumerate(events):
        if not isinstance(e, dict):
            raise ConfigError(f"trace event {number} is {type(e).__name__}; expected an object")
        if e.get("name") == "process_name" and str((e.get("args") or {}).get("name", "")).startswith("simulated"):
            raise ConfigError("this trace holds a simulated timeline (`pipeoffload simulate --trace`, or the output of "
                              "`trace compare`), not a run's measured step; give the trace a run wrote")
        if e.get("ph") == "C" and e.get("name") in counters:
            level = (e.get("args") or {}).get("MiB") if isinstance(e.get("args"), dict) else None
            counters[e["name"]].append((e.get("pid"), _number(e, "ts", f"trace event {number}") / 1e6,
                             _number({"MiB": level}, "MiB", f"trace event {number}")))
        if e.get("ph") != "X":
            continue
        rank, index, action, start, end = _span(number, e)
        if rank_of_pid.setdefault(e.get("pid"), rank) != rank:
            rank_of_pid[e.get("pid")] = -1  # the old layout: one process for every rank, no per-rank counter
        by_rank[rank].append((index, len(by_rank[rank]), action, start, end))
    if not by_rank:
        raise ConfigError("the trace has no actions: expected 'X' events named like 0F3 (a pipeoffload runtime trace)")
    actions = sum(len(row) for row in by_rank.values())
    largest = max(max(a.stage, a.microbatch) for row in by_rank.values() for *_, a, _, _ in row)
    if largest >= actions:  # a run has every stage and microbatch in some action
        raise ConfigError(f"an action numbers a stage or microbatch {largest:,} but the trace has only {actions:,} "
                          "actions, so it is not a whole run")
    _check_ranks(by_rank, actions)
    _check_whole(by_rank, _named_ranks(data, events))
    rows = tuple(tuple((a, s, e) for *_, a, s, e in sorted(by_rank[r], key=lambda x: (x[0], x[3], x[1])))
                 for r in range(len(by_rank)))
    try:
        schedule = Schedule.from_rows([[a for a, _, _ in row] for row in rows])
    except ValueError as err:  # e.g. stages 0 and 2 but no 1: not a run's whole schedule
        raise ConfigError(f"the trace's actions are not a schedule: {str(err).splitlines()[0]}") from None
    try:
        validate(schedule)
    except ScheduleError as err:  # an action twice or missing, or out of order: no run executed it
        raise ConfigError(f"the trace's actions are not the schedule of a run: {str(err).splitlines()[0]}") from None
    device, host = (_curves(counters[name], rank_of_pid, len(rows)) for name in (MEMORY_COUNTER, HOST_COUNTER))
    return MeasuredRun(rows, tuple(events), device, host)


def _curves(counters: list[tuple[Any, float, float]], rank_of_pid: dict[Any, int],
            ranks: int) -> tuple[tuple[tuple[float, float], ...], ...]:
    """Per rank, a counter's (time s, bytes) points in time order; () when no rank has one."""
    memory: list[list[tuple[float, float]]] = [[] for _ in range(ranks)]
    for pid, t, mib in counters:
        rank = rank_of_pid.get(pid, -1)
        if rank >= 0:
            memory[rank].append((t, mib * MIB))
    return tuple(tuple(sorted(m)) for m in memory) if any(memory) else ()


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

    zeros = (0.0,) * num_stages
    f, i, w, b, r = (per_stage(k) for k in (K.F, K.I, K.W, K.B, K.R))
    return CostModel(time_f=f or zeros, time_i=i or (b or zeros), time_w=w or zeros, time_b=b, time_r=r,
                     **measured_copy_costs(run, num_stages))


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def measured_copy_costs(run: MeasuredRun, num_stages: int) -> dict[str, Any]:
    """The CostModel fields that time the run's copies: ``d2h_time``, ``h2d_time`` and, where the I -> W
    window's copies imply it, ``stage_w_fraction`` (with ``w_fraction`` their largest, as cost files do).

    The simulator times a copy as the units it moves times the per-unit time of its direction; every
    activation is one unit here, the F -> backward window (OFFLOAD/RELOAD) moves all of it and the I -> W
    window (OFFLOAD_W/RELOAD_W) the stage's w_fraction part. So:
    - with first-window copies, the per-unit times are their mean measured times, and a stage's
      w_fraction is what its mean second-window times imply: (mean OFFLOAD_W + mean RELOAD_W) /
      (d2h_time + h2d_time), which keeps the round trip's time on the copy lane (the two directions
      alone may then differ from the measured ones when their ratio differs from the first window's).
      It is capped at 1: a second-window copy slower than the whole activation's copy is not a part of
      it, and is simulated at the first window's time. Stages without second-window copies keep 1.0;
    - without them (only the I -> W window was offloaded), the per-unit times are the second window's
      own means and w_fraction stays 1.0: its copies then take their measured times, never 0.
    An OFFLOAD_W of an activation whose first window was offloaded copies nothing (the host kept that
    part, ``semantics.host_copy_kept``): it is simulated as instant and its measured time is left out.
    """
    first = {(a.stage, a.microbatch) for row in run.rows for a, _, _ in row if a.kind == K.OFFLOAD}
    spans: dict[tuple[ActionKind, int], list[float]] = defaultdict(list)
    for row in run.rows:
        for a, start, end in row:
            if a.kind in COPY_KINDS and not (a.kind == K.OFFLOAD_W and (a.stage, a.microbatch) in first):
                spans[(a.kind, a.stage)].append(end - start)

    def mean(kind: ActionKind, stage: int | None = None) -> float | None:
        return _mean([x for (k, s), v in spans.items() if k == kind and stage in (None, s) for x in v])

    d2h, h2d = mean(K.OFFLOAD), mean(K.RELOAD)
    if d2h is None and h2d is None:  # only the second window: its copies set the per-unit times
        return {"d2h_time": mean(K.OFFLOAD_W) or 0.0, "h2d_time": mean(K.RELOAD_W) or 0.0}
    fractions = tuple(_implied_w_fraction([(mean(K.OFFLOAD_W, s), d2h or 0.0), (mean(K.RELOAD_W, s), h2d or 0.0)])
                      for s in range(num_stages))
    out: dict[str, Any] = {"d2h_time": d2h or 0.0, "h2d_time": h2d or 0.0}
    if any(x < 1.0 for x in fractions):
        out |= {"stage_w_fraction": fractions, "w_fraction": max(fractions)}
    return out


def _implied_w_fraction(pairs: list[tuple[float | None, float]]) -> float:
    """Σ measured second-window means / Σ the per-unit times of their directions, in [0, 1]; 1.0 where
    a stage has no second-window copy (or the first window's copies took no time)."""
    measured = sum(m for m, _ in pairs if m is not None)
    unit = sum(u for m, u in pairs if m is not None)
    return min(1.0, measured / unit) if unit > 0 else 1.0


def measured_spans(run: MeasuredRun, wall: dict[int, float] | None = None) -> dict[str, Any]:
    """The measured times that compare with a simulation, which starts every rank at 0 with its first
    action: per rank, ``measured_span_s`` from its own first action to its last (the trace's shared clock
    also holds the time before a rank's first action, and ranks start at different moments), its first
    action's time after the earliest rank's (``start_skew_s``), and ``measured_end_s`` on the shared
    clock (where Perfetto draws it). ``measured_step_s``: from the earliest rank's first action to the last
    action of any rank (the skew included: a rank that starts late holds its peers up), ``start_skew_s``
    the largest skew. ``wall``: per rank, the runtime's own step time (``otherData.wall_s``), whose
    part outside the actions (``outside_actions_s``: setup before the first action and after the last)
    no simulation has."""
    starts = [min((s for _, s, _ in row), default=0.0) for row in run.rows]
    ends = [max((e for _, _, e in row), default=0.0) for row in run.rows]
    first = min(starts, default=0.0)
    rows: list[dict[str, Any]] = []
    for r, (start, end) in enumerate(zip(starts, ends, strict=True)):
        row = {"rank": r, "measured_span_s": end - start, "start_skew_s": start - first, "measured_end_s": end}
        if wall is not None and r in wall:
            row |= {"wall_s": wall[r], "outside_actions_s": max(wall[r] - (end - start), 0.0)}
        rows.append(row)
    return {"measured_step_s": max(ends, default=0.0) - first, "start_skew_s": max(starts, default=0.0) - first,
            "per_rank": rows}


def _wall_s(data: Any) -> dict[int, float] | None:
    """Per rank, the step time the runtime wrote in ``otherData.wall_s`` (``write_chrome_trace``); None
    when the trace has none (the JSON Array Format, an older or hand-made trace)."""
    other = data.get("otherData") if isinstance(data, dict) else None
    walls = other.get("wall_s") if isinstance(other, dict) else None
    if not isinstance(walls, dict):
        return None
    out = {int(r): float(v) for r, v in walls.items()
           if isinstance(r, str) and r.isascii() and r.isdigit() and len(r) < 7
           and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0}
    return out or None


def compare_trace(data: Any, run: MeasuredRun | None = None) -> tuple[dict, Timeline, MeasuredRun]:
    """(merged Chrome trace, the simulation, the measured run) for a runtime trace (the JSON a run wrote);
    ``run``: ``load_measured(data)`` when the caller has it already."""
    run = run or load_measured(data)
    schedule = run.schedule
    timeline = simulate(schedule, measured_costs(run, schedule.num_stages))
    d = schedule.num_ranks
    sim = timeline_trace(timeline, scale=1e6, pid_base=SIM_PID_BASE, label="simulated", sort_base=d,
                         time_unit=SECONDS)  # measured durations: seconds
    other = {
        "kind": "pipeoffload trace compare: measured ranks first, then their simulation (seconds)",
        **measured_spans(run, _wall_s(data)), "simulated_makespan_s": timeline.makespan,
    }
    for row in other["per_rank"]:
        row["simulated_end_s"] = max(timeline.end[row["rank"]], default=0.0)
    merged = {"traceEvents": list(run.events) + sim["traceEvents"], "displayTimeUnit": "ms", "otherData": other}
    return merged, timeline, run


def measured_chart(run: MeasuredRun) -> ChartData:
    """The measured step as chart data: every compute and copy action at its measured time (seconds, on
    the trace's shared clock, as Perfetto shows it) and each rank's resident activation memory and the
    host memory of its offloaded activations in MiB from the trace's counters (empty curves where the
    trace has none)."""
    schedule = run.schedule
    boxes = [Box(rank, "copy" if a.kind in COPY_KINDS else "compute", a.kind.value, a.stage, a.microbatch,
                 schedule.placement.local_index(a.stage), start, end, str(a))
             for rank, row in enumerate(run.rows) for a, start, end in row
             if a.kind in COMPUTE_KINDS or a.kind in COPY_KINDS]
    ends = [end for row in run.rows for _, _, end in row] + [t for m in run.memory + run.host_memory for t, _ in m]
    makespan = max(ends, default=0.0)
    memory = run.memory or tuple(() for _ in run.rows)
    device = tuple(memory_curve(r, "device", memory[r], MIB, makespan) for r in range(len(run.rows)))
    host = (tuple(memory_curve(r, "host", run.host_memory[r], MIB, makespan) for r in range(len(run.rows)))
            if run.host_memory else tuple(Curve(r, "host", ((0.0, 0.0),), 0.0, 0.0) for r in range(len(run.rows))))
    present = {b.kind for b in boxes}
    peak = max((c.peak for c in device), default=0.0)
    title = (f"measured run: d={counted(schedule.num_ranks, 'rank')}, "
             f"m={counted(schedule.num_microbatches, 'microbatch', 'microbatches')}, "
             f"v={counted(schedule.stages_per_rank, 'stage per rank', 'stages per rank')}")
    host_peak = max((c.peak for c in host), default=0.0)
    summary = (f"last action ends at {makespan:.4g} s, device peak {peak:.4g} MiB"
               + (f", host peak {host_peak:.4g} MiB" if run.host_memory else "") if run.memory
               else f"last action ends at {makespan:.4g} s; the trace has no memory counter")
    return ChartData(title=title, summary=summary, time_unit="s", memory_unit="MiB", makespan=makespan,
                     ranks=schedule.num_ranks, stages_per_rank=max(schedule.stages_per_rank, 1),
                     copy_lanes=any(b.lane == "copy" for b in boxes),
                     kinds=tuple(k.value for k in KIND_ORDER if k.value in present),
                     boxes=tuple(boxes), device=device, host=host)
