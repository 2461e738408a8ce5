"""The run report: loss curves and per-rank activation memory of a training run, as one PNG and one
self-contained HTML page (the PNG embedded as a data URI, a table of key figures, the config).

Reads ``RUN_DIR/metrics.jsonl`` (one JSON object per logged optimizer step, see docs) and
``RUN_DIR/config.toml``; writes ``RUN_DIR/report.png`` and ``RUN_DIR/report.html``. Pure core: no
torch; matplotlib is imported when drawing.
"""
from __future__ import annotations

import base64
import html
import io
import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from pipeoffload.errors import ConfigError
from pipeoffload.fileio import why_not_a_file, write_atomic

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

MIB = 2**20


@dataclass
class RunMetrics:
    """The rows of ``metrics.jsonl``: training steps and evaluations."""

    rows: list[dict[str, Any]] = field(default_factory=list)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of the rows where ``key`` is a number."""
        steps: list[int] = []
        values: list[float] = []
        for row in self.rows:
            value = row.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                steps.append(int(row.get("step", len(steps) + 1)))
                values.append(float(value))
        return steps, values

    def per_rank_max(self, key: str) -> list[float]:
        """Per rank, the largest value of the per-rank list ``key`` over all rows (empty if absent)."""
        out: list[float] = []
        for row in self.rows:
            values = row.get(key)
            if not isinstance(values, list):
                continue
            for rank, value in enumerate(values):
                if not isinstance(value, (int, float)):
                    continue
                if rank >= len(out):
                    out.extend([0.0] * (rank + 1 - len(out)))
                out[rank] = max(out[rank], float(value))
        return out


PER_RANK_KEYS = ("peak_act_bytes", "sim_peak_act_bytes", "host_bytes", "reload_stall_s", "cuda_max_allocated")


def _layout_of(row: dict[str, Any]) -> tuple[int, ...] | str | None:
    """The layout a record measured: its ``layout`` (pp, dp, tp), or, in records written before it was
    logged, the number of ranks (the length of its per-rank lists); None for a record without either."""
    layout = row.get("layout")
    if isinstance(layout, dict):
        return tuple(int(layout.get(k, 0)) for k in ("pp", "dp", "tp"))
    for key in PER_RANK_KEYS:
        if isinstance(row.get(key), list):
            return f"{len(row[key])} rank{'' if len(row[key]) == 1 else 's'}"
    return None


def _layout_text(layout: tuple[int, ...] | str) -> str:
    if isinstance(layout, str):
        return layout
    pp, dp, tp = layout
    return f"pp {pp} x dp {dp} x tp {tp}"


def last_layout(metrics: RunMetrics) -> tuple[RunMetrics, str | None]:
    """The records of the run's last layout, and a line saying where it began when an earlier part of the
    run (before a resume on another layout) measured another: per-rank maxima over both would put one
    layout's rank r beside another's. Records name their layout (pp, dp, tp); older files without it are
    split by the number of ranks they measured."""
    start, layout, before = 0, None, None
    for i, row in enumerate(metrics.rows):
        this = _layout_of(row)
        if this is None:
            continue
        if layout is not None and this != layout:
            start, before = i, layout
        layout = this
    if before is None or layout is None:
        return metrics, None
    rows = metrics.rows[start:]
    step = rows[0].get("step", "?")
    note = (f"from step {step} on {_layout_text(layout)} (before: {_layout_text(before)}); the per-rank "
            f"figures are the last layout's, steps {step} to {rows[-1].get('step', '?')}")
    return RunMetrics(list(rows)), note


def layout_segments(metrics: RunMetrics) -> list[tuple[tuple[int, ...] | str | None, list[dict[str, Any]]]]:
    """The records split where the layout changes (a resume on another layout), in order: (layout, its
    records); one segment for a run on one layout. A record that names no layout stays in its segment.
    A resume on the same layout does not split (its first step, marked ``resumed``, is left out of the medians)."""
    out: list[tuple[tuple[int, ...] | str | None, list[dict[str, Any]]]] = []
    for row in metrics.rows:
        this = _layout_of(row)
        if not out or (this is not None and out[-1][0] is not None and this != out[-1][0]):
            out.append((this, [row]))
            continue
        if out[-1][0] is None and this is not None:
            out[-1] = (this, out[-1][1])
        out[-1][1].append(row)
    return out


class _Warmed(NamedTuple):
    """One key's series split by warm-up: the records after the first one and outside a resumed run's first
    step (marked ``resumed``), the resumed first steps so left out beyond the first record, and every record."""

    steps: list[int]
    values: list[float]
    left_out: list[int]
    all_steps: list[int]
    all_values: list[float]


def _warm(part: RunMetrics, key: str) -> _Warmed:
    resumed = {row.get("step") for row in part.rows if row.get("resumed") is True}
    steps, values = part.series(key)
    kept = [(s, v) for i, (s, v) in enumerate(zip(steps, values)) if i > 0 and s not in resumed]
    return _Warmed([s for s, _ in kept], [v for _, v in kept], [s for s in steps[1:] if s in resumed],
                   list(steps), list(values))


def _resumed_text(left: list[int]) -> str:
    """How a median names the resumed runs' first steps it left out."""
    if not left:
        return ""
    return f", and the resume's first step {left[0]}" if len(left) == 1 else \
        f", and the resumes' first steps {', '.join(map(str, left))}"


