"""Matplotlib pictures of a timeline: a Gantt chart (a compute and a copy lane per rank) above one
small memory panel per rank (device solid, host dashed, shared axes, each rank's peak written beside it).

The layout is computed in inches, so the picture has no dead space at any size; the legend has a row
of its own above the chart and never covers data. matplotlib is imported inside the functions so the
CLI and the core stay quick to import.
"""
from __future__ import annotations

import io
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from pipeoffload.ir import ActionKind
from pipeoffload.simulator import Timeline
from pipeoffload.units import MEMORY_UNIT, TIME_UNIT
from pipeoffload.viz.chartdata import COLOURS, LABELS, ChartData, chart_data

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

K = ActionKind
__all__ = ["COLOURS", "LABELS", "timeline_figure", "figure_bytes", "shade"]

_WIDTH = 13.0  # inches
_LEFT, _RIGHT = 0.85, 1.25  # margins in inches: rank names left, peak annotations right
_COMPUTE_ROW, _COPY_ROW = 0.30, 0.16  # lane heights in inches (scaled down beyond 16 ranks)
_HOST_STYLE = (0, (3, 2))
_DEVICE_COLOUR, _HOST_COLOUR = "#1f4e79", "#b5651d"
_LABEL_PT = 6.0  # microbatch number font size
# Above this many boxes (d=32, m=128 of 1f1b has 8,192) single boxes are a barcode: each lane is drawn as
# a band whose shade is the share of each time slice it is busy, and the legend says so.
AGGREGATE_ABOVE = 6_000
_SLICES = 400  # time slices of a band
# A zero-length copy: an OFFLOAD_W whose bytes the host already holds (the activation's F -> I offload
# copied them), or any copy when k = 0; drawn as a tick so it does not vanish.
TICK_LABEL = "tick: copy taking no time (the host already holds the bytes, or k = 0)"
TIME_LABELS = {TIME_UNIT: "time (t = one rank's forward of one microbatch)", "s": "time (s)"}
COSTS_FILE_TIME_LABEL = "time (t = the costs file's unit; its times are per stage)"


def timeline_figure(timeline: Timeline, title: str | None = None, memory: bool = True,
                    time_unit: str = TIME_UNIT, xmax: float | None = None, ymax: float | None = None,
                    time_label: str | None = None) -> Figure:
    """The chart of ``timeline``; ``title`` replaces the schedule line (the numbers line stays);
    ``xmax`` fixes the time axis and ``ymax`` the device memory scale, so charts of several schedules
    compare at a glance (a peak of 1 is not drawn as high as a peak of 8); ``time_label`` replaces the
    time axis's label (default ``TIME_LABELS``: a costs file's t is not one rank's forward)."""
    return chart_figure(chart_data(timeline, title, time_unit), memory, xmax, ymax, time_label)


def chart_figure(data: ChartData, memory: bool = True, xmax: float | None = None,
                 ymax: float | None = None, time_label: str | None = None) -> Figure:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lanes = [(r, lane) for r in range(data.ranks) for lane in (("compute", "copy") if data.copy_lanes else ("compute",))]
    rows = _row_heights(data.ranks)
    gantt_h = sum(rows[lane] for _, lane in lanes)
    panel_h = 0.42 if data.ranks <= 8 else 0.34 if data.ranks <= 16 else 0.26
    mem_h = panel_h * data.ranks if memory else 0.0
    handles = _legend_handles(data, memory)
    columns, legend_h = _legend_layout(plt, handles)
    top, axis_h, gap, bottom = 0.55, 0.25, 0.25, 0.5
    height = top + legend_h + gantt_h + axis_h + (gap + mem_h if memory else 0.0) + bottom
    fig = plt.figure(figsize=(_WIDTH, height))
    frac_w = (_WIDTH - _LEFT - _RIGHT) / _WIDTH
    y = height - top - legend_h - gantt_h
    ax = fig.add_axes((_LEFT / _WIDTH, y / height, frac_w, gantt_h / height))
    span = max(xmax or 0.0, data.makespan)
    if aggregated(data):
        _bands(ax, data, lanes, span)
    else:
        _gantt(ax, data, lanes, (_WIDTH - _LEFT - _RIGHT) * 72, span)
    fig.text(0.5, 1 - 0.12 / height, data.title, ha="center", va="top", fontsize=11, weight="bold")
    fig.text(0.5, 1 - 0.34 / height, data.summary, ha="center", va="top", fontsize=9)
    _legend(fig, handles, columns, (height - top - legend_h / 2) / height)
    xlabel = time_label or TIME_LABELS.get(data.time_unit, f"time ({data.time_unit})")
    if memory:
        ax.tick_params(labelbottom=True)
        y -= axis_h + gap + mem_h
        axes = _memory_panels(fig, data, (_LEFT / _WIDTH, y / height, frac_w, mem_h / height), ax, ymax)
        axes[-1].set_xlabel(xlabel, fontsize=9)
    else:
        ax.set_xlabel(xlabel, fontsize=9)
    return fig


