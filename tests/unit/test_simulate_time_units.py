"""``simulate --costs FILE``: every output names the cost file's time unit (seconds for measured
costs), not the CLI's ``t``."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import pytest

from pipeoffload.cli import main
from pipeoffload.costs import load_cost_file
from pipeoffload.errors import ConfigError

SECONDS = {"time_f": [0.01, 0.012], "time_i": 0.01, "time_w": 0.008, "p2p_time": 0.001}
BASE = ["simulate", "zb-h1", "-d", "2", "-m", "4"]


def _costs(tmp_path: Path, **extra: object) -> str:
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(SECONDS | extra))
    return str(path)


def test_text_and_json_name_seconds(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    costs = _costs(tmp_path, time_unit="s")
    assert main([*BASE, "--costs", costs]) == 0
    text = capsys.readouterr().out
    assert " s   bubble" in text and "busy(s)" in text and "stall(s)" in text
    assert "units: s: seconds" in text and "(t)" not in text and " t " not in text and "units: t" not in text
    assert main([*BASE, "--costs", costs, "--json"]) == 0
    units = json.loads(capsys.readouterr().out)["units"]
    assert units["time_unit"] == "s" and units["time"].startswith("s: seconds")


def test_profiler_files_are_seconds_and_hand_written_ones_stay_t(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert load_cost_file(_costs(tmp_path, device="cpu"))[1] == "s"  # Profile.save's files name their device
    assert load_cost_file(_costs(tmp_path))[1] == "t"
    assert load_cost_file(_costs(tmp_path, time_unit="t"))[1] == "t"
    assert main([*BASE, "--costs", _costs(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["units"]["time_unit"] == "t"
    with pytest.raises(ConfigError, match="time_unit 'ms'"):
        load_cost_file(_costs(tmp_path, time_unit="ms"))


def test_chart_report_and_trace_name_seconds(tmp_path: Path) -> None:
    plot, report, trace = tmp_path / "chart.svg", tmp_path / "report.html", tmp_path / "trace.json"
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text stays text in the SVG
        assert main([*BASE, "--costs", _costs(tmp_path, time_unit="s"), "--plot", str(plot), "--report", str(report),
                     "--trace", str(trace)]) == 0
    svg = plot.read_text()
    assert "time (s)" in svg and "one rank's forward" not in svg and " s, bubble" in svg
    page = report.read_text()
    assert "<th>makespan (s)</th>" in page and "<th>busy (s)</th>" in page and "Units: s: seconds" in page
    assert "(t)" not in page
    assert json.loads(trace.read_text())["otherData"]["time_unit"].startswith("s: seconds")


def test_default_costs_keep_t(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main([*BASE, "--report", str(tmp_path / "r.html")]) == 0
    assert "makespan 13 t " in capsys.readouterr().out
    assert "<th>makespan (t)</th>" in (tmp_path / "r.html").read_text()


def test_compare_names_seconds_and_refuses_mixed_units(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    costs, page = _costs(tmp_path, time_unit="s"), tmp_path / "compare.html"
    specs = [f"zb-h1 -d 2 -m 4 --costs {costs}", f"1f1b -d 2 -m 4 --costs {costs}"]
    assert main(["compare", *specs, "-o", str(page)]) == 0
    out = capsys.readouterr().out
    assert out.count(" s, bubble") == 2 and " t, " not in out
    assert "<th>makespan (s)</th>" in page.read_text()
    assert main(["compare", specs[0], "1f1b -d 2 -m 4", "-o", str(page)]) == 2
    assert "mix time units (s and t)" in capsys.readouterr().err
