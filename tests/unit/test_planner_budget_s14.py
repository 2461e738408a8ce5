"""More memory never gives a slower best plan (docs/planner.md, section 4, "Guarantees").

Two ways it did on Llama-3-8B, 8 H100s, TP 1:

- Level 3 (``offload budget:X`` with ``recompute auto``, X what ``--memory`` leaves) read what to
  recompute from the budget's fewest-copies offload plan, which left more above X the larger X was:
  PP8 group-interleaved v=4 g=4 took 33,340 tokens/s at 30 GiB (X = 9.138 units) against 33,537 at
  29.7 (X = 8.72), and the search showed 33,388 (g=8) at 30 GiB. It now reads it from the offload auto
  plan, the same for every X (``passes.lower._read_from``).
- The escalation stopped at the first fitting level: PP4 1F1B at 38 GiB fitted with ``recompute
  first:1`` (42,704 tokens/s), so the faster level-3 plan (43,139 at 37.5 GiB) was not tried. Past a
  fitting level that costs time, the later levels are now tried for a faster plan (``search._Search``).
"""
from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from pipeoffload.cli import main
from pipeoffload.costs import CostModel
from pipeoffload.passes.lower import lower_with_report
from pipeoffload.passes.recompute import all_keys, insert_recompute
from pipeoffload.planner.hardware import GIB, hardware_preset
from pipeoffload.planner.presets import model_preset
from pipeoffload.planner.search import PlanRequest, find_plans
from pipeoffload.policies import OffloadPolicy
from pipeoffload.schedules import generate
from pipeoffload.simulator import simulate

LLAMA8 = ["--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--tp", "1", "--top", "1", "--no-pareto"]
# level 3 within one schedule: the best plan is group-interleaved v=4 at PP8 (fails before: 33,537 -> 33,388)
GIS = [*LLAMA8, "--global-batch", "32", "--pp", "8", "--schedules", "group-interleaved", "--stages-per-rank", "4"]
# the escalation: recompute first:1 fits from 38 GiB on and hid level 3 (fails before: 43,139 -> 42,704)
ONE_F_ONE_B = [*LLAMA8, "--global-batch", "64", "--pp", "4", "--schedules", "1f1b"]
# one layout, offload budget (the target --memory leaves) with recompute auto: level 3 alone
LAYOUT = ["--model", "llama3-8b", "--gpu", "h100", "--global-batch", "32", "--pp", "8", "--schedule",
          "group-interleaved", "--stages-per-rank", "4", "--group-size", "4", "--offload", "budget",
          "--recompute-policy", "auto"]


def _json(capsys: pytest.CaptureFixture, argv: list[str]) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _best(capsys: pytest.CaptureFixture, argv: list[str], memory: float) -> float:
    """The best fitting plan's tokens/s at ``memory`` GiB."""
    rows = [r for r in _json(capsys, ["plan", *argv, "--memory", str(memory)])["best"] if r["fits"]]
    assert rows, f"no plan fits {memory} GiB"
    return max(r["tokens_per_s"] for r in rows)


def _non_decreasing(values: list[float]) -> bool:
    return all(b >= a * (1 - 1e-9) for a, b in zip(values, values[1:]))


@pytest.mark.parametrize(("argv", "memories"), [
    (GIS, (29.7, 30.0, 30.3)),
    (ONE_F_ONE_B, (37.5, 38.0, 39.0)),
], ids=["level-3-target", "escalation"])
def test_more_memory_never_gives_a_slower_best_plan(capsys: pytest.CaptureFixture, argv: list[str],
                                                     memories: tuple[float, ...]) -> None:
    best = [_best(capsys, argv, m) for m in memories]
    assert _non_decreasing(best), dict(zip(memories, best))


def test_a_larger_budget_target_never_gives_a_longer_step(capsys: pytest.CaptureFixture) -> None:
    """On one layout, ``offload budget`` with ``recompute auto``: recomputation is what a budget plan
    pays in time, and a larger target X must not make it recompute more expensively."""
    runs = [(memory, _json(capsys, ["estimate", *LAYOUT, "--memory", str(memory)])) for memory in (29.7, 30.0, 30.3)]
    assert all(e["fits"] for _, e in runs), [(m, e["offload"], e["memory_gib"]) for m, e in runs]
    assert _non_decreasing([e["tokens_per_second"] for _, e in runs]), [
        (m, e["offload"], e["tokens_per_second"]) for m, e in runs]


