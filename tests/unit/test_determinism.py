"""Results do not depend on hash randomisation: two processes with different PYTHONHASHSEED agree.

Sets and dicts keyed by enums or strings iterate in a seed-dependent order; a pass that lets such an
order leak into its output would differ between processes (calling it twice in one process cannot
show that). Each process prints a digest of lowered schedules, their timelines and a small plan.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import hashlib, json
from pipeoffload.costs import CostModel
from pipeoffload.passes.lower import lower_with_report
from pipeoffload.schedules import generate
from pipeoffload.simulator import simulate
from pipeoffload.planner.hardware import GIB, hardware_preset
from pipeoffload.planner.presets import model_preset
from pipeoffload.planner.search import PlanRequest, find_plans

digest = hashlib.sha256()
costs = CostModel.uniform(1.0, 1.5, 0.5, p2p=0.1, shared_host_link=True).with_offload_ratio(0.9)
cases = [("interleaved-1f1b", 4, 8, 2, {}), ("zb-v", 4, 8, 2, {}), ("group-interleaved", 4, 8, 2, {"group_size": 2}),
         ("zb", 4, 8, 1, {}), ("v-min", 3, 6, 2, {})]
for name, d, m, v, options in cases:
    schedule = generate(name, d, m, v, **options)
    for offload, recompute in (("all", "none"), ("auto", "auto"), ("budget:3", "auto"), ("none", "first:1")):
        lowered, report = lower_with_report(schedule, costs, offload=offload, recompute=recompute)
        timeline = simulate(lowered, costs)
        digest.update(lowered.to_text().encode())
        digest.update(json.dumps(timeline.as_dict(), sort_keys=True).encode())
        digest.update(repr((timeline.start, timeline.end, report.summary())).encode())
req = PlanRequest(model=model_preset("gpt3-2.7b").with_(layers=16), hardware=hardware_preset("a100"), gpus=8,
                  global_batch=32, memory_budget=12 * GIB)
digest.update(json.dumps([p.as_dict() for p in find_plans(req).best(5)], sort_keys=True).encode())
print(digest.hexdigest())
"""


def _digest(seed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300,
                            cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_two_processes_with_different_hash_seeds_give_identical_results() -> None:
    assert _digest("1") == _digest("2024")
