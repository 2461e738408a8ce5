"""Measured activation memory agrees with the simulator's memory model.

The simulator counts activation units; the runtime counts bytes of saved storages. With each
stage's unit measured (bytes one microbatch's forward saved on that stage), the simulated peak per
rank in bytes must match the measured peak within 5%, with and without offload."""
from __future__ import annotations

import pytest
from conftest import CASES, run_cases

from pipeoffload import Schedule
from pipeoffload.runtime.trace import Trace, compare_with_simulation, measured_w_fractions

pytestmark = pytest.mark.dist

MEMORY_CASES = [c for c in CASES if c.schedule in ("1f1b", "interleaved-1f1b", "group-interleaved")
                and c.policy in ("none", "offload:all", "offload:first:1")]


@pytest.mark.parametrize("world", [2, 4])
def test_peak_bytes_match_simulation(world):
    per_rank = run_cases(world)
    index = {str(c): i for i, c in enumerate(CASES)}
    bad, seen, worst = [], 0, 0.0
    for case in MEMORY_CASES:
        ranks = [per_rank[r][index[str(case)]] for r in range(world)]
        schedule = Schedule.from_json(ranks[0]["schedule"])
        units = {s: b for r in ranks for s, b in r["slot_bytes"].items()}
        rows = compare_with_simulation([Trace.from_dict(r["trace"]) for r in ranks], schedule, units)
        for row in rows:
            seen += 1
            worst = max(worst, row["relative_difference"])
            if not row["actions_match"] or row["relative_difference"] > 0.05:
                bad.append(f"{case}: {row}")
    assert seen == len(MEMORY_CASES) * world
    print(f"{world} ranks: largest relative difference measured vs simulated peak: {worst:.4f}")
    assert not bad, "\n".join(bad)


SPLIT_CASES = [c for c in CASES if c.schedule in ("zb-v", "zb-h1") and c.policy in ("none", "offload:all")]


@pytest.mark.parametrize("world", [4])
def test_split_backward_peaks_match_with_the_measured_w_fraction(world):
    """Zero-bubble schedules, with both offload windows (F -> I and I -> W): the simulated peak with
    each stage's w_fraction as the runtime measured it (bytes a slot holds after I over bytes its F
    saved) matches the measured peak within 5% (with w_fraction = 1 it over-predicts)."""
    per_rank = run_cases(world)
    index = {str(c): i for i, c in enumerate(CASES)}
    bad, worst, over = [], 0.0, []
    for case in SPLIT_CASES:
        ranks = [per_rank[r][index[str(case)]] for r in range(world)]
        schedule = Schedule.from_json(ranks[0]["schedule"])
        if case.policy == "offload:all":
            kinds = {a.kind.value for row in schedule.actions for a in row}
            assert {"OFFLOAD_W", "RELOAD_W"} <= kinds, case
        units = {s: b for r in ranks for s, b in r["slot_bytes"].items()}
        fractions = measured_w_fractions(units, {s: b for r in ranks for s, b in r["w_bytes"].items()})
        # stage 0's backward has no input gradient: all it saved is W's (1.0); the others about half
        assert fractions and all(0.0 < f <= 1.0 for f in fractions.values()) and min(fractions.values()) < 0.9
        traces = [Trace.from_dict(r["trace"]) for r in ranks]
        rows = compare_with_simulation(traces, schedule, units, fractions)
        for row in rows:
            worst = max(worst, row["relative_difference"])
            if not row["actions_match"] or row["relative_difference"] > 0.05:
                bad.append(f"{case}: {row}")
        # with w_fraction = 1 (what train's metrics simulate today) some rank is over-predicted
        unitless = compare_with_simulation(traces, schedule, units)
        over.append(max(row["simulated_peak"] / row["measured_peak"] for row in unitless))
    print(f"{world} ranks, zero-bubble with measured w_fraction: largest relative difference {worst:.4f}; "
          f"with w_fraction 1 the worst rank is over-predicted by {max(over) - 1:.1%}")
    assert not bad, "\n".join(bad)
    assert max(over) > 1.05


def w_fraction(trace: dict) -> float:
    """Of what a slot holds just before its I, the part still held after I and freed by its W,
    from the resident bytes around each I and W (nothing else frees or allocates in between)."""
    records = [(r[0], r[3]) for r in trace["records"]]
    before = {k: records[k - 1][1] if k else 0 for k in range(len(records))}
    kept = held = 0
    for k, (action, after) in enumerate(records):
        stage, kind, mb = _split(action)
        if kind == "I":
            w = next(j for j in range(k + 1, len(records)) if _split(records[j][0]) == (stage, "W", mb))
            freed_by_w = before[w] - records[w][1]
            kept += freed_by_w
            held += before[k] - after + freed_by_w
    return kept / held if held else float("nan")


def _split(action: str) -> tuple[str, str, str]:
    import re
    stage, kind, mb = re.match(r"(\d+)([A-Z_]+)(\d+)", action).groups()
    return stage, kind, mb


@pytest.mark.parametrize("world", [2])
def test_w_fraction_is_measured(world):
    """Reported, not asserted to a value: what autograd keeps for W after I, for this model."""
    per_rank = run_cases(world)
    index = {str(c): i for i, c in enumerate(CASES)}
    fractions = []
    for r in range(world):
        frac = w_fraction(per_rank[r][index["zb-h1/v1/none"]]["trace"])
        fractions.append(frac)
        assert 0.0 < frac <= 1.0
    print(f"measured w_fraction per rank: {fractions}")