def test_levels_past_a_fit_show_only_a_faster_plan() -> None:
    """Past the first fitting level the search keeps a plan only where it is faster and fits; the others
    are counted (so every simulation shows in the output), and the best plan is the fastest of every
    level the escalation tried."""
    req = PlanRequest(model=model_preset("llama3-8b"), hardware=hardware_preset("h100"), gpus=8, global_batch=64,
                      memory_budget=38 * GIB, tp_sizes=(1,), pp_sizes=(4,), schedules=("1f1b",))
    result = find_plans(req)
    best = result.best(1)[0]
    assert (best.choice.offload.kind, best.choice.recompute.kind) == ("budget", "auto")
    first = [p for p in result.plans if p.choice.recompute.kind == "first"]
    assert first and all(p.fits and p.step_time > best.step_time for p in first)  # the level that fitted first
    exhaustive = find_plans(replace(req, escalate=False))
    assert exhaustive.best(1)[0].step_time == pytest.approx(best.step_time, rel=1e-12)


SCHEDULES = [("1f1b", 8, 16, 1, None), ("zb-v", 4, 12, 2, None), ("interleaved-1f1b", 4, 12, 2, None),
             ("group-interleaved", 4, 16, 2, 2)]


def _budget_runs(schedule, costs: CostModel) -> list[tuple[float, float]]:  # type: ignore[no-untyped-def]
    """(step, activation peak) of ``offload budget:X`` with ``recompute auto`` for X = 1, 2, ... 6 units."""
    out = []
    for x in range(1, 7):
        lowered, _ = lower_with_report(schedule, costs, offload=f"budget:{x}", recompute="auto",
                                       log_warnings=False)
        timeline = simulate(lowered, costs)
        out.append((timeline.makespan, timeline.peak_activation_units))
    return out


def test_reading_offload_auto_s_plan_too_never_gives_a_slower_or_larger_plan(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Under ``budget:X``, recompute auto also reads what to recompute from offload auto's plan and keeps
    that choice only where the step is shorter for no more memory: against reading the budget's own
    plan alone, no step is longer and no peak higher, and some steps are shorter."""
    from pipeoffload.passes import lower
    grid = [(generate(f, d, m, v, **({"group_size": g} if g else {})), CostModel().with_offload_ratio(k))
            for f, d, m, v, g in SCHEDULES for k in (1.0, 1.5)]
    both = [_budget_runs(schedule, costs) for schedule, costs in grid]
    monkeypatch.setattr(lower, "_other_keys", lambda *args: None)
    alone = [_budget_runs(schedule, costs) for schedule, costs in grid]
    pairs = [(b, a) for runs_b, runs_a in zip(both, alone) for b, a in zip(runs_b, runs_a)]
    assert all(b[0] <= a[0] + 1e-9 and b[1] <= a[1] + 1e-9 for b, a in pairs)
    assert sum(b[0] < a[0] - 1e-9 for b, a in pairs) >= 5  # ZB-V at k = 1.5, interleaved 1F1B at k = 1


@pytest.mark.parametrize(("family", "d", "m", "v", "g"), SCHEDULES, ids=[s[0] for s in SCHEDULES])
def test_recomputing_a_subset_never_lengthens_the_step(family: str, d: int, m: int, v: int, g: int | None) -> None:
    """What the search relies on (``recompute first:K`` against ``first:K'``, a larger budget's subset):
    R actions run on the compute lane in a fixed order, so leaving some out ends nothing later."""
    schedule = generate(family, d, m, v, **({"group_size": g} if g else {}))
    stages = schedule.placement.num_stages
    costs = CostModel(time_f=tuple(1.0 + 0.3 * (s % 3) for s in range(stages)), time_i=1.2, time_w=0.8, p2p_time=0.1)
    keys = sorted(all_keys(schedule, simulate(schedule, costs), costs, OffloadPolicy()))
    rng = random.Random(family)
    for _ in range(5):
        more = {k for k in keys if rng.random() < 0.6}
        fewer = {k for k in more if rng.random() < 0.5}
        longer, shorter = (simulate(insert_recompute(schedule, s), costs).makespan for s in (more, fewer))
        assert shorter <= longer + 1e-9
