"""What a timeline chart shows, as plain data: one box per timed action, one memory curve per rank.

Both the matplotlib pictures (``viz.plot``) and the playground's SVG front end (``web``) draw from
this, so what is drawn can be tested without looking at pixels. Memory is in rank units (see
``pipeoffload.units``); time in the cost model's unit.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

from pipeoffload.ir import COMPUTE_KINDS, COPY_KINDS, WAIT_KINDS, ActionKind
from pipeoffload.simulator import Timeline
from pipeoffload.units import MEMORY_UNIT, TIME_UNIT, counted, rank_units

K = ActionKind
# Order of the legend. Colours are colour-blind friendly, each pair at least 50 apart in RGB, and the two
# windows' copies of one direction (which share a half of the copy lane) differ in grey too; RELOAD_W
# was a second pink (#DA8BC3, 22 from RELOAD's) and is a khaki now (tests/unit/test_viz_legend_colours.py).
KIND_ORDER = (K.F, K.B, K.I, K.W, K.R, K.OFFLOAD, K.RELOAD, K.OFFLOAD_W, K.RELOAD_W, K.WAIT)
COLOURS = {
    K.F: "#4C72B0", K.B: "#DD8452", K.I: "#2A9D8F", K.W: "#8AB17D", K.R: "#8172B3",
    K.OFFLOAD: "#C44E52", K.RELOAD: "#E377C2", K.OFFLOAD_W: "#937860", K.RELOAD_W: "#CCB974",
    K.WAIT: "#CCCCCC",
}
LABELS = {K.F: "F forward", K.B: "B backward", K.I: "I input grad", K.W: "W weight grad", K.R: "R recompute",
          K.OFFLOAD: "offload D2H", K.RELOAD: "reload H2D",
          K.OFFLOAD_W: "offload D2H after I (W's part)", K.RELOAD_W: "reload H2D before W",
          K.WAIT: "wait for an offload"}


@dataclass(frozen=True)
class Box:
    """One action on a lane: ``lane`` is "compute" or "copy"; ``shade`` 0 for a rank's first stage."""

    rank: int
    lane: str
    kind: str
    stage: int
    microbatch: int
    shade: int
    start: float
    end: float
    action: str


@dataclass(frozen=True)
class Curve:
    """Memory of one rank over time, in rank units: (time, level) steps, level held until the next."""

    rank: int
    where: str  # "device" or "host"
    points: tuple[tuple[float, float], ...]
    peak: float
    peak_time: float


@dataclass(frozen=True)
class ChartData:
    title: str
    summary: str
    time_unit: str
    memory_unit: str
    makespan: float
    ranks: int
    stages_per_rank: int
    copy_lanes: bool
    kinds: tuple[str, ...]  # kinds present, in legend order
    boxes: tuple[Box, ...]
    device: tuple[Curve, ...]
    host: tuple[Curve, ...]

    def as_dict(self) -> dict:
        out = asdict(self)
        out["colours"] = {k.value: c for k, c in COLOURS.items()}
        out["labels"] = {k.value: name for k, name in LABELS.items()}
        return out


def chart_data(timeline: Timeline, title: str | None = None, time_unit: str = TIME_UNIT) -> ChartData:
    """Every timed compute and copy action once, at its simulated time (and each WAIT that held the
    compute lane, over the time it held it); every rank's memory curves."""
    schedule = timeline.schedule
    v = max(schedule.stages_per_rank, 1)
    boxes = []
    for rank in range(schedule.num_ranks):
        for action, start, end in timeline.events(rank):
            if action.kind not in COMPUTE_KINDS and action.kind not in COPY_KINDS and action.kind not in WAIT_KINDS:
                continue
            if action.kind in WAIT_KINDS and end <= start:  # a wait that held nothing: nothing to draw
                continue
            lane = "copy" if action.kind in COPY_KINDS else "compute"
            boxes.append(Box(rank, lane, action.kind.value, action.stage, action.microbatch,
                             schedule.placement.local_index(action.stage), start, end, str(action)))
    present = {b.kind for b in boxes}
    device = tuple(memory_curve(r.rank, "device", r.memory, v, timeline.makespan) for r in timeline.per_rank)
    host = tuple(memory_curve(r.rank, "host", r.host_memory, v, timeline.makespan) for r in timeline.per_rank)
    return ChartData(
        title=title or schedule_title(timeline), summary=summary_line(timeline, time_unit), time_unit=time_unit,
        memory_unit=MEMORY_UNIT, makespan=timeline.makespan, ranks=schedule.num_ranks, stages_per_rank=v,
        copy_lanes=any(b.lane == "copy" for b in boxes), kinds=tuple(k.value for k in KIND_ORDER if k.value in present),
        boxes=tuple(boxes), device=device, host=host,
    )


def memory_curve(rank: int, where: str, events: Iterable[tuple[float, float]], v: float, makespan: float) -> Curve:
    """Levels divided by ``v``, from 0 at time 0 to ``makespan``; each instant settled to its last level (a
    free and an allocation at the same time are no dip). An instant whose levels rise above both the
    level before it and its last one (host memory keeps its copies' order: an offload and a reload at
    one time are both on the host) shows as a spike: its highest level, then its last, at that time."""
    points: list[tuple[float, float]] = [(0.0, 0.0)]
    before, top = 0.0, 0.0  # the level before the current instant, and the highest within it
    for t, level in events:
        value = level / v
        if points[-1][0] == t:
            if points[-1][1] > value and points[-1][1] > before:
                top = max(top, points[-1][1])
            points[-1] = (t, value)
        else:
            _spike(points, before, top)
            before, top = points[-1][1], 0.0
            points.append((t, value))
    _spike(points, before, top)
    if points[-1][0] < makespan:
        points.append((makespan, points[-1][1]))
    peak_time, peak = max(points, key=lambda p: (p[1], -p[0]))
    return Curve(rank, where, tuple(points), peak, peak_time)


def _spike(points: list[tuple[float, float]], before: float, top: float) -> None:
    """Insert the instant's highest level ``top`` ahead of its last point where it rose above both."""
    t, last = points[-1]
    if top > last and top > before:
        points.insert(len(points) - 1, (t, top))


def schedule_title(timeline: Timeline) -> str:
    s = timeline.schedule
    return (f"{s.name}: d={counted(s.num_ranks, 'rank')}, m={counted(s.num_microbatches, 'microbatch', 'microbatches')}, "
            f"v={counted(s.stages_per_rank, 'stage per rank', 'stages per rank')}")


def summary_line(timeline: Timeline, time_unit: str = TIME_UNIT) -> str:
    """The headline numbers, each with its unit."""
    stall = (f", stall {timeline.max_rank_stall:.4g} {time_unit} on the worst rank ({timeline.stall:.4g} {time_unit} "
             "summed over ranks)" if timeline.stall else "")
    host = f", host peak {timeline.peak_host_rank_units:.3g}" if timeline.peak_host_units else ""
    return (f"makespan {timeline.makespan:.4g} {time_unit}, bubble {timeline.bubble_ratio:.1%}, "
            + (f"device peak {timeline.peak_rank_units:.3g}{host} {MEMORY_UNIT}" if host
               else f"device peak {rank_units(timeline.peak_rank_units, 3)}") + stall)
