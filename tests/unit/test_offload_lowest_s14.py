"""Own links: ``auto`` and an unmet ``budget:X`` reach the lowest worst-rank peak that any of ``all``,
``auto`` and ``budget:X`` (X from 1 to one below the peak without offload) reaches at the same k with no
stall and no longer step. Before step 13 of docs/offload.md a greedy plan aimed out of reach (a budget
below what the lane can do, or ``auto``'s everything worth moving) spent the copy lane on points below
the peak, and pruning then dropped every copy that did not help (a user probe: 1F1B, d = 4, m = 8,
k = 1.2, ``auto`` and ``budget:2`` planned 4 units with no copies where ``budget:3`` reached 3).
"""
from __future__ import annotations

import pytest

import pipeoffload.passes.offload as offload_pass
from pipeoffload.costs import CostModel
from pipeoffload.passes.lower import lower
from pipeoffload.schedules import generate
from pipeoffload.simulator import Timeline, simulate

Run = tuple[float, float, float]  # worst-rank peak, stall, step longer than without copies


def _run(name: str, d: int, v: int, k: float, policy: str, **costs: float) -> tuple[Run, Timeline]:
    schedule = generate(name, d, 2 * d, v)
    model = CostModel(**costs).with_offload_ratio(k)
    t = simulate(lower(schedule, model, offload=policy), model)
    return (t.peak_activation_units, t.stall, t.makespan - simulate(schedule, model).makespan), t


def _policies(name: str, d: int, v: int, k: float) -> list[str]:
    bare = simulate(generate(name, d, 2 * d, v), CostModel().with_offload_ratio(k))
    return ["all", "auto", *(f"budget:{x}" for x in range(1, int(bare.peak_activation_units)))]


def _above_the_lowest(name: str, d: int, v: int, k: float) -> list[str]:
    """The policies among auto and budget:X whose plan is above the lowest stall-free peak at an
    unchanged step (a budget: above that and above X), stalls or lengthens the step."""
    runs = {p: _run(name, d, v, k, p)[0] for p in _policies(name, d, v, k)}
    lowest = min(peak for peak, stall, longer in runs.values() if stall <= 1e-9 and longer <= 1e-9)
    out = []
    for policy, (peak, stall, longer) in runs.items():
        if policy == "all":
            continue
        limit = lowest if policy == "auto" else max(lowest, float(policy.split(":")[1]))
        if peak > limit + 1e-9 or stall > 1e-9 or longer > 1e-9:
            out.append(f"{policy}: {peak:g} units (stall {stall:g}, +{longer:g} t); lowest {lowest:g}")
    return out


# the user probe's cases: (family, d, v, k, policy, peak before, peak now)
REPORTED = [
    ("1f1b", 4, 1, 1.2, "auto", 4, 3),
    ("1f1b", 4, 1, 1.2, "budget:2", 4, 3),
    ("zb-v", 3, 2, 0.8, "auto", 5, 4),
    ("zb-v", 3, 2, 0.8, "budget:2", 5, 4),
    ("interleaved-1f1b", 3, 2, 1.0, "budget:4", 5, 4),
]


@pytest.mark.parametrize("name,d,v,k,policy,before,now", REPORTED)
def test_the_probes_cases_reach_the_lower_peak(name: str, d: int, v: int, k: float, policy: str,
                                               before: float, now: float) -> None:
    (peak, stall, longer), _ = _run(name, d, v, k, policy)
    assert (peak, stall, longer) == (now, 0, 0), f"{policy}: {peak:g} units (was {before:g})"


FAMILIES = [("1f1b", 1), ("interleaved-1f1b", 2), ("zb-h1", 1), ("zb-h2", 1), ("zb-v", 2), ("1f1b-v", 2),
            ("group-interleaved", 2), ("v-half", 2), ("dualpipe-v", 2)]


@pytest.mark.parametrize("k", [0.8, 1.2])
@pytest.mark.parametrize("d", [3, 4])
@pytest.mark.parametrize("name,v", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_auto_and_an_unmet_budget_reach_the_lowest_peak_of_the_policies(name: str, v: int, d: int, k: float) -> None:
    assert not _above_the_lowest(name, d, v, k)


def _without_step_13(patch: pytest.MonkeyPatch) -> None:
    patch.setattr(offload_pass, "_lower_targets", lambda plan, costs, states, peaks, step: (states, peaks))


@pytest.mark.parametrize("name,d,v,k,policy", [("1f1b", 4, 1, 1.2, "auto"), ("zb-v", 3, 2, 0.8, "budget:3"),
                                               ("interleaved-1f1b", 4, 2, 0.8, "budget:2"),
                                               ("dualpipe-v", 4, 2, 1.2, "budget:3")])
def test_no_rank_holds_more_than_without_step_13(monkeypatch: pytest.MonkeyPatch, name: str, d: int, v: int,
                                                 k: float, policy: str) -> None:
    """Each rank keeps the lowest of its plans (a budget's: the lowest above the budget), so no rank
    holds more than without step 13, and the worst one holds less here."""
    now = _run(name, d, v, k, policy)[1]
    _without_step_13(monkeypatch)
    before = _run(name, d, v, k, policy)[1]
    line = float(policy.split(":")[1]) if policy.startswith("budget:") else 0.0
    pairs = [(max(a.peak_activation_units, line), max(b.peak_activation_units, line))
             for a, b in zip(now.per_rank, before.per_rank)]
    assert all(a <= b + 1e-9 for a, b in pairs), pairs
    assert now.peak_activation_units < before.peak_activation_units
    assert now.stall == 0 and now.makespan == before.makespan


def test_zb_h2_with_a_long_w_holds_one_unit_less() -> None:
    """ZB-H2, d = 8, m = 16, W twice as long, k = 0.8, offload auto: 12 units with steps 1-12, 11 now."""
    (peak, stall, longer), _ = _run("zb-h2", 8, 1, 0.8, "auto", time_w=2.0)
    assert (peak, stall, longer) == (11, 0, 0)


@pytest.mark.parametrize("policy,shared", [("budget:4", False), ("auto", True), ("budget:2", True)])
def test_step_13_is_not_tried_for_a_met_budget_or_on_a_shared_host_link(monkeypatch: pytest.MonkeyPatch,
                                                                        policy: str, shared: bool) -> None:
    def refuse(*_: object) -> None:
        raise AssertionError("step 13 ran")

    monkeypatch.setattr(offload_pass, "_lower_targets", refuse)
    costs = CostModel(shared_host_link=shared).with_offload_ratio(1.2)
    lower(generate("1f1b", 4, 8), costs, offload=policy)
