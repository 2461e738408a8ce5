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
    for model, dtype in (("gpt", "float32"), ("llama", "bfloat16")):
        assert f"train {model} {dtype} cpu offload=none" in text and f"train {model} {dtype} cpu offload=all" in text
        assert f"train {model} offload all vs none" in text
    assert "x step time" in text and "copies D2H" in text
    assert text in capsys.readouterr().out


def test_llama_bf16_run_keeps_fp32_weights_and_offload_changes_no_loss():
    """The Llama part: bf16 autocast over fp32 weights; offload all moves memory, not arithmetic."""
    none, full = (gpu_check.train_once(gpu_check.TINY_LLAMA, offload, "cpu") for offload in ("none", "all"))
    assert none["losses"] == full["losses"] and len(none["losses"]) == 3
    assert all(loss == loss for loss in none["losses"])  # finite: not NaN
    assert full["store_peak"] < none["store_peak"]
