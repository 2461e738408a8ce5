"""Regenerate docs/gallery.md and its pictures: every registered family on the same small pipeline,
then the same families with full offload (copy lanes), then one large full-offload pipeline.

    .venv/bin/python docs/make_gallery.py                 # the charts and gallery.md
    .venv/bin/python docs/make_gallery.py --screenshots   # also docs/playground.png (Playwright + Chromium)

It also records what each picture draws (``drawn_facts``: its chart data, texts, legend entries and
colours) as a hash in docs/gallery/facts.json; tests/unit/test_viz_gallery.py recomputes them, so a change
to the simulator or the chart code that alters a picture fails there until the gallery is regenerated.
Pixels are not compared (fonts and antialiasing differ between machines): a change of line widths or
layout alone goes unnoticed.

Each family runs the same model on d = 4 ranks and m = 8 microbatches; a rank's layers cost
F = I = W = 1 time unit in total, split evenly over its stages (the project's per-rank convention),
so makespans and rank-unit memory compare directly across families.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pipeoffload import ConfigError, generate, lower, simulate
from pipeoffload.errors import FLAGS, in_words
from pipeoffload.fileio import write_atomic
from pipeoffload.schedules import schedule_specs
from pipeoffload.simulator import Timeline
from pipeoffload.units import MEMORY_UNIT, rank_costs, rank_units
from pipeoffload.viz.chartdata import chart_data
from pipeoffload.viz.plot import figure_bytes, timeline_figure

HERE = Path(__file__).parent
D, M, K_RATIO = 4, 8, 0.5
OFFLOADED = ("1f1b", "interleaved-1f1b", "zb-v", "group-interleaved")  # families drawn again with --offload all
LARGE = ("group-interleaved", 16, 64, 2)  # family, d, m, v of the at-scale picture
FACTS = "gallery/facts.json"


def run(name: str, d: int, m: int, v: int | None = None, offload: str = "none",
        shared_host_link: bool = False) -> Timeline:
    schedule = generate(name, d, m, v)
    costs = rank_costs(1, 1, 1, schedule.stages_per_rank, shared_host_link=shared_host_link).with_offload_ratio(
        K_RATIO if offload != "none" else 0.0)
    return simulate(lower(schedule, costs, offload=offload), costs)


def _rounded(value: Any) -> Any:
    """Floats to 9 significant digits, so the hash does not hang on the last bit of a sum."""
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    return value


def drawn_facts(timeline: Timeline) -> str:
    """A hash of what the picture of ``timeline`` shows: the chart data (every box and memory step),
    the figure's texts (title, summary, panel titles, axis labels, the memory scale's tick labels) and
    the legend's entries with their colours."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    fig = timeline_figure(timeline)
    try:
        legend = fig.legends[0]
        facts = {
            "data": asdict(chart_data(timeline)),
            "texts": [t.get_text() for t in fig.texts],
            "axes": [[ax.get_title(loc="left"), ax.get_xlabel(), ax.get_ylabel(),
                      [t.get_text() for t in ax.get_yticklabels()]] for ax in fig.axes],
            "legend": [[t.get_text(), to_hex(h.get_facecolor() if hasattr(h, "get_facecolor") else h.get_color())]
                       for t, h in zip(legend.get_texts(), legend.legend_handles)],
        }
    finally:
        plt.close(fig)
    text = json.dumps(_rounded(facts), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def draw(picture: str, timeline: Timeline, dpi: int, facts: list[dict], *run_args: object) -> None:
    """Write ``picture`` and record its facts with the ``run`` arguments that rebuild its timeline."""
    write_atomic(HERE / picture, figure_bytes(timeline_figure(timeline), dpi=dpi))
    facts.append({"picture": picture, "run": list(run_args), "facts": drawn_facts(timeline)})


def row(name: str, t: Timeline, picture: str, offload: str = "none") -> str:
    v = t.schedule.stages_per_rank
    host = f"{t.peak_host_units / v:.3g}" if t.peak_host_units else "0"
    command = f"pipeoffload simulate {name} -d {t.schedule.num_ranks} -m {t.schedule.num_microbatches}" + (
        f" --offload {offload} --offload-ratio {K_RATIO}" if offload != "none" else "")
    return (f"| `{name}` | {offload} | {v} | {t.makespan:.4g} | {t.bubble_ratio:.1%} | {t.peak_rank_units:.3g} | "
            f"{host} | {t.stall:.3g} | [png]({picture}) | `{command}` |")


def at_scale(t: Timeline) -> str:
    """The at-scale picture's numbers as gallery.md states them, each amount with its unit in the right number."""
    v = t.schedule.stages_per_rank
    return (f"makespan {t.makespan:.4g} t, bubble {t.bubble_ratio:.1%}, device peak {rank_units(t.peak_rank_units, 3)},\n"
            f"host peak {rank_units(t.peak_host_units / v, 3)}")


def main(screenshots: bool = False) -> None:
    head = (f"| family | offload | v | makespan (t) | bubble | device peak ({MEMORY_UNIT}) | host peak ({MEMORY_UNIT}) "
            "| stall (t) | picture | command |\n|---|---|---|---|---|---|---|---|---|---|")
    rows, sections, offload_rows, offload_sections = [head], [], [head], []
    facts: list[dict] = []
    for spec in schedule_specs():
        try:
            timeline = run(spec.name, D, M)
        except ConfigError as err:
            rows.append(f"| `{spec.name}` | – | – | – | – | – | – | – | not drawn: {err} | |")
            continue
        picture = f"gallery/{spec.name}.png"
        draw(picture, timeline, 90, facts, spec.name, D, M)
        rows.append(row(spec.name, timeline, picture))
        sections.append(f"### `{spec.name}`\n\n{in_words(spec.summary, FLAGS)}\n\n![{spec.name}]({picture})\n")
        if spec.name in OFFLOADED:
            offloaded = run(spec.name, D, M, offload="all")
            picture = f"gallery/{spec.name}_offload-all_k{K_RATIO}.png"
            draw(picture, offloaded, 90, facts, spec.name, D, M, None, "all")
            offload_rows.append(row(spec.name, offloaded, picture, "all"))
            offload_sections.append(f"### `{spec.name}` with `--offload all`\n\n![{spec.name} offload all]({picture})\n")
    name, d, m, v = LARGE
    large = run(name, d, m, v, offload="all")
    large_picture = f"gallery/{name}_d{d}_m{m}_v{v}_offload-all_k{K_RATIO}.png"
    draw(large_picture, large, 80, facts, name, d, m, v, "all")
    # docs/offload.md's picture of WAITs: two ranks per host link
    draw(f"gallery/wait_1f1b_shared_k{K_RATIO}.png", run("1f1b", D, M, None, "all", True), 110, facts,
         "1f1b", D, M, None, "all", True)
    write_atomic(HERE / FACTS, json.dumps(facts, indent=1) + "\n")
    if screenshots:
        playground_screenshot(HERE / "playground.png")
    text = f"""# Schedule gallery

Generated by `docs/make_gallery.py`. Every registered family on d = {D} ranks and m = {M} microbatches with
default options. Units (see [decisions](decisions.md#units)): a rank's layers cost F = I = W = 1 time unit
**t** in total, split evenly over its stages, so numbers compare across families; memory is in
**{MEMORY_UNIT}** (one microbatch's saved activations for all of a rank's layers; plain 1F1B peaks at d).

How to read a chart: one row per rank (rank 0 on top); a box is one action, its colour the kind
(legend above the chart) and its number the microbatch when the box is wide enough; a rank's later stages
are drawn lighter. With offload each rank gets a thin **copy** lane: device-to-host copies (offload) in
its upper half, host-to-device copies (reload) in its lower half. Below, one small memory panel per rank:
device memory solid on a scale shared by all ranks, host memory dashed on its own shared scale, each
rank's peaks written at the right. Every chart here comes from `pipeoffload simulate NAME --plot FILE`;
`pipeoffload compare` puts several on one page and `pipeoffload playground` ([playground](playground.md))
draws them as you change the numbers.

## Without offload

{chr(10).join(rows)}

## With full offload (k = {K_RATIO}): the copy lanes

`--offload all --offload-ratio {K_RATIO}`: every activation is copied to the host after its forward and back
before its backward; with k = {K_RATIO} (copy time = half of F+I+W) the copies hide behind compute, so the
makespan does not change while the device peak drops.

{chr(10).join(offload_rows)}

## At scale: d = {d}, m = {m}, full offload

`pipeoffload simulate {name} -d {d} -m {m} -v {v} --offload all --offload-ratio {K_RATIO} --plot chart.png`:
{at_scale(large)}. Warm-up, the steady state, cool-down and the copy lanes
stay visible; the memory panels show each rank's device memory oscillating while host memory builds up
during warm-up and drains during cool-down.

![{name} d={d} m={m} full offload]({large_picture})

## Each family

{chr(10).join(sections)}
## Each offloaded family

{chr(10).join(offload_sections)}"""
    write_atomic(HERE / "gallery.md", text)
    print(f"wrote {HERE / 'gallery.md'}: {len(sections)} families, {len(offload_sections)} with offload, 1 at scale")


def playground_screenshot(path: Path) -> None:
    """The playground at d=8, m=32, group-interleaved with full offload, in headless Chromium."""
    from playwright.sync_api import sync_playwright

    from pipeoffload.web.server import make_server

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("--screenshots needs a system Chromium (apt-get install chromium)")
    server = make_server(0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"http://127.0.0.1:{server.server_address[1]}/")
            page.wait_for_selector("#chart svg .box")
            page.fill("[name=group_size]", "4")
            page.fill("[name=offload]", "all")
            page.dispatch_event("[name=offload]", "change")
            # a locator, not wait_for_function: the page's Content-Security-Policy forbids evaluating strings
            page.locator("#command", has_text="--offload all").wait_for()
            page.wait_for_timeout(300)
            write_atomic(path, page.screenshot(full_page=True))
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
    print(f"wrote {path}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--screenshots", action="store_true", help="also screenshot the playground (needs Chromium)")
    main(parser.parse_args().screenshots)
