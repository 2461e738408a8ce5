"""Reports print a model's parameter count in a unit that shows it: a small model read "0.0B params"."""
from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from pipeoffload.planner.model import ModelSpec
from pipeoffload.planner.presets import model_preset


@pytest.mark.parametrize(("params", "unit"), [(228_000, "K"), (3_200_000, "M"), (124_000_000, "M"),
                                              (70_600_000_000, "B")])
def test_the_unit_follows_the_size(params: int, unit: str) -> None:
    if unit == "B":
        spec = model_preset("llama3-70b")
        assert spec.params_size() == f"{spec.total_params() / 1e9:.1f}B"  # large models print as before
        return
    spec = ModelSpec(name="t", layers=1, hidden=64, heads=4, seq=64, vocab=params // 64)  # ~vocab x hidden weights
    text = spec.params_size()
    assert text.endswith(unit) and float(text[:-1]) > 0, text


def test_an_approximate_count_says_so() -> None:
    spec = dataclasses.replace(model_preset("gpt3-1.3b"), params_note="approximate")
    assert spec.params_size().startswith("~")


def test_estimate_of_a_small_model_prints_its_count() -> None:
    out = subprocess.run([sys.executable, "-m", "pipeoffload", "estimate", "--layers", "2", "--hidden", "64",
                          "--heads", "4", "--seq", "64", "--vocab", "1000", "--gpu", "a100", "--tp", "1", "--pp", "1",
                          "--dp", "1", "--microbatch-size", "1", "--global-batch", "1"],
                         capture_output=True, text=True, check=True).stdout
    first = out.splitlines()[0]
    assert "0.0B" not in first and " params)" in first, first
    count = first.split("(")[1].split(" params")[0]
    assert count.endswith("K") and 100 < float(count[:-1]) < 1000, first
