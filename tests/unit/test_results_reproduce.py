"""Committed benchmark results are what their recorded commands print today (the cheap cases of each file).

A results file that no longer reproduces is not a result: these rerun the fast parts of some deterministic
files (planner figures only; the search's seconds are left out) and compare them with the committed text.
The sixteenth session found each of them stale or cut: three plan_pp_vs_tp files had lost the command's
first output line, loss_cost_effect.txt and plan_search.txt predated c6df7fa3 (tied embeddings held once).
"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
SEARCH_TIME = re.compile(r" in [0-9.]+ s = [0-9]+ candidates/s")  # the only figure that is a timing


def benchmark(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def without_timings(lines: list[str]) -> list[str]:
    return [SEARCH_TIME.sub("", line) for line in lines]


@pytest.mark.parametrize("name", ["gpt3-13b-a100-72gib", "gpt3-13b-gh200-40gib", "gpt3-6.7b-a100-72gib",
                                  "gpt3-13b-a100-40gib-30gbps"])  # under a second each; the others take longer
def test_a_plan_pp_vs_tp_file_is_its_commands_output(name: str) -> None:
    lines = (RESULTS / f"plan_pp_vs_tp_{name}.txt").read_text().splitlines()
    command = lines[0].removeprefix("$ pipeoffload ").split()
    code, out, _ = run_cli(*command)
    assert code == 0
    body = [line for line in lines[1:] if not line.startswith("# ")]
    assert without_timings(body) == without_timings(out.splitlines())


@pytest.mark.parametrize("model", ["llama3-8b", "gpt3-13b"])  # the two fast cases of the four
def test_plan_search_tables_are_what_the_search_finds(model: str) -> None:
    plan_search = benchmark("plan_search")
    _, gpu, gpus, batch = next(case for case in plan_search.CASES if case[0] == model)
    hw = plan_search.hardware_preset(gpu)
    result = plan_search.find_plans(plan_search.PlanRequest(
        model=plan_search.model_preset(model), hardware=hw, gpus=gpus, global_batch=batch,
        memory_budget=0.9 * hw.memory_bytes))
    text = (RESULTS / "plan_search.txt").read_text()
    heading = f"## {model} on {gpus} x {gpu}, global batch {batch}: best 3 and Pareto frontier\n"
    section = text[text.index(heading) + len(heading):].split("\n\n")[0]  # the current run's, first in the file
    assert section == "\n".join([plan_search.format_table(result.best(3)), plan_search.format_table(result.pareto())])


def test_loss_cost_effects_shipped_gpt3_1_3b_plan_is_what_the_planner_finds() -> None:
    loss_cost_effect = benchmark("loss_cost_effect")
    row = next(line for line in (RESULTS / "loss_cost_effect.txt").read_text().splitlines()
               if line.startswith("gpt3-1.3b "))
    assert loss_cost_effect.label(loss_cost_effect.best("gpt3-1.3b", 8, 512)) in row