def _run_median(metrics: RunMetrics, key: str) -> tuple[str, float] | None:
    """(what it is, value): the median of ``key`` after step 1 (which pays for warm-up and shape inference) and
    without each resumed run's first step (a resume on the same layout warms up again); None without values."""
    w = _warm(metrics, key)
    if not w.values:  # no step but warm-ups: said so, not "after step 1" of a median that holds step 1
        if len(w.all_steps) == 1:
            return f"step {w.all_steps[0]} only, its warm-up included", w.all_values[0]
        return (f"median, steps {', '.join(map(str, w.all_steps))}: warm-ups only (the first step and the "
                "resumes' first)", statistics.median(w.all_values)) if w.all_values else None
    return f"median, after step 1{_resumed_text(w.left_out)}", statistics.median(w.values)


def _segment_median(part: RunMetrics, key: str, layout: tuple[int, ...] | str | None) -> tuple[str, float] | None:
    """(what it is, value): the median of ``key`` over one layout's records after its first one (the
    step that warmed up after the resume) and without a later resumed run's first step, or its only
    record's, said so; None without values."""
    w = _warm(part, key)
    if not w.all_steps:
        return None
    where = _layout_text(layout) if layout is not None else "no layout recorded"
    if not w.values:
        return f"{where}: step {w.all_steps[0]} only, its warm-up included", w.all_values[0]
    span = f"step {w.steps[0]}" if len(w.steps) == 1 else f"steps {w.steps[0]}-{w.steps[-1]}"
    return (f"median, {where}: {span}, its first step {w.all_steps[0]}{_resumed_text(w.left_out)} left out",
            statistics.median(w.values))


def load_metrics(path: Path) -> RunMetrics:
    """The records of ``metrics.jsonl``, read as a resume reads them (``metrics.parse_records``): an
    incomplete last line (a crashed run's) is dropped with a warning; any other bad line is refused."""
    from pipeoffload.train.metrics import parse_records

    if not path.is_file():
        raise ConfigError(f"{str(path)!r} {why_not_a_file(path)}; give the --out folder of a training run")
    rows = []
    for number, _, row in parse_records(path, then="then run report again"):
        _check_row(path, number, row)
        rows.append(row)
    if not rows:
        raise ConfigError(f"{path} has no metrics yet; run at least one training step first")
    return RunMetrics(rows)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_row(path: Path, number: int, row: dict[str, Any]) -> None:
    """A record's ``step`` and ``layout``, which the report reads as whole numbers, are whole numbers (as a
    resume refuses a bad ``step``, ``metrics.records_until``): one line naming the line, not a traceback."""
    layout = row.get("layout")
    if "step" in row and not _whole(row["step"]):
        what = f"step is {row['step']!r}"
    elif layout is not None and not (isinstance(layout, dict) and all(_whole(v) for v in layout.values())):
        what = f"layout is {layout!r}"
    else:
        return
    raise ConfigError(f"{path}:{number}: {what}, where the run writes whole numbers; fix or delete that "
                      "line (or the file), then run report again")


def load_config(path: Path) -> dict[str, Any]:
    """The resolved config (empty if the run has none)."""
    if not path.is_file():
        return {}
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            return {"note": "install tomli to read config.toml on python 3.10"}
    try:
        with path.open("rb") as fh:
            return dict(tomllib.load(fh))
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: invalid TOML ({err}); fix or delete it") from None


# ---- key figures ----------------------------------------------------------------------------------
def _mib(value: float) -> str:
    """MiB to two places; below 0.005 MiB, where that would read 0.00, the bytes themselves."""
    text = f"{value / MIB:.2f}"
    return f"{value:,.0f} bytes" if value > 0 and float(text) == 0 else f"{text} MiB"


