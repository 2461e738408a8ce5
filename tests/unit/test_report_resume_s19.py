"""A resume on the same layout is marked in ``metrics.jsonl`` (its first step's record says ``"resumed": true``),
and ``pipeoffload report`` leaves that warm-up step out of the throughput median, as it does a resume on
another layout's first step; before, nothing marked it and its slow step was in the median."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeoffload.cli import main
from pipeoffload.train.report import RunMetrics, key_figures

TINY = ["--layers", "2", "--hidden", "32", "--seq-len", "32", "--global-batch", "4", "--microbatches", "2",
        "--warmup", "1", "--no-progress", "--eval-every", "100"]
LAYOUT = {"pp": 1, "dp": 1, "tp": 1}


def test_a_resume_on_the_same_layout_marks_its_first_step(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    run = tmp_path / "run"
    assert main(["train", *TINY, "--steps", "4", "--stop-at", "2", "--out", str(run)]) == 0
    assert main(["train", "--resume", str(run)]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r.get("resumed", False) for r in rows] == [False, False, True, False]
    assert len({json.dumps(r["layout"]) for r in rows}) == 1


def _rows(tps: list[float], resumed: tuple[int, ...] = ()) -> list[dict]:
    return [{"step": s, "loss": 5.0, "tokens_per_s": t, "step_s": 100 / t, "layout": LAYOUT,
             **({"resumed": True} if s in resumed else {})} for s, t in enumerate(tps, start=1)]


def test_report_leaves_the_resumed_warm_up_out_of_the_median() -> None:
    # steps 1-6, a resume after step 3 on the same layout: step 4 (10 tokens/s) warmed up again
    figures = dict(key_figures(RunMetrics(_rows([5.0, 100.0, 110.0, 10.0, 120.0, 130.0], resumed=(4,)))))
    assert figures["tokens/s (median, after step 1, and the resume's first step 4)"] == "115"  # of 100, 110, 120, 130
    assert figures["step time (median, after step 1, and the resume's first step 4)"] == "0.871 s"
    unmarked = dict(key_figures(RunMetrics(_rows([5.0, 100.0, 110.0, 10.0, 120.0, 130.0]))))
    assert unmarked["tokens/s (median, after step 1)"] == "110"  # a file without the mark: as before


def test_a_resume_on_another_layout_and_then_on_the_same() -> None:
    rows = _rows([5.0, 100.0, 110.0, 10.0, 120.0, 130.0, 20.0, 140.0], resumed=(4, 7))
    for row in rows[3:]:
        row["layout"] = {"pp": 2, "dp": 1, "tp": 1}
    figures = dict(key_figures(RunMetrics(rows)))
    assert figures["tokens/s (median, pp 1 x dp 1 x tp 1: steps 2-3, its first step 1 left out)"] == "105"
    key = "tokens/s (median, pp 2 x dp 1 x tp 1: steps 5-8, its first step 4, and the resume's first step 7 left out)"
    assert figures[key] == "130", figures