def _row_heights(ranks: int) -> dict[str, float]:
    """Lane heights in inches: full size up to 16 ranks, then smaller so 32 or 64 ranks stay on a page."""
    scale = 1.0 if ranks <= 16 else 0.7
    return {"compute": _COMPUTE_ROW * scale, "copy": _COPY_ROW * scale}


def _gantt(ax: Any, data: ChartData, lanes: list[tuple[int, str]], width_pt: float, xmax: float) -> None:
    # y from the top: rank 0 first; lane heights differ, so positions are cumulative.
    pos, cursor = _lane_positions(data, lanes)
    segments: dict[tuple[float, float, str], list[tuple[float, float]]] = defaultdict(list)
    ticks: dict[tuple[float, float, str], list[float]] = defaultdict(list)  # copies taking no time
    scale = width_pt / xmax if xmax > 0 else 0.0
    label_room = _LABEL_PT * 0.62
    for box in data.boxes:
        centre, h = pos[(box.rank, box.lane)]
        if box.lane == "copy":  # D2H in the upper half of the copy lane, H2D in the lower
            h = h / 2 * 0.9
            centre += -h / 2 if box.kind in (K.OFFLOAD.value, K.OFFLOAD_W.value) else h / 2
            colour = COLOURS[K(box.kind)]
        else:
            h *= 0.82
            colour = shade(COLOURS[K(box.kind)], box.shade, data.stages_per_rank)
        if box.lane == "copy" and box.end <= box.start:  # a zero-width bar would vanish: draw a tick
            ticks[(centre, h, colour)].append(box.start)
            continue
        segments[(centre, h, colour)].append((box.start, box.end - box.start))
        text = str(box.microbatch)
        if box.lane == "compute" and (box.end - box.start) * scale >= label_room * len(text) + 2:
            ax.text((box.start + box.end) / 2, centre, text, ha="center", va="center", fontsize=_LABEL_PT,
                    color="white" if box.shade == 0 else "#111111")
    for (centre, h, colour), spans in segments.items():
        ax.broken_barh(spans, (centre - h / 2, h), facecolors=colour, edgecolor="white", linewidth=0.3)
    for (centre, h, colour), times in ticks.items():
        ax.vlines(times, centre - h / 2, centre + h / 2, colors=colour, linewidth=1.0, label="_instant")
    _lane_axes(ax, pos, lanes, cursor, xmax)


def aggregated(data: ChartData) -> bool:
    """Whether the chart draws utilisation bands instead of single boxes."""
    return len(data.boxes) > AGGREGATE_ABOVE


def busy_shares(starts: Any, ends: Any, edges: Any) -> Any:
    """The share of each slice between consecutive ``edges`` that the intervals cover (0 to 1; copy
    lanes run two directions, so they can reach 2 and are clipped)."""
    import numpy as np

    covered = np.clip(edges[:, None] - starts[None, :], 0.0, (ends - starts)[None, :]).sum(axis=1)
    return np.clip(np.diff(covered) / np.diff(edges), 0.0, 1.0)


def _bands(ax: Any, data: ChartData, lanes: list[tuple[int, str]], xmax: float) -> None:
    import numpy as np
    from matplotlib.colors import LinearSegmentedColormap

    pos, cursor = _lane_positions(data, lanes)
    edges = np.linspace(0.0, xmax if xmax > 0 else 1.0, _SLICES + 1)
    spans: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    for box in data.boxes:
        if box.kind != K.WAIT.value:  # a wait holds the lane without computing: not busy
            spans[(box.rank, box.lane)].append((box.start, box.end))
    maps = {lane: LinearSegmentedColormap.from_list(lane, ["#ffffff", colour]) for lane, colour in _BAND_COLOURS.items()}
    for key in lanes:
        centre, h = pos[key]
        times = np.array(spans.get(key, []), dtype=float).reshape(-1, 2)
        share = busy_shares(times[:, 0], times[:, 1], edges)
        ax.imshow(share[None, :], extent=(edges[0], edges[-1], centre + h * 0.45, centre - h * 0.45), aspect="auto",
                  cmap=maps[key[1]], vmin=0.0, vmax=1.0, interpolation="nearest")
    _lane_axes(ax, pos, lanes, cursor, xmax)


