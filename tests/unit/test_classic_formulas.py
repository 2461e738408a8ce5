"""The closed forms of the classic schedules under uniform costs (F = I = W = 1, zero comm)."""
import pytest

from pipeoffload import generate, lower, simulate

SIZES = [(d, m) for d in (1, 2, 3, 4, 8) for m in (1, 2, 3, d, 2 * d + 1, 4 * d)]


@pytest.mark.parametrize("name", ["1f1b", "gpipe"])
@pytest.mark.parametrize("d,m", SIZES)
def test_makespan_and_bubble(name: str, d: int, m: int, unit_costs) -> None:  # type: ignore[no-untyped-def]
    timeline = simulate(lower(generate(name, d, m)), unit_costs)
    assert timeline.makespan == 3 * (m + d - 1)
    assert timeline.bubble_ratio == pytest.approx((d - 1) / (m + d - 1))


@pytest.mark.parametrize("d,m", SIZES)
def test_1f1b_peak_on_rank_r_is_min_d_minus_r_m(d: int, m: int, unit_costs) -> None:  # type: ignore[no-untyped-def]
    timeline = simulate(lower(generate("1f1b", d, m)), unit_costs)
    assert [r.peak_activation_units for r in timeline.per_rank] == [min(d - r, m) for r in range(d)]


@pytest.mark.parametrize("d,m", SIZES)
def test_gpipe_peak_is_m(d: int, m: int, unit_costs) -> None:  # type: ignore[no-untyped-def]
    timeline = simulate(lower(generate("gpipe", d, m)), unit_costs)
    assert all(r.peak_activation_units == m for r in timeline.per_rank)


@pytest.mark.parametrize("d", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("v", [1, 2, 3, 4])
@pytest.mark.parametrize("rounds", [1, 2, 4])
def test_interleaved_bubble(d: int, v: int, rounds: int, unit_costs) -> None:  # type: ignore[no-untyped-def]
    m = rounds * d
    timeline = simulate(lower(generate("interleaved-1f1b", d, m, v)), unit_costs)
    assert timeline.bubble_ratio == pytest.approx((d - 1) / (v * m + d - 1))


def test_interleaved_peak_matches_megatron_warmup(unit_costs) -> None:  # type: ignore[no-untyped-def]
    d, v = 8, 2
    timeline = simulate(generate("interleaved-1f1b", d, 4 * d, v), unit_costs)
    assert timeline.per_rank[0].peak_activation_units == (v - 1) * d + 2 * (d - 1) + 1


def test_interleaved_refuses_uneven_rounds_naming_the_rule() -> None:
    with pytest.raises(ValueError, match="num_microbatches=7.*multiple of num_ranks=3"):
        generate("interleaved-1f1b", 3, 7, 2)


def test_1f1b_refuses_several_stages_per_rank() -> None:
    with pytest.raises(ValueError, match="stages_per_rank=2.*interleaved"):
        generate("1f1b", 4, 8, 2)
