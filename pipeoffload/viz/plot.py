"""Matplotlib pictures: a Gantt chart with an offload lane per rank, and memory curves.

matplotlib is imported inside the functions so the CLI and the core stay quick to import.
"""
from __future__ import annotations

import io
from collections import defaultdict
from typing import TYPE_CHECKING

from pipeoffload.ir import ActionKind
from pipeoffload.simulate import Timeline

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

K = ActionKind
COLOURS = {
    K.F: "#4C72B0", K.B: "#DD8452", K.I: "#2A9D8F", K.W: "#8AB17D", K.R: "#8172B3",
    K.OFFLOAD: "#C44E52", K.RELOAD: "#E9A3C9",
}
LABELS = {K.F: "F forward", K.B: "B backward", K.I: "I input grad", K.W: "W weight grad", K.R: "R recompute",
          K.OFFLOAD: "offload (D2H)", K.RELOAD: "reload (H2D)"}
_MAX_LABELLED_BLOCKS = 400  # beyond this, microbatch numbers in the boxes are unreadable anyway


def timeline_figure(timeline: Timeline, title: str | None = None, memory: bool = True) -> Figure:
    """Gantt chart (compute lane, and a copy lane when the schedule offloads) over memory curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    schedule = timeline.schedule
    d = schedule.num_ranks
    copies = any(a.kind in (K.OFFLOAD, K.RELOAD) for row in schedule for a in row)
    rows = [(rank, lane) for rank in range(d) for lane in (("compute", "copy") if copies else ("compute",))]
    gantt_height = 0.45 * len(rows) + 1.2
    fig = plt.figure(figsize=(12, gantt_height + (2.8 if memory else 0)), constrained_layout=True)
    grid = fig.add_gridspec(2 if memory else 1, 1, height_ratios=[gantt_height, 2.8] if memory else [1])
    ax = fig.add_subplot(grid[0])
    y_of = {row: len(rows) - 1 - i for i, row in enumerate(rows)}
    label_blocks = sum(1 for row in schedule for a in row if a.kind in COLOURS) <= _MAX_LABELLED_BLOCKS
    used = set()
    # One broken_barh call per (row, colour): thousands of single bars would take seconds to draw.
    segments: dict[tuple[int, float, str], list[tuple[float, float]]] = defaultdict(list)
    for rank in range(d):
        for action, start, end in timeline.events(rank):
            if action.kind not in COLOURS or end <= start:
                continue
            lane = "copy" if action.kind in (K.OFFLOAD, K.RELOAD) else "compute"
            y = y_of[(rank, lane)]
            shade = schedule.placement.local_index(action.stage) / max(schedule.stages_per_rank, 2)
            height = 0.8 if lane == "compute" else 0.5
            segments[(y, height, _lighter(COLOURS[action.kind], shade))].append((start, end - start))
            used.add(action.kind)
            if label_blocks and lane == "compute":
                ax.text((start + end) / 2, y, str(action.microbatch), ha="center", va="center",
                        fontsize=6, color="white")
    for (y, height, colour), spans in segments.items():
        ax.broken_barh(spans, (y - height / 2, height), facecolors=colour, edgecolor="white", linewidth=0.4)
    ax.set_yticks([y_of[r] for r in rows])
    ax.set_yticklabels([f"rank {r}" if lane == "compute" else "  copy" for r, lane in rows], fontsize=8)
    ax.set_xlim(0, timeline.makespan)
    ax.set_xlabel("time")
    ax.legend(handles=[Patch(color=COLOURS[k], label=LABELS[k]) for k in COLOURS if k in used],
              loc="upper center", bbox_to_anchor=(0.5, -0.12 if not memory else -0.18), ncol=7, fontsize=8,
              frameon=False)
    ax.set_title(f"{title}\n{_default_title(timeline)}" if title else _default_title(timeline), fontsize=10)
    if memory:
        _memory_axes(fig.add_subplot(grid[1], sharex=ax), timeline)
    return fig


def _memory_axes(ax, timeline: Timeline) -> None:  # type: ignore[no-untyped-def]
    import matplotlib.pyplot as plt

    cmap = plt.get_cmap("viridis")
    d = timeline.schedule.num_ranks
    for r in timeline.per_rank:
        settled = _settled(r.memory)
        times = [0.0] + [t for t, _ in settled] + [timeline.makespan]
        levels = [0.0] + [level for _, level in settled] + [settled[-1][1] if settled else 0.0]
        ax.step(times, levels, where="post", color=cmap(r.rank / max(d - 1, 1)), linewidth=1.2,
                label=f"rank {r.rank} (peak {r.peak_activation_units:g})")
    ax.set_ylabel("activation units\non device")
    ax.set_xlabel("time")
    ax.grid(alpha=0.3)
    if d <= 8:
        ax.legend(fontsize=7, ncol=4, loc="upper right")


def _settled(curve) -> list[tuple[float, float]]:  # type: ignore[no-untyped-def]
    """One point per instant: a free and an allocation at the same time are not a dip worth drawing."""
    out: list[tuple[float, float]] = []
    for t, level in curve:
        if out and out[-1][0] == t:
            out[-1] = (t, level)
        else:
            out.append((t, level))
    return out


def _lighter(colour: str, amount: float) -> str:
    """Blend a '#rrggbb' colour towards white: later stages of a rank are drawn lighter."""
    rgb = [int(colour[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * amount * 0.8):02x}" for c in rgb)


def _default_title(timeline: Timeline) -> str:
    s = timeline.schedule
    stall = f", stall {timeline.stall:g}" if timeline.stall else ""
    return (f"{s.name}: d={s.num_ranks}, m={s.num_microbatches}, v={s.stages_per_rank} — makespan "
            f"{timeline.makespan:g}, bubble {timeline.bubble_ratio:.1%}, peak {timeline.peak_activation_units:g} "
            f"activation units{stall}")


def figure_bytes(fig: Figure, fmt: str = "png", dpi: int = 130) -> bytes:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format=fmt, dpi=dpi)
    plt.close(fig)
    return buffer.getvalue()