_BAND_COLOURS = {"compute": COLOURS[K.F], "copy": COLOURS[K.OFFLOAD]}


def _lane_positions(data: ChartData, lanes: list[tuple[int, str]]) -> tuple[dict[tuple[int, str], tuple[float, float]], float]:
    """(centre, height) of each lane from the top, and the total height."""
    pos: dict[tuple[int, str], tuple[float, float]] = {}
    cursor = 0.0
    for rank, lane in lanes:
        h = _row_heights(data.ranks)[lane]
        pos[(rank, lane)] = (cursor + h / 2, h)
        cursor += h
    return pos, cursor


def _lane_axes(ax: Any, pos: dict[tuple[int, str], tuple[float, float]], lanes: list[tuple[int, str]],
               cursor: float, xmax: float) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.set_ylim(cursor, 0)
    ax.set_xlim(0, xmax if xmax > 0 else 1.0)
    ax.set_yticks([pos[key][0] for key in lanes])
    ax.set_yticklabels([f"rank {r}" if lane == "compute" else "copy" for r, lane in lanes], fontsize=7)
    for tick, (_, lane) in zip(ax.get_yticklabels(), lanes):
        if lane == "copy":
            tick.set_color("#777777")
            tick.set_fontsize(6)
    ax.tick_params(axis="y", length=0)
    ax.tick_params(axis="x", labelsize=7)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=12))
    ax.grid(axis="x", alpha=0.25, linewidth=0.5)
    ax.set_axisbelow(True)
    for spine in ("top", "right"):
        ax.spines[spine].set_visible(False)


def _memory_panels(fig: Any, data: ChartData, rect: tuple[float, float, float, float], gantt: Any,
                   ymax: float | None = None) -> list[Any]:
    """One panel per rank, stacked with no gaps, sharing the time axis and one memory scale (at least
    ``ymax``: the scale of every chart being compared)."""
    left, bottom, width, height = rect
    n = data.ranks
    top_device = max([c.peak for c in data.device] + [ymax or 0.0, 1e-9])
    top_host = max(c.peak for c in data.host)
    axes, host_axes = [], []
    for rank in range(n):
        ax = fig.add_axes((left, bottom + height * (n - 1 - rank) / n, width, height / n), sharex=gantt)
        device, host = data.device[rank], data.host[rank]
        times, levels = zip(*device.points)
        ax.fill_between(times, levels, step="post", color=_DEVICE_COLOUR, alpha=0.18, linewidth=0)
        ax.step(times, levels, where="post", color=_DEVICE_COLOUR, linewidth=0.9)
        ax.plot([device.peak_time], [device.peak], marker="v", markersize=3, color=_DEVICE_COLOUR)
        if top_host > 0:  # host memory on its own scale (shared by all ranks): it dwarfs the device's
            hx = ax.twinx()
            hx.set_ylim(0, top_host * 1.15)
            hx.set_yticks([])
            for spine in ("top", "right", "left", "bottom"):
                hx.spines[spine].set_visible(False)
            h_times, h_levels = zip(*host.points)
            hx.step(h_times, h_levels, where="post", color=_HOST_COLOUR, linewidth=0.9, linestyle=_HOST_STYLE)
            host_axes.append(hx)
        ax.set_ylim(0, top_device * 1.15)
        ax.set_yticks([0, top_device], ["", f"{top_device:.3g}"])  # 0 is obvious; labels would collide
        ax.tick_params(axis="y", labelsize=5.5, length=2, pad=1, colors=_DEVICE_COLOUR)
        ax.set_ylabel(f"rank {rank}", fontsize=7, rotation=0, ha="right", va="center", labelpad=14)
        note = f"peak {device.peak:.3g}" + (f"\nhost {host.peak:.3g}" if top_host > 0 else "")
        ax.text(1.005, 0.5, note, transform=ax.transAxes, ha="left", va="center", fontsize=6,
                color=_DEVICE_COLOUR, linespacing=1.0)
        ax.grid(axis="x", alpha=0.25, linewidth=0.5)
        ax.tick_params(axis="x", labelbottom=rank == n - 1, labelsize=7, length=2 if rank == n - 1 else 0)
        for spine in ("top", "right"):
            ax.spines[spine].set_visible(False)
        axes.append(ax)
    # The scale named is the top tick's (the highest peak), as the playground names it, not the headroom above it.
    scale = (f"; host dashed, own scale 0 to {top_host:.3g}" if top_host > 0 else "")
    axes[0].set_title(f"activation memory per rank, {MEMORY_UNIT} (device solid, shared scale 0 to "
                      f"{top_device:.3g}{scale})",
                      fontsize=8, loc="left", pad=3)
    return axes


