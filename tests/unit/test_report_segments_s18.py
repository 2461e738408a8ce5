"""``pipeoffload report`` after a resume on another layout: the throughput of each layout, each without
its first step (the resumed run warms up again), never one median over both layouts."""
import json
from pathlib import Path

from pipeoffload.cli import main
from pipeoffload.train.report import RunMetrics, key_figures

PP2 = {"pp": 2, "dp": 1, "tp": 1}
DP2 = {"pp": 1, "dp": 2, "tp": 1}


def _rows(steps: range, layout: dict[str, int], tps: list[float], step_s: list[float]) -> list[dict]:
    return [{"step": s, "loss": 5.0, "tokens_per_s": t, "step_s": d, "layout": layout, "peak_act_bytes": [1, 1]}
            for s, t, d in zip(steps, tps, step_s, strict=True)]


# pp 2 for steps 1-4 (step 1 a slow warm-up), then a resume on dp 2 for steps 5-8 (step 5 its warm-up)
RECORDS = (_rows(range(1, 5), PP2, [10.0, 100.0, 110.0, 120.0], [8.0, 0.8, 0.7, 0.6])
           + _rows(range(5, 9), DP2, [20.0, 300.0, 310.0, 320.0], [4.0, 0.3, 0.2, 0.1]))


def test_each_layout_has_its_own_throughput_without_its_first_step(tmp_path: Path) -> None:
    figures = dict(key_figures(RunMetrics(RECORDS)))
    # over both, after step 1, the median was (120 + 300) / 2 = 210: no layout ran at that pace
    assert "tokens/s (median, after step 1)" not in figures and "210" not in figures.values()
    assert figures["tokens/s (median, pp 2 x dp 1 x tp 1: steps 2-4, its first step 1 left out)"] == "110"
    assert figures["tokens/s (median, pp 1 x dp 2 x tp 1: steps 6-8, its first step 5 left out)"] == "310"
    assert figures["step time (median, pp 1 x dp 2 x tp 1: steps 6-8, its first step 5 left out)"] == "0.200 s"
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    assert main(["report", str(run)]) == 0
    page = (run / "report.html").read_text()
    assert "steps 6-8, its first step 5 left out" in page and "310" in page


def test_a_layout_with_one_record_says_its_warm_up_is_in_it() -> None:
    records = RECORDS[:4] + RECORDS[4:5]
    figures = dict(key_figures(RunMetrics(records)))
    assert figures["tokens/s (pp 1 x dp 2 x tp 1: step 5 only, its warm-up included)"] == "20"
    two = dict(key_figures(RunMetrics(RECORDS[:6])))
    assert two["tokens/s (median, pp 1 x dp 2 x tp 1: step 6, its first step 5 left out)"] == "300"


def test_segments_follow_the_layout_and_one_layout_keeps_its_line() -> None:
    from pipeoffload.train.report import layout_segments

    back = RECORDS + _rows(range(9, 11), PP2, [1.0, 2.0], [1.0, 1.0])  # pp 2 again after dp 2: three segments
    assert [(lay, [r["step"] for r in rows]) for lay, rows in layout_segments(RunMetrics(back))] == [
        ((2, 1, 1), [1, 2, 3, 4]), ((1, 2, 1), [5, 6, 7, 8]), ((2, 1, 1), [9, 10])]
    one = dict(key_figures(RunMetrics(RECORDS[:4])))
    assert one["tokens/s (median, after step 1)"] == "110" and one["step time (median, after step 1)"] == "0.700 s"
