"""More memory never gives a slower best plan (docs/planner.md, section 4, "Guarantees").

The escalation's level 3 plans ``offload budget:X`` with ``recompute auto``, X being what ``--memory``
leaves for activations. Recompute auto chooses what to recompute from the offload plan before the
recomputation; the offload planned again after it did not always reach X, and such a plan could be
slower than the plan for a tighter target that fits X: Llama-3-8B on 8 H100s, PP8 group-interleaved
v=4 g=4, the plan for 9.138 units (--memory 30) reached 9.565 units at 33,340 tokens/s where the plan
for 8.72 units (--memory 29.7) reached 8.62 at 33,537; the search at 30 GiB then showed a slower g=8
plan than the one at 29.7 GiB. The pass now also plans tighter targets where a plan misses its own
(``passes.lower._recompute_auto``) and keeps the fastest that fits X."""
from __future__ import annotations

import json

import pytest

from pipeoffload.cli import main

LLAMA8 = ["--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--global-batch", "32", "--tp", "1",
          "--schedules", "group-interleaved", "--stages-per-rank", "4", "--top", "1", "--no-pareto"]
LLAMA8_LAYOUT = ["--model", "llama3-8b", "--gpu", "h100", "--global-batch", "32", "--distributed-optimizer",
                 "--pp", "8", "--schedule", "group-interleaved", "--stages-per-rank", "4", "--group-size", "4",
                 "--recompute-policy", "auto", "--offload", "budget"]
# a second job: at 7.5 GiB only offload budget with recompute auto (level 3) fits, above it level 2 and 1
GPT13 = ["--model", "gpt3-1.3b", "--gpus", "4", "--global-batch", "16", "--tp", "1", "--pp", "4",
         "--schedules", "zb-v,group-interleaved", "--stages-per-rank", "2", "--top", "1", "--no-pareto"]


def _json(capsys: pytest.CaptureFixture, argv: list[str]) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _best(capsys: pytest.CaptureFixture, argv: list[str], memory: float) -> float:
    """The best fitting plan's tokens/s at ``memory`` GiB (0 where none fits)."""
    rows = [r for r in _json(capsys, ["plan", *argv, "--memory", str(memory)])["best"] if r["fits"]]
    return max((r["tokens_per_s"] for r in rows), default=0.0)


def _non_decreasing(values: list[float]) -> bool:
    return all(b >= a * (1 - 1e-9) for a, b in zip(values, values[1:]))


@pytest.mark.parametrize(("argv", "memories"), [
    (LLAMA8, (29.7, 30.0)),  # the probe: 33,537 tokens/s at 29.7 GiB, 33,388 (g=8) at 30 before the fix
    (GPT13, (7.5, 7.6, 7.9, 8.0, 9.0)),
], ids=["llama3-8b-pp8", "gpt3-1.3b-pp4"])
def test_more_memory_never_gives_a_slower_best_plan(capsys: pytest.CaptureFixture, argv: list[str],
                                                     memories: tuple[float, ...]) -> None:
    best = [_best(capsys, argv, m) for m in memories]
    assert _non_decreasing(best), dict(zip(memories, best))


def test_budget_pass_keeps_a_tighter_targets_faster_plan(capsys: pytest.CaptureFixture) -> None:
    """On one layout, ``offload budget`` (the target --memory leaves) with ``recompute auto``: a larger
    target never gives a slower step than a smaller one whose plan fits the larger's memory too."""
    runs = []
    for memory in (29.7, 30.0, 30.3):
        e = _json(capsys, ["estimate", *LLAMA8_LAYOUT, "--memory", str(memory)])
        runs.append((memory, e["offload"], e["tokens_per_second"], e["fits"]))
    assert all(fits for *_, fits in runs), runs
    assert _non_decreasing([t for _, _, t, _ in runs]), runs