def _legend_handles(data: ChartData, memory: bool) -> list[Any]:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    if aggregated(data):  # bands, not boxes: say what a shade means and why
        handles: list[Any] = [
            Patch(color=_BAND_COLOURS["compute"], label=f"compute: darker = busier share of each time slice "
                  f"({len(data.boxes):,} actions, too many to draw one by one)")]
        if data.copy_lanes:
            handles.append(Patch(color=_BAND_COLOURS["copy"], label="copy lane: share of each slice copying"))
    else:
        handles = [Patch(color=COLOURS[K(k)], label=LABELS[K(k)]) for k in data.kinds]
    if data.stages_per_rank > 1 and not aggregated(data):
        for local in range(1, data.stages_per_rank):
            handles.append(Patch(color=shade(COLOURS[K.F], local, data.stages_per_rank),
                                 label=f"lighter: rank's stage {local + 1} of {data.stages_per_rank}"))
    if any(b.lane == "copy" and b.end <= b.start for b in data.boxes):
        handles.append(Line2D([], [], color="#555555", marker="|", linestyle="none", markersize=8,
                              label=TICK_LABEL))
    if memory:
        handles.append(Line2D([], [], color=_DEVICE_COLOUR, label="device memory"))
        if any(c.peak > 0 for c in data.host):
            handles.append(Line2D([], [], color=_HOST_COLOUR, linestyle=_HOST_STYLE, label="host memory"))
    return handles


_LEGEND_STYLE = {"fontsize": 7.5, "frameon": False, "handlelength": 1.6, "columnspacing": 1.2}
_LEGEND_PAD = 0.12  # inches of the legend's row above and below its entries
# Hinted text is not as wide at every resolution (the same legend: 0.985 of the figure's width at 100
# dpi, 1.058 at 130, 1.094 at 72), so it is measured at the resolutions pictures are written at and below.
_FIT_DPIS = (72, 80, 90, 100, 110, 130, 150, 200)


def _legend_layout(plt: Any, handles: list[Any]) -> tuple[int, float]:
    """(columns, height in inches of the legend's row): the fewest rows whose legend is at most as wide
    as the figure, measured on a scratch figure of the chart's width (entries' widths differ: a row of
    8 of the longest ran past both edges)."""
    scratch = plt.figure(figsize=(_WIDTH, 2.0))
    try:
        for rows in range(1, len(handles) + 1):
            columns = -(-len(handles) // rows)
            width, height = _legend_extent(scratch, handles, columns)
            if width <= _WIDTH - 0.2 or columns == 1:
                return columns, max(height + _LEGEND_PAD, 0.25)
        return 1, 0.25  # no handles
    finally:
        plt.close(scratch)


def _legend_extent(scratch: Any, handles: list[Any], columns: int) -> tuple[float, float]:
    """The largest (width, height) in inches of the legend over ``_FIT_DPIS``."""
    legend = scratch.legend(handles=handles, ncol=columns, **_LEGEND_STYLE)
    sizes = []
    for dpi in _FIT_DPIS:
        scratch.set_dpi(dpi)
        box = legend.get_window_extent(scratch.canvas.get_renderer())
        sizes.append((box.width / dpi, box.height / dpi))
    legend.remove()
    return max(w for w, _ in sizes), max(h for _, h in sizes)


def _legend(fig: Any, handles: list[Any], columns: int, y: float) -> None:
    fig.legend(handles=handles, loc="center", bbox_to_anchor=(0.5, y), ncol=columns, **_LEGEND_STYLE)


def shade(colour: str, local_index: int, stages_per_rank: int) -> str:
    """A rank's later stages lighter: blend a '#rrggbb' colour towards white."""
    amount = 0.55 * local_index / max(stages_per_rank - 1, 1) if stages_per_rank > 1 else 0.0
    rgb = [int(colour[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * amount):02x}" for c in rgb)


def figure_bytes(fig: Figure, fmt: str = "png", dpi: int = 130) -> bytes:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format=fmt, dpi=dpi)
    plt.close(fig)
    return buffer.getvalue()
