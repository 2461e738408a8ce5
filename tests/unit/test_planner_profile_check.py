"""Probe P #4: ``plan --profile`` refuses costs measured on another layer, --seq or microbatch (the
file's layer parameters and hidden-state bytes identify them) instead of planning with them."""
from __future__ import annotations

from pathlib import Path

import pytest

from pipeoffload.errors import ConfigError
from pipeoffload.planner.hardware import hardware_preset
from pipeoffload.planner.measured import save_layer_costs
from pipeoffload.planner.plans import PlanRequest
from pipeoffload.planner.presets import model_preset
from pipeoffload.planner.stagecosts import layer_costs
from tests.conftest import refused, run_cli

SMALL = ("--hidden", "256", "--heads", "4", "--layers", "4", "--vocab", "1000", "--gpus", "2",
         "--global-batch", "8", "--tp", "1", "--top", "1")


def _profile(tmp_path: Path, seq: int) -> Path:
    from pipeoffload.planner.model import ModelSpec

    model = ModelSpec(hidden=256, heads=4, layers=4, vocab=1000, seq=seq)
    path = tmp_path / f"layer-s{seq}.json"
    save_layer_costs(layer_costs(model, hardware_preset("h100")), path)
    return path


def test_a_profile_of_the_planned_shape_is_used(tmp_path: Path) -> None:
    code, out, err = run_cli("plan", *SMALL, "--seq", "512", "--profile", str(_profile(tmp_path, 512)))
    assert code == 0, err


@pytest.mark.parametrize("change", ["--seq 2048", "--microbatch-size 2", "--hidden 512"])
def test_a_profile_of_another_seq_microbatch_or_layer_is_refused(tmp_path: Path, change: str) -> None:
    argv = " ".join(SMALL).replace("--hidden 256", "") + f" --seq 512 --profile {_profile(tmp_path, 512)}"
    argv = argv.replace("--seq 512", "") + f" {change}" if change.startswith("--seq") else argv + f" {change}"
    if not change.startswith("--hidden"):
        argv += " --hidden 256"
    refused(f"plan {argv}", "--profile", "re-profile", "--seq")


def test_the_api_refuses_it_too() -> None:
    lc = layer_costs(model_preset("llama3-8b").with_(seq=4096), hardware_preset("h100"))
    with pytest.raises(ConfigError, match="re-profile"):
        PlanRequest(model=model_preset("llama3-8b").with_(seq=16384), hardware=hardware_preset("h100"), gpus=4,
                    global_batch=16, memory_budget=70 * 2**30, measured=lc)


@pytest.mark.parametrize(("edit", "piece"), [
    (lambda d: [1], "not a JSON object"),
    (lambda d: {**d, "head_time": 3}, "head_time=3: must be a list of 3"),
    (lambda d: {**d, "head_time": ["a", 1, 2]}, "head_time=['a', 1, 2]"),
    (lambda d: {**d, "params": "x"}, "params='x'"),
    (lambda d: {**d, "time_f": None}, "time_f=None"),
    (lambda d: {**d, "time_f": -1.0}, "time_f=-1.0: must be a finite number >= 0"),
    (lambda d: {**d, "tp": 0}, "tp=0"),
    (lambda d: {**d, "tp": "2"}, "tp='2'"),
    (lambda d: {k: v for k, v in d.items() if k != "time_f"}, "missing field(s) time_f"),
])
def test_a_malformed_profile_is_one_line_naming_the_file_and_field(tmp_path: Path, edit, piece: str) -> None:
    """A hand-edited or foreign layer-cost file: one line (exit 2), never a traceback from deep in the search
    (``[1]``, ``"head_time": 3``, ``"tp": 0`` and ``"time_f": null`` raised AttributeError, TypeError or
    ZeroDivisionError)."""
    import json

    path = _profile(tmp_path, 512)
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    refused(f"plan {' '.join(SMALL)} --seq 512 --profile {path}", f"layer-cost file '{path}'", piece)
