"""The planner's printed numbers agree with each other: plan's rows (tokens/s, MFU, memory split,
Pareto frontier, order), --json against the text, estimate's breakdown, bubble and TFLOP/s, and
--compare-tp's activation column (the largest activation peak of any rank, as --match-memory limits)."""
from __future__ import annotations

import json

import pytest

from pipeoffload.cli import build_parser
from pipeoffload.cli.plan import request_from_args
from pipeoffload.planner.compare_tp import compare_tp, format_comparison
from pipeoffload.planner.hardware import GIB, hardware_preset
from pipeoffload.planner.presets import model_preset
from tests.conftest import run_cli

PLAN = ["plan", "--model", "gpt3-1.3b", "--gpu", "a100", "--gpus", "4", "--global-batch", "16", "--memory", "20",
        "--by-tp"]
# the TP = 1 plan's fullest rank (rank 0: the embedding) is not the one with the largest activation peak
UNEVEN = ["--model", "gpt3-1.3b", "--seq", "8192", "--gpus", "8", "--global-batch", "16", "--memory", "12"]


def _json(*argv: str) -> dict:
    code, out, err = run_cli(*argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_plan_rows_are_arithmetically_consistent_and_match_the_text() -> None:
    data = _json(*PLAN)
    code, text, _ = run_cli(*PLAN)
    assert code == 0
    plans = data["best"] + data["pareto"] + list(data["best_by_tp"].values())
    rows = [line.split() for line in text.splitlines() if line.strip()[:1].isdigit() and " PP" in line]
    assert len(rows) == len(plans)
    seq, peak = 2048, hardware_preset("a100").peak_flops
    flops = model_preset("gpt3-1.3b").model_flops_per_microbatch()  # microbatch 1: one sequence
    for row, p in zip(rows, plans):
        step, mem = p["step_time_s"], p["memory_gib"]
        assert p["tokens_per_s"] == pytest.approx(16 * seq / step)
        assert p["mfu"] == pytest.approx(16 * flops / (step * 4 * peak))
        assert step == pytest.approx(p["pipeline_time_s"] + p["dp_sync_time_s"])
        assert mem["total"] == pytest.approx(mem["parameters"] + mem["optimizer"] + mem["activations"])
        assert p["microbatches"] * p["layout"]["dp"] == 16
        assert row[-14:] == [str(p["microbatches"]), f"{p['tokens_per_s']:,.0f}", f"{p['mfu']:.1%}", f"{step:.3f}",
                             f"{mem['total']:.1f}", "=", f"{mem['parameters']:.1f}", "+", f"{mem['optimizer']:.1f}",
                             "+", f"{mem['activations']:.1f}", f"{mem['host']:.1f}", f"{p['bubble_ratio']:.1%}",
                             f"{p['stall_ratio']:.1%}"]
    speeds = [p["tokens_per_s"] for p in data["best"]]
    assert speeds == sorted(speeds, reverse=True)
    front = [(p["memory_gib"]["total"], p["tokens_per_s"]) for p in data["pareto"]]
    assert all(a[0] <= b[0] and a[1] < b[1] for a, b in zip(front, front[1:]))  # by memory, each one faster
    for p in data["best"]:  # nothing shown beats a frontier plan in both
        assert not any(p["memory_gib"]["total"] < m and p["tokens_per_s"] >= t for m, t in front)


def test_estimate_breakdown_bubble_and_tflops_agree() -> None:
    argv = ["estimate", "--model", "gpt3-1.3b", "--gpu", "a100", "--pp", "4", "--schedule", "zb-v",
            "--global-batch", "64"]
    data = _json(*argv)
    step, parts = data["step_seconds"], data["breakdown_seconds"]
    assert sum(parts.values()) == pytest.approx(step)
    assert data["tflops_per_gpu"] * 1e12 == pytest.approx(data["mfu"] * hardware_preset("a100").peak_flops)
    assert data["tokens_per_second"] == pytest.approx(64 * 2048 / step)
    assert data["memory_gib"]["worst"] == max(data["memory_gib"]["per_rank"])
    # the bubble is the ranks' idle share of the pipeline's time (the step less the DP sync), as docs/planner.md says
    pipeline = step - parts["dp_sync"]
    busiest = parts["compute"] + parts["tp_comm"]
    assert data["imbalance_ratio"] == pytest.approx(busiest / pipeline - (1 - data["bubble_ratio"]))
    code, text, _ = run_cli(*argv)
    assert code == 0 and f"pipeline bubble {data['bubble_ratio']:.1%}" in text
    assert f"step {step:.3f} s   MFU {data['mfu']:.1%}   {data['tflops_per_gpu']:.1f} TFLOP/s per GPU" in text


def test_compare_tp_shows_the_largest_activation_peak_of_any_rank() -> None:
    req = request_from_args(build_parser().parse_args(["plan", *UNEVEN]))
    cmp = compare_tp(req)
    assert cmp.pp is not None and cmp.tp is not None
    peaks = {side: max(p.sim.peak_units) * p.unit_bytes / GIB for side, p in (("pp", cmp.pp), ("tp", cmp.tp))}
    assert peaks["pp"] > cmp.pp.memory.activations / GIB + 0.1  # the case this checks: another rank peaks higher
    text = format_comparison(cmp, req)
    row = next(line.split() for line in text.splitlines() if line.startswith("PP + offload  "))
    assert row[5] == f"{peaks['pp']:.1f}"  # PP + offload, tokens/s, MFU, act GiB
    assert f"activation memory x{peaks['pp'] / peaks['tp']:.2f}" in text
    data = _json("plan", *UNEVEN, "--compare-tp")
    assert data["activation_peak_gib"] == pytest.approx(peaks)


def test_matched_memory_limits_every_rank_to_the_baselines_largest_peak() -> None:
    req = request_from_args(build_parser().parse_args(["plan", *UNEVEN]))
    cmp = compare_tp(req, "best", match_memory=True)
    assert cmp.pp is not None and cmp.tp is not None
    assert cmp.pp.activation_peak <= cmp.tp.activation_peak * (1 + 1e-9)
    assert cmp.tp.activation_peak == max(cmp.tp.sim.peak_units) * cmp.tp.unit_bytes
