"""Probe C's misleading texts (report sections 3.1, 3.2, 3.5-3.8 and its cosmetics): what a costs
file's fields mean, which stall a table shows, what a legend tick is, what the offload summary counts,
how ``simulate --report`` labels its row."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pipeoffload.cli import main
from pipeoffload.service import SimulateRequest, simulate

GI = ["group-interleaved", "-d", "8", "-m", "32", "-g", "4"]


def _costs(tmp_path: Path, **fields: object) -> str:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(fields or {"time_f": 1, "time_i": 1, "time_w": 1}))
    return str(path)


def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return " ".join(capsys.readouterr().out.split())


# ---- 3.1: a costs file's times are per stage; cost flags beside it are refused ----------------------
def test_costs_help_says_its_times_are_per_stage_and_not_that_it_replaces_the_flags(capsys) -> None:  # type: ignore[no-untyped-def]
    text = _help(capsys, "simulate")
    assert "replaces --time-f" not in text
    assert "per stage" in text and "cannot be combined" in text


@pytest.mark.parametrize("flag", [["--time-f", "5"], ["--time-f", "1"], ["--time-w", "0"], ["--p2p-time", "3"]])
def test_cost_flags_beside_a_costs_file_are_refused_in_one_line(tmp_path, capsys, flag) -> None:  # type: ignore[no-untyped-def]
    assert main(["simulate", *GI, "--costs", _costs(tmp_path), *flag]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and flag[0] in err and "--costs" in err


def test_cost_flags_beside_a_costs_file_are_refused_inside_compare(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "c.html"
    assert main(["compare", f"1f1b --costs {_costs(tmp_path)} --time-f 5", "-o", str(out)]) == 2
    assert "--time-f" in capsys.readouterr().err and not out.exists()


def test_a_request_with_a_costs_file_and_other_times_is_refused(tmp_path) -> None:
    from pipeoffload.errors import ConfigError

    with pytest.raises(ConfigError, match="time_f"):
        SimulateRequest("1f1b", costs_file=_costs(tmp_path), time_f=2.0)


def test_the_units_note_of_a_costs_file_run_does_not_cite_the_time_f_flag(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["simulate", *GI, "--costs", _costs(tmp_path), "--json"]) == 0
    units = json.loads(capsys.readouterr().out)["units"]
    assert "--time-f 1" not in units["time"] and "per stage" in units["time"]
    assert main(["simulate", *GI, "--costs", _costs(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "--time-f 1" not in out and "per stage" in out.splitlines()[-1]
    assert main(["simulate", *GI, "--json"]) == 0  # without a file the flag's note stays
    assert "--time-f 1" in json.loads(capsys.readouterr().out)["units"]["time"]


def test_the_headline_gives_a_costs_file_k(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["simulate", *GI, "--costs", _costs(tmp_path)]) == 0
    assert "offload_ratio k=0 (from the costs file)" in capsys.readouterr().out.splitlines()[0]
    copies = _costs(tmp_path, time_f=1, time_i=1, time_w=1, d2h_time=0.75, h2d_time=0.75)
    assert main(["simulate", *GI, "--costs", copies, "--offload", "all"]) == 0
    assert "offload_ratio k=0.5 (from the costs file)" in capsys.readouterr().out.splitlines()[0]
    result = simulate(SimulateRequest("1f1b", costs_file=copies, offload="all"))
    assert "copy times from the costs file (k=0.5)" in result.title()


# ---- 3.2: the stall in tables and subtitles is labelled, and the worst rank's is shown ----------------
_STALLED = SimulateRequest("zb-v", offload="all", offload_ratio=0.7, plan_ratio=0.3)


def test_the_html_table_labels_the_summed_stall_and_shows_the_worst_ranks() -> None:
    from pipeoffload.viz.report import html_report

    t = simulate(_STALLED).timeline
    assert t.stall > t.max_rank_stall > 0
    page = html_report([t], pictures=[b""])
    head = page.split("<table id='summary'>")[1].split("</tr>")[0]
    assert "stall summed over ranks (t)" in head and "stall, worst rank (t)" in head
    row = re.findall(r"<td>([^<]*)</td>", page.split("data-row='1'>")[1].split("</tr>")[0])
    assert f"{t.stall:.3g}" in row and f"{t.max_rank_stall:.3g}" in row


def test_the_chart_subtitle_names_which_stall_it_gives() -> None:
    from pipeoffload.viz.chartdata import summary_line

    t = simulate(_STALLED).timeline
    line = summary_line(t)
    assert f"stall {t.max_rank_stall:.4g} t on the worst rank ({t.stall:.4g} t summed over ranks)" in line


# ---- 3.5: show --lowered --------------------------------------------------------------------------
def test_show_lowered_help_promises_no_copy_actions(capsys) -> None:  # type: ignore[no-untyped-def]
    text = _help(capsys, "show")
    assert "(and copy)" not in text and "no OFFLOAD/RELOAD" in text


# ---- 3.6: the legend's tick -----------------------------------------------------------------------
def test_the_tick_legend_on_a_k_half_chart_does_not_say_k_is_0() -> None:
    from pipeoffload.viz.plot import TICK_LABEL, timeline_figure

    result = simulate(SimulateRequest("zb-v", ranks=4, microbatches=8, offload="all", offload_ratio=0.5))
    texts = [t.get_text() for legend in timeline_figure(result.timeline).legends for t in legend.get_texts()]
    assert "tick: instant copy (k = 0)" not in texts  # the ticks there are OFFLOAD_W: no bytes left to copy
    assert TICK_LABEL in texts and "host already holds" in TICK_LABEL


# ---- 3.7: what the offload summary counts ------------------------------------------------------------
def test_the_summary_says_the_unhidden_activations_stayed_on_the_device(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["simulate", "zb-v", "-d", "4", "-m", "8", "--offload", "all", "--offload-ratio", "2"]) == 0
    out = capsys.readouterr().out
    assert "could not be hidden" not in out
    assert re.search(r"offload all: \d+ activations offloaded; kept on the device: \d+ that the copy lane could "
                     r"not hide, \d+ whose window is too short to leave the device"
                     r"(, \d+ until their I \(offloaded from I to W instead\))?;", out)


# ---- 3.8: simulate --report labels its row as compare does ------------------------------------------
def test_simulate_report_labels_its_row_with_every_option(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    page = tmp_path / "gi.html"
    assert main(["simulate", "group-interleaved", "-d", "4", "-m", "8", "-g", "2", "--offload", "all",
                 "--offload-ratio", "0.5", "--report", str(page)]) == 0
    text = page.read_text()
    label = "group-interleaved d=4 m=8 v=2 · group-size 2 · offload all · offload-ratio 0.5"
    assert f"1. {label}</td>" in text and f"<h2 id='row-1'>1. {label}</h2>" in text


# ---- cosmetics --------------------------------------------------------------------------------------
def test_a_negative_zero_offload_ratio_is_zero(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["simulate", "zb-v", "--offload", "all", "--offload-ratio", "-0"]) == 0
    assert "k=-0" not in capsys.readouterr().out
    assert main(["simulate", "zb-v", "--offload", "all", "--offload-ratio", "-0", "--json"]) == 0
    text = capsys.readouterr().out
    assert '"offload_ratio": 0.0' in text and "-0.0" not in text
    assert SimulateRequest("zb-v", offload="all", plan_ratio=-0.0).command()[-1] == "0.0"


def test_a_whole_number_option_is_labelled_as_typed() -> None:
    result = simulate(SimulateRequest("zb-v", offload="all", offload_ratio=5.0))
    assert result.label().endswith("offload-ratio 5")


def test_a_budget_not_met_is_in_the_runs_own_chart_title() -> None:
    missed = simulate(SimulateRequest("1f1b", ranks=4, microbatches=8, offload="budget:1", offload_ratio=2))
    met = simulate(SimulateRequest("1f1b", ranks=4, microbatches=8, offload="budget:4", offload_ratio=0.5))
    assert missed.report.budget_met is False and met.report.budget_met is True
    assert f"budget 1 NOT met (planned peak {missed.report.peak_after:g})" in missed.title()
    assert "budget" not in met.title()


def test_the_chart_of_a_costs_file_run_does_not_call_t_one_ranks_forward(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import matplotlib

    plot = tmp_path / "c.svg"
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text stays text in the SVG
        assert main(["simulate", *GI, "--costs", _costs(tmp_path), "--plot", str(plot)]) == 0
    svg = plot.read_text()
    assert "one rank's forward" not in svg and "the costs file's unit; its times are per stage" in svg
