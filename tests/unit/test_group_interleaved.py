"""group-interleaved (PipeOffload's interleaved 1F1B): order, validity, memory and bubble formulas.

Uniform costs F = I = W = 1 per stage and zero communication, as the formulas assume.
Regenerate golden files with ``python -m tests.regen_golden``.
"""
from __future__ import annotations

import pytest

from pipeoffload.errors import ConfigError
from pipeoffload.ir import ActionKind as K
from pipeoffload.schedules import generate
from pipeoffload.simulator import simulate
from pipeoffload.validation import validate
from tests.conftest import check_golden


def _spec_order(text: str, rank: int, d: int) -> list[str]:
    """The spec's worked example ``F<mb>-<chunk>`` -> our text form ``{chunk*d+rank}{F|I|W}{mb}``."""
    out = []
    for token in text.split():
        kind, rest = token[0], token[1:]
        mb, chunk = (int(x) for x in rest.split("-"))
        out.append(f"{chunk * d + rank}{'I' if kind == 'B' else kind}{mb}")
    return out


def test_matches_the_reference_order_of_the_worked_example() -> None:
    # d = 4, v = 2, g = 2, m = 8, as printed by the reference scheduler (spec section c3)
    rank0 = ("F0-0 F1-0 F0-1 F1-1 F2-0 F3-0 B0-1 W0-1 F2-1 B1-1 W1-1 F3-1 B0-0 W0-0 F4-0 B1-0 W1-0 F5-0 "
             "B2-1 W2-1 F4-1 B3-1 W3-1 F5-1 B2-0 W2-0 F6-0 B3-0 W3-0 F7-0 B4-1 W4-1 F6-1 B5-1 W5-1 F7-1 "
             "B4-0 W4-0 B5-0 W5-0 B6-1 W6-1 B7-1 W7-1 B6-0 W6-0 B7-0 W7-0")
    rank3 = ("F0-0 F1-0 F0-1 B0-1 W0-1 F1-1 B1-1 W1-1 F2-0 B0-0 W0-0 F3-0 B1-0 W1-0 F2-1 B2-1 W2-1 F3-1 "
             "B3-1 W3-1 F4-0 B2-0 W2-0 F5-0 B3-0 W3-0 F4-1 B4-1 W4-1 F5-1 B5-1 W5-1 F6-0 B4-0 W4-0 F7-0 "
             "B5-0 W5-0 F6-1 B6-1 W6-1 F7-1 B7-1 W7-1 B6-0 W6-0 B7-0 W7-0")
    schedule = generate("group-interleaved", 4, 8, 2, group_size=2)
    assert [str(a) for a in schedule[0]] == _spec_order(rank0, 0, 4)
    assert [str(a) for a in schedule[3]] == _spec_order(rank3, 3, 4)
    assert simulate(schedule).per_rank[0].peak_activation_units == 6  # g(v-1) + d


@pytest.mark.parametrize("d,m,v,g", [(4, 8, 2, 2), (4, 8, 2, 4), (3, 7, 3, 2), (2, 3, 1, 1), (4, 6, 2, 1)])
def test_matches_golden_text(d: int, m: int, v: int, g: int) -> None:
    check_golden(f"group-interleaved_d{d}_m{m}_v{v}_g{g}.txt", generate("group-interleaved", d, m, v, group_size=g).to_text())


@pytest.mark.parametrize("d", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("v", [1, 2, 3])
def test_valid_and_deadlock_free_for_every_group_size_and_microbatch_count(d: int, v: int) -> None:
    for g in range(1, d + 1):
        for m in sorted({1, max(1, g - 1), g, 2 * g + 1, 4 * d}):
            for backward in ("split", "full"):
                schedule = generate("group-interleaved", d, m, v, group_size=g, backward=backward)
                validate(schedule)
                timeline = simulate(schedule)  # raises DeadlockError if the order cannot run
                assert all(r.busy == 3 * m * v for r in timeline.per_rank)  # F + I + W = F + B = 3


def _idle_bound(d: int, v: int, g: int, m: int) -> int:
    return 2 * (d - 1) + (d - g) * (v - 1) + ((g - m % g) % g) * (v - 1)


@pytest.mark.parametrize("d", [2, 3, 4, 5, 6, 8, 12, 16])
@pytest.mark.parametrize("v", [1, 2, 3, 4])
def test_peak_and_idle_formulas_at_m_4d(d: int, v: int) -> None:
    m = 4 * d
    for g in sorted({(d + 1) // 2, d}):
        timeline = simulate(generate("group-interleaved", d, m, v, group_size=g))
        assert timeline.per_rank[0].peak_activation_units == g * (v - 1) + d
        for r in timeline.per_rank:
            assert timeline.makespan - r.busy <= _idle_bound(d, v, g, m)


@pytest.mark.parametrize("d", [2, 4, 6, 8])
def test_idle_formula_is_exact_whenever_groups_are_full(d: int) -> None:
    for v in (2, 3):
        for g in range((d + 1) // 2, d + 1):
            m = 3 * g
            timeline = simulate(generate("group-interleaved", d, m, v, group_size=g))
            assert timeline.per_rank[0].peak_activation_units <= g * (v - 1) + d
            assert max(timeline.makespan - r.busy for r in timeline.per_rank) == _idle_bound(d, v, g, m)


@pytest.mark.parametrize("d,v", [(4, 2), (8, 2), (4, 3), (6, 4)])
def test_full_groups_have_1f1b_memory(d: int, v: int) -> None:
    gis = simulate(generate("group-interleaved", d, 4 * d, v, group_size=d))
    one_f_one_b = simulate(generate("1f1b", d, 4 * d, 1))
    assert gis.per_rank[0].peak_rank_units == one_f_one_b.per_rank[0].peak_activation_units == d


def test_smaller_groups_lower_the_peak_and_cost_bubble() -> None:
    peaks, idles = [], []
    for g in (8, 6, 4):
        t = simulate(generate("group-interleaved", 8, 48, 2, group_size=g))
        peaks.append(t.per_rank[0].peak_activation_units)
        idles.append(max(t.makespan - r.busy for r in t.per_rank))
    assert peaks == [16, 14, 12] and idles == sorted(idles)


def test_full_backward_is_the_split_order_with_b_for_i_and_no_w() -> None:
    split = generate("group-interleaved", 4, 9, 3, group_size=3)
    full = generate("group-interleaved", 4, 9, 3, group_size=3, backward="full")
    for a, b in zip(split, full):
        expected = [x.__class__(K.B, x.stage, x.microbatch) if x.kind is K.I else x for x in a if x.kind is not K.W]
        assert list(b) == expected


def test_registered_under_its_alias_with_a_default_group_size() -> None:
    a = generate("PipeOffload", 5, 10, 2)
    b = generate("group-interleaved", 5, 10, 2, group_size=3)
    assert a.actions == b.actions and a.name == "group-interleaved"


@pytest.mark.parametrize("options", [{"group_size": 0}, {"group_size": 5}, {"backward": "fused"}])
def test_bad_options_raise_config_errors_that_say_the_fix(options: dict) -> None:
    with pytest.raises(ConfigError, match="group_size|backward"):
        generate("group-interleaved", 4, 8, 2, **options)
