"""``compare``'s text rows and page title say what each row is."""
from __future__ import annotations

import json
from pathlib import Path

from pipeoffload.cli import main


def test_a_row_whose_budget_was_not_met_says_so(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    page = tmp_path / "c.html"
    assert main(["compare", "1f1b --offload budget:1 --offload-ratio 2", "1f1b", "-o", str(page)]) == 0
    first, second = capsys.readouterr().out.splitlines()[:2]
    assert first.endswith("; offload budget 1 NOT met (planned peak 4)")
    assert "NOT met" not in second


def test_the_page_title_counts_one_schedule_in_the_singular(tmp_path: Path) -> None:
    page = tmp_path / "c.html"
    assert main(["compare", "1f1b", "-o", str(page)]) == 0
    text = page.read_text()
    assert "pipeoffload compare: 1 schedule" in text and "1 schedules" not in text


def test_a_costs_file_row_draws_its_per_stage_axis(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    costs = tmp_path / "c.json"
    costs.write_text(json.dumps({"time_f": 1, "time_i": 1, "time_w": 1}))
    from pipeoffload.viz import plot

    drawn: list[str | None] = []
    original = plot.timeline_figure

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        drawn.append(kwargs.get("time_label"))
        return original(*args, **kwargs)

    monkeypatch.setattr(plot, "timeline_figure", spy)
    assert main(["compare", f"1f1b --costs {costs}", "-o", str(tmp_path / "p.html")]) == 0
    assert drawn == [plot.COSTS_FILE_TIME_LABEL]
