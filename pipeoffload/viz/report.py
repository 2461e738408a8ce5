"""A self-contained HTML report of one or more simulated schedules: one table of their numbers, each
row labelled by its schedule and every non-default option (and the command that produced it), then
each chart on the same time axis. No script, no network: pictures are embedded as data URIs."""
from __future__ import annotations

import base64
import html
from collections.abc import Sequence

from pipeoffload.errors import FLAGS, ConfigError
from pipeoffload.ir import ActionKind
from pipeoffload.simulator import Timeline
from pipeoffload.units import MEMORY_UNIT, MEMORY_UNIT_HELP, TIME_UNIT, time_unit_help
from pipeoffload.viz.plot import figure_bytes, timeline_figure

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:14px}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}
th{background:#f3f3f3}td.label,th.label{text-align:left}code{font-size:12px;color:#333}
img{max-width:100%;margin:.5em 0}h2{margin-top:2em;font-size:1.15em}.note{color:#555;font-size:90%}
details{margin:.5em 0}
"""


def timeline_label(timeline: Timeline) -> str:
    """A label from the timeline alone: schedule, sizes and what the memory passes added."""
    s = timeline.schedule
    offloaded = sum(1 for row in s.actions for a in row if a.kind == ActionKind.OFFLOAD)
    recomputed = sum(1 for row in s.actions for a in row if a.kind == ActionKind.R)
    extra = (f", {offloaded} offloaded" if offloaded else "") + (f", {recomputed} recomputed" if recomputed else "")
    return f"{s.name} d={s.num_ranks} m={s.num_microbatches} v={s.stages_per_rank}{extra}"


def _distinct(labels: list[str]) -> list[str]:
    """Number repeated labels ("... (2nd of 2)") so no two rows of a table read the same."""
    totals = {label: labels.count(label) for label in labels}
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if totals[label] == 1 else f"{label} (#{seen[label]} of {totals[label]})")
    return out


def _cell(value: object, cls: str = "") -> str:
    attr = f" class='{cls}'" if cls else ""
    return f"<td{attr}>{html.escape(str(value))}</td>"


def _summary_row(index: int, label: str, command: str, t: Timeline) -> str:
    offloaded = sum(1 for row in t.schedule.actions for a in row if a.kind == ActionKind.OFFLOAD)
    recomputed = sum(1 for row in t.schedule.actions for a in row if a.kind == ActionKind.R)
    cells = [_cell(f"{index}. {label}", "label"),
             f"<td class='label'><code>{html.escape(command)}</code></td>" if command else _cell("", "label"),
             _cell(f"{t.makespan:.4g}"), _cell(f"{t.bubble_ratio:.2%}"), _cell(f"{t.peak_rank_units:.3g}"),
             _cell(f"{t.peak_host_rank_units:.3g}"), _cell(f"{t.max_rank_stall:.3g}"), _cell(f"{t.stall:.3g}"),
             _cell(offloaded), _cell(recomputed)]
    return f"<tr data-row='{index}'>" + "".join(cells) + "</tr>"


def _rank_table(t: Timeline, time_unit: str) -> str:
    v = max(t.schedule.stages_per_rank, 1)
    head = (f"<tr><th>rank</th><th>busy ({time_unit})</th><th>bubble</th><th>device peak ({MEMORY_UNIT})</th>"
            f"<th>host peak ({MEMORY_UNIT})</th><th>stall ({time_unit})</th></tr>")
    rows = "".join(
        f"<tr><td>{r.rank}</td><td>{r.busy:.4g}</td><td>{r.bubble_ratio:.2%}</td><td>{r.peak_rank_units:.3g}</td>"
        f"<td>{r.peak_host_units / v:.3g}</td><td>{r.stall:.3g}</td></tr>"
        for r in t.per_rank
    )
    return f"<details><summary>per rank</summary><table>{head}{rows}</table></details>"


def html_report(timelines: Sequence[Timeline], title: str = "pipeoffload report", note: str = "",
                pictures: Sequence[bytes] | None = None, labels: Sequence[str] | None = None,
                commands: Sequence[str] | None = None, time_unit: str = TIME_UNIT, time_help: str | None = None) -> str:
    """The page. ``labels`` name the rows (default: ``timeline_label``), ``commands`` are shown verbatim;
    ``pictures`` are PNGs already drawn (drawn here, on one shared time axis, when omitted); times are
    labelled ``time_unit`` (``t``, or ``s`` for seconds), which ``time_help`` explains (default
    ``time_unit_help(time_unit, FLAGS)``: the page is what the commands write, in their flags' words)."""
    for name, given in (("pictures", pictures), ("labels", labels), ("commands", commands)):
        if given is not None and len(given) != len(timelines):
            raise ConfigError(f"html_report: {len(given)} {name} for {len(timelines)} timelines; give one per "
                              f"timeline, or leave {name} out")
    labels = _distinct(list(labels) if labels is not None else [timeline_label(t) for t in timelines])
    commands = list(commands) if commands is not None else [""] * len(timelines)
    xmax = max((t.makespan for t in timelines), default=0.0)
    head = ("<tr><th class='label'>schedule and options</th><th class='label'>command</th>"
            f"<th>makespan ({time_unit})</th><th>bubble</th><th>device peak ({MEMORY_UNIT})</th>"
            f"<th>host peak ({MEMORY_UNIT})</th><th>stall, worst rank ({time_unit})</th>"
            f"<th>stall summed over ranks ({time_unit})</th><th>offloaded</th><th>recomputed</th></tr>")
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>",
             f"<p class='note'>{html.escape(note)}</p>" if note else "",
             "<table id='summary'>" + head
             + "".join(_summary_row(i + 1, labels[i], commands[i], t) for i, t in enumerate(timelines)) + "</table>",
             f"<p class='note'>Units: {html.escape(time_help or time_unit_help(time_unit, FLAGS))}; "
             f"{html.escape(MEMORY_UNIT_HELP)}. Peaks are the worst rank's; stall is the time a rank's compute "
             "waited for its reloads, given for the worst rank and summed over ranks; "
             "offloaded and recomputed count activations (stage, microbatch). "
             "Charts share one time axis.</p>"]
    for index, t in enumerate(timelines):
        raw = pictures[index] if pictures is not None else figure_bytes(timeline_figure(t, xmax=xmax, time_unit=time_unit), dpi=100)
        png = base64.b64encode(raw).decode()
        parts.append(f"<h2 id='row-{index + 1}'>{index + 1}. {html.escape(labels[index])}</h2>")
        if commands[index]:
            parts.append(f"<p><code>{html.escape(commands[index])}</code></p>")
        parts.append(f"<img alt='timeline and memory of {html.escape(labels[index])}' "
                     f"src='data:image/png;base64,{png}'>")
        parts.append(_rank_table(t, time_unit))
    parts.append("</body></html>")
    return "".join(parts)
