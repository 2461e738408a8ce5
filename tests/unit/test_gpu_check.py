"""benchmarks/gpu_check.py: its table and parsing, the training comparison run tiny on CPU, and the
no-CUDA path (the GPU parts themselves run only on a CUDA machine: `make gpu-check`)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import gpu_check  # noqa: E402


def test_table_renders_aligned_rows():
    table = gpu_check.Table("title")
    table.add("pytest tests/gpu", "ok", "3 passed")
    table.add("x", "1.234 s/step", "")
    lines = table.render().splitlines()
    assert lines[0] == "title" and lines[1].split() == ["check", "result", "detail"]
    assert lines[3].startswith("pytest tests/gpu  ok") and lines[3].endswith("3 passed")
    assert lines[4].index("1.234") == lines[3].index("ok")


def test_pytest_summary():
    assert gpu_check.pytest_summary("....\n3 passed, 1 skipped in 2.0s\n") == "3 passed, 1 skipped"
    assert gpu_check.pytest_summary("1 failed, 2 passed in 1s") == "1 failed, 2 passed"
    assert gpu_check.pytest_summary("crash") == "no summary"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-CUDA path")
def test_without_cuda_says_so_and_exits_0(capsys):
    assert gpu_check.main([]) == 0
    assert "needs CUDA" in capsys.readouterr().out


def test_training_comparison_runs_tiny_on_cpu(tmp_path, capsys):
    out = tmp_path / "gpu_check.txt"
    assert gpu_check.main(["--device", "cpu", "--out", str(out)]) == 0
    text = out.read_text()
    for model, family, dtype in (("gpt", "interleaved-1f1b", "float32"), ("llama", "interleaved-1f1b", "bfloat16"),
                                 ("gpt", "zb-v", "float32")):
        for offload in ("none", "all"):
            assert f"train {model} {family} {dtype} cpu offload={offload}" in text
        assert f"train {model} {family} offload all vs none" in text
    assert "x step time" in text and "copies D2H" in text
    assert "deterministic kernels: offload all vs none  losses bitwise equal" in text
    assert "FAILED" not in text and "DIFFER" not in text
    assert text in capsys.readouterr().out


def test_a_failing_part_is_one_row_and_the_others_still_run(capsys):
    table = gpu_check.Table("t")

    def broken() -> None:
        raise RuntimeError("no such kernel")

    assert gpu_check.guarded(table, "part one", broken) is None
    assert gpu_check.guarded(table, "part two", lambda: 7) == 7
    assert table.rows == [("part one", "FAILED", "RuntimeError: no such kernel")]


def test_llama_bf16_run_keeps_fp32_weights_and_offload_changes_no_loss():
    """The Llama part: bf16 autocast over fp32 weights; offload all moves memory, not arithmetic."""
    none, full = (gpu_check.train_once(gpu_check.TINY_LLAMA, offload, "cpu") for offload in ("none", "all"))
    assert none["losses"] == full["losses"] and len(none["losses"]) == 3
    assert all(loss == loss for loss in none["losses"])  # finite: not NaN
    assert full["store_peak"] < none["store_peak"]
