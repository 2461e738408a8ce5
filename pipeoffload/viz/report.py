"""A self-contained HTML report of one or more simulated schedules: summary table and pictures."""
from __future__ import annotations

import base64
import html
from collections.abc import Sequence

from pipeoffload.simulate import Timeline
from pipeoffload.viz.plot import figure_bytes, timeline_figure

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}img{max-width:100%;margin:1em 0}
h2{margin-top:2em}.note{color:#666;font-size:90%}
"""


def _summary_row(t: Timeline) -> str:
    s = t.schedule
    cells = [s.name, s.num_ranks, s.num_microbatches, s.stages_per_rank, f"{t.makespan:g}", f"{t.bubble_ratio:.2%}",
             f"{t.peak_activation_units:g}", f"{t.peak_rank_units:g}", f"{t.peak_host_units:g}", f"{t.stall:g}"]
    return "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>"


def _rank_table(t: Timeline) -> str:
    head = "<tr><th>rank</th><th>busy</th><th>bubble</th><th>peak (act.)</th><th>peak (rank)</th>" \
           "<th>peak host</th><th>stall</th></tr>"
    rows = "".join(
        f"<tr><td>{r.rank}</td><td>{r.busy:g}</td><td>{r.bubble_ratio:.2%}</td><td>{r.peak_activation_units:g}</td>"
        f"<td>{r.peak_rank_units:g}</td><td>{r.peak_host_units:g}</td><td>{r.stall:g}</td></tr>"
        for r in t.per_rank
    )
    return f"<table>{head}{rows}</table>"


def html_report(timelines: Sequence[Timeline], title: str = "pipeoffload report", note: str = "",
                pictures: Sequence[bytes] | None = None) -> str:
    """The page; ``pictures`` are PNGs already drawn for the timelines (drawn here when omitted)."""
    head = "<tr><th>schedule</th><th>ranks</th><th>microbatches</th><th>stages/rank</th><th>makespan</th>" \
           "<th>bubble</th><th>peak (act.)</th><th>peak (rank)</th><th>peak host</th><th>stall</th></tr>"
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>",
             f"<p class='note'>{html.escape(note)}</p>" if note else "",
             "<table>" + head + "".join(_summary_row(t) for t in timelines) + "</table>"]
    for index, t in enumerate(timelines):
        raw = pictures[index] if pictures is not None else figure_bytes(timeline_figure(t))
        png = base64.b64encode(raw).decode()
        parts.append(f"<h2>{html.escape(t.schedule.name)}</h2><img alt='timeline' src='data:image/png;base64,{png}'>")
        parts.append(_rank_table(t))
    parts.append("<p class='note'>Memory in activation units: one microbatch's saved activations for one stage; "
                 "a rank unit is stages_per_rank of them.</p></body></html>")
    return "".join(parts)