def _seconds(value: float, places: int) -> str:
    """Seconds to ``places`` places, or two significant digits where those places would read 0 (a GPU's
    asynchronous reload, a tiny model's step): a figure the file holds as non-zero never shows as 0."""
    text = f"{value:.{places}f}"
    return f"{value:.2g} s" if value > 0 and float(text) == 0 else f"{text} s"


def key_figures(metrics: RunMetrics) -> list[tuple[str, str]]:
    """(name, value) rows for the table."""
    out: list[tuple[str, str]] = []
    steps, losses = metrics.series("loss")
    if steps:
        out.append(("steps", str(steps[-1])))
        out.append(("first / last train loss", f"{losses[0]:.4f} / {losses[-1]:.4f}"))
    vsteps, vlosses = metrics.series("val_loss")
    if vsteps:
        best = min(range(len(vlosses)), key=vlosses.__getitem__)
        out.append(("last validation loss", f"{vlosses[-1]:.4f} (step {vsteps[-1]})"))
        out.append(("best validation loss", f"{vlosses[best]:.4f} (step {vsteps[best]})"))
    segments = layout_segments(metrics)
    for key, name, shown in (("tokens_per_s", "tokens/s", lambda v: f"{v:,.0f}"),
                             ("step_s", "step time", lambda v: _seconds(v, 3))):
        if len(segments) == 1:
            row = _run_median(metrics, key)
            if row:
                out.append((f"{name} ({row[0]})", shown(row[1])))
            continue
        for layout, part in segments:  # a resume on another layout warms up again, and runs at its own pace
            row = _segment_median(RunMetrics(part), key, layout)
            if row:
                out.append((f"{name} ({row[0]})", shown(row[1])))
    per_rank, changed = last_layout(metrics)
    if changed:
        out.append(("layout changed (a resume on another layout)", changed))
    measured, simulated = per_rank.per_rank_max("peak_act_bytes"), per_rank.per_rank_max("sim_peak_act_bytes")
    for rank, value in enumerate(measured):
        text = _mib(value)
        if rank < len(simulated) and simulated[rank] > 0:
            text += f" (simulated {_mib(simulated[rank])}, measured/simulated {value / simulated[rank]:.3f})"
        out.append((f"peak activations, rank {rank}", text))
    host = per_rank.per_rank_max("host_bytes")
    if any(host):
        out.append(("peak host bytes (offloaded), max over ranks", _mib(max(host))))
    stall = per_rank.per_rank_max("reload_stall_s")
    if any(stall):
        out.append(("worst reload stall in one step, max over ranks", _seconds(max(stall), 4)))
    cuda = per_rank.per_rank_max("cuda_max_allocated")
    if cuda:
        out.append(("torch.cuda.max_memory_allocated, max over ranks", _mib(max(cuda))))
    return out


def summary_line(out: str, step: int, history: list[dict[str, Any]]) -> str:
    """The line ``pipeoffload train`` ends with: ``run OUT: step N, loss L, val loss V``. A loss or
    validation loss measured at another step than the one the line is about says its step (``val loss
    5.6922 (step 1)``: a run stopped between validations); with none measured in the run it is left
    out. ``history``: this invocation's records (the latest last); where they hold no validation loss
    (a resumed run that has not validated since), the run's earlier one is read from OUT/metrics.jsonl."""
    line = f"run {out}: step {step}"
    if history:
        last = history[-1]
        line += f", loss {last['loss']:.4f}" + ("" if last.get("step") == step else f" (step {last.get('step')})")
    vals = [h for h in history if _is_number(h.get("val_loss"))] or _earlier_vals(Path(out) / "metrics.jsonl", step)
    if vals:
        at = vals[-1].get("step")
        line += f", val loss {vals[-1]['val_loss']:.4f}" + ("" if at == step else f" (step {at})")
    return line


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _earlier_vals(path: Path, step: int) -> list[dict[str, Any]]:
    """The records of ``path`` up to ``step`` with a validation loss (none where it cannot be read)."""
    from pipeoffload.train.metrics import parse_records

    try:
        rows = [row for _, _, row in parse_records(path, quiet=True)] if path.is_file() else []
    except (ConfigError, OSError):
        return []
    return [r for r in rows if _is_number(r.get("val_loss")) and _is_number(r.get("step")) and r["step"] <= step]


