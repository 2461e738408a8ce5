"""Every supported schedule and policy gives the single-process loss and gradients, bit for bit,
over 3 SGD steps on 2 and 4 gloo ranks; traces equal the schedules; nothing stays resident."""
from __future__ import annotations

import pytest
from conftest import CASES, STALL_CASE, WAIT_CASE, run_cases
from workers import build_schedule

from pipeoffload.ir import ActionKind

pytestmark = pytest.mark.dist


@pytest.fixture(scope="module", params=[2, 4], ids=lambda w: f"{w}ranks")
def results(request):
    return request.param, run_cases(request.param)


def _by_case(results):
    world, per_rank = results
    for i, case in enumerate(CASES):
        yield case, [per_rank[r][i] for r in range(world)]


def test_a_case_waits_for_copies():
    """The throttled case really has WAIT actions on 4 ranks (6 microbatches, as the workers run it)."""
    schedule = build_schedule(WAIT_CASE, 4, 6)
    assert any(a.kind is ActionKind.WAIT for row in schedule.actions for a in row)


def test_a_case_stalls_under_its_budget():
    """The stall-budget case really runs a plan made for faster copies on 4 ranks (6 microbatches): its
    simulated step is longer than the schedule's without copies, and its peak lower than the strict plan's."""
    from dataclasses import replace

    from pipeoffload.costs import CostModel
    from pipeoffload.simulator import simulate
    costs = CostModel().with_offload_ratio(0.7)
    stalled = simulate(build_schedule(STALL_CASE, 4, 6), costs)
    strict = simulate(build_schedule(replace(STALL_CASE, costs=(("offload_ratio", 0.7),)), 4, 6), costs)
    assert stalled.stall > 0 and strict.stall == 0
    assert stalled.peak_activation_units < strict.peak_activation_units


def test_loss_equals_single_process(results):
    bad = []
    for case, ranks in _by_case(results):
        flags = [f for r in ranks for f in r["loss_equal"]]
        if len(flags) != 3 or not all(flags):
            bad.append(f"{case}: {flags} losses {[r['losses'] for r in ranks if r['losses']]}")
    assert not bad, "\n".join(bad)


def test_gradients_equal_single_process(results):
    bad = [f"{case} rank {r['rank']}: {r['grads_equal']} max diff {r['max_diff']}"
           for case, ranks in _by_case(results) for r in ranks if r["grads_equal"] != [True] * 3]
    assert not bad, "\n".join(bad)


def test_trace_equals_schedule(results):
    bad = [f"{case} rank {r['rank']}" for case, ranks in _by_case(results) for r in ranks if r["trace_ok"] != [True] * 3]
    assert not bad, "\n".join(bad)


def test_nothing_resident_after_step_and_no_leak(results):
    bad = []
    for case, ranks in _by_case(results):
        for r in ranks:
            if any(r["end_bytes"]) or len(set(r["peaks"])) != 1:
                bad.append(f"{case} rank {r['rank']}: end bytes {r['end_bytes']} peaks {r['peaks']}")
    assert not bad, "\n".join(bad)


def test_offload_and_recompute_lower_the_peak(results):
    """Sanity: the policies really move memory. Never higher on any rank, strictly lower in total
    (a rank may see no change: F and B adjacent, or a stage that saves nothing large)."""
    world, per_rank = results
    index = {str(c): i for i, c in enumerate(CASES)}
    for name, v in {(c.schedule, c.stages_per_rank) for c in CASES}:
        base = f"{name}/v{v}/none"
        for policy in ("offload:all", "recompute:first:1"):
            other = f"{name}/v{v}/{policy}"
            for r in range(world):
                assert per_rank[r][index[other]]["peaks"][0] <= per_rank[r][index[base]]["peaks"][0], (other, r)
            total = sum(per_rank[r][index[other]]["peaks"][0] for r in range(world))
            assert total < sum(per_rank[r][index[base]]["peaks"][0] for r in range(world)), other