# ---- the picture ----------------------------------------------------------------------------------
def report_figure(metrics: RunMetrics, title: str = "") -> Figure:
    """Loss curves (train and validation) beside per-rank peak activation memory, measured and simulated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (ax_loss, ax_mem) = plt.subplots(1, 2, figsize=(12, 4.2), constrained_layout=True)
    steps, losses = metrics.series("loss")
    ax_loss.plot(steps, losses, color="#4C72B0", lw=1.2, label="train")
    vsteps, vlosses = metrics.series("val_loss")
    if vsteps:
        ax_loss.plot(vsteps, vlosses, "o-", color="#DD8452", lw=1.5, ms=4, label="validation")
    ax_loss.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole: a 3-step run read 1.25, 1.5
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss")
    ax_loss.set_title("loss")
    ax_loss.grid(alpha=0.3)
    ax_loss.legend()

    per_rank, changed = last_layout(metrics)
    measured, simulated = per_rank.per_rank_max("peak_act_bytes"), per_rank.per_rank_max("sim_peak_act_bytes")
    ranks = max(len(measured), len(simulated))
    width = 0.38
    if measured:
        ax_mem.bar([r - width / 2 for r in range(len(measured))], [v / MIB for v in measured], width,
                   color="#4C72B0", label="measured (runtime)")
    if simulated:
        ax_mem.bar([r + width / 2 for r in range(len(simulated))], [v / MIB for v in simulated], width,
                   color="#8AB17D", label="simulated")
    ax_mem.set_xticks(range(ranks))
    ax_mem.set_xlabel("rank")
    ax_mem.set_ylabel("peak activation memory (MiB)")
    since = f" (from step {per_rank.rows[0].get('step', '?')}: the last layout)" if changed else ""
    ax_mem.set_title("peak activation memory per rank" + since)
    ax_mem.grid(axis="y", alpha=0.3)
    if ranks:  # head room above the tallest bar for the legend, which hid the tops of equal bars
        top = max([*measured, *simulated]) / MIB
        ax_mem.set_ylim(0, top * 1.3 if top > 0 else 1.0)
        ax_mem.legend(loc="upper center", ncols=2)
    else:
        ax_mem.text(0.5, 0.5, "no memory figures in metrics.jsonl", ha="center", va="center",
                    transform=ax_mem.transAxes)
    if title:
        fig.suptitle(title)
    return fig


def figure_png(fig: Figure) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


# ---- the page -------------------------------------------------------------------------------------
_STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 10px;text-align:left}
th{background:#f3f3f3}img{max-width:100%}code{font-size:90%}"""


def _table(rows: list[tuple[str, str]], header: tuple[str, str]) -> str:
    body = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f"<table><tr><th>{html.escape(header[0])}</th><th>{html.escape(header[1])}</th></tr>{body}</table>"


def report_html(title: str, png: bytes, figures: list[tuple[str, str]], config: dict[str, Any]) -> str:
    image = base64.b64encode(png).decode("ascii")
    config_rows = [(k, json.dumps(v) if not isinstance(v, str) else v) for k, v in _flat_rows(config)]
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
        f"<img alt='loss curves and peak activation memory per rank' src='data:image/png;base64,{image}'>"
        f"<h2>Key figures</h2>{_table(figures, ('figure', 'value'))}"
        f"<h2>Config</h2>{_table(config_rows, ('key', 'value')) if config_rows else '<p>no config.toml</p>'}"
        "</body></html>\n"
    )


def _flat_rows(config: dict[str, Any]) -> list[tuple[str, Any]]:
    """``section.key`` rows of a config with sections (flat keys of an older run as they are)."""
    rows: list[tuple[str, Any]] = []
    for k, v in config.items():
        rows += [(f"{k}.{k2}", v2) for k2, v2 in v.items()] if isinstance(v, dict) else [(str(k), v)]
    return rows


def write_report(run_dir: str | Path) -> tuple[Path, Path]:
    """Write ``report.png`` and ``report.html`` into ``run_dir``; returns their paths."""
    folder = Path(run_dir)
    if not folder.is_dir():
        raise ConfigError(f"run directory {str(folder)!r} does not exist; give the --out folder of a training run")
    metrics = load_metrics(folder / "metrics.jsonl")
    config = load_config(folder / "config.toml")
    schedule = config.get("schedule")
    if isinstance(schedule, dict):  # the section; an older run's flat key is the family itself
        schedule = schedule.get("family")
    title = f"pipeoffload run {folder.name}" + (f" ({schedule})" if schedule else "")
    png = figure_png(report_figure(metrics, title))
    png_path = write_atomic(folder / "report.png", png)
    html_path = write_atomic(folder / "report.html", report_html(title, png, key_figures(metrics), config))
    return png_path, html_path
