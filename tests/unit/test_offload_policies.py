"""Offload and recompute policies: text forms, errors that list the valid forms, round trips."""
from __future__ import annotations

import pytest

from pipeoffload.errors import ConfigError
from pipeoffload.policies import LGD_SAVING, LGD_TIME, OffloadPolicy, RecomputePolicy


@pytest.mark.parametrize("text,expected", [
    ("none", OffloadPolicy("none")),
    ("ALL", OffloadPolicy("all")),
    ("first:2", OffloadPolicy("first", count=2)),
    ("auto", OffloadPolicy("auto")),
    ("budget:6", OffloadPolicy("budget", budget=6.0)),
    ("budget:1.5rank", OffloadPolicy("budget", budget=1.5, rank_units=True)),
    (None, OffloadPolicy("none")),
])
def test_offload_forms(text: str | None, expected: OffloadPolicy) -> None:
    policy = OffloadPolicy.parse(text)
    assert policy == expected
    assert OffloadPolicy.parse(str(policy)) == policy
    assert OffloadPolicy.parse(policy) is policy


def test_budget_in_rank_units_scales_by_stages_per_rank() -> None:
    assert OffloadPolicy.parse("budget:2rank").budget_units(3) == 6
    assert OffloadPolicy.parse("budget:2").budget_units(3) == 2


@pytest.mark.parametrize("text", ["some", "first", "first:0", "first:x", "budget", "budget:-1", "all:2"])
def test_bad_offload_forms_list_the_valid_ones(text: str) -> None:
    with pytest.raises(ConfigError, match="first:K"):
        OffloadPolicy.parse(text)


@pytest.mark.parametrize("text,kind,count,partial", [
    ("none", "none", 0, (0.0, 0.0)),
    ("all", "all", 0, (0.0, 0.0)),
    ("first:1", "first", 1, (0.0, 0.0)),
    ("auto", "auto", 0, (0.0, 0.0)),
    ("lgd", "none", 0, (LGD_SAVING, LGD_TIME)),
    ("first:2,lgd", "first", 2, (LGD_SAVING, LGD_TIME)),
    ("auto,partial", "auto", 0, (LGD_SAVING, LGD_TIME)),
    ("partial:0.3:0.1", "none", 0, (0.3, 0.1)),
])
def test_recompute_forms(text: str, kind: str, count: int, partial: tuple[float, float]) -> None:
    policy = RecomputePolicy.parse(text)
    assert (policy.kind, policy.count, (policy.partial_saving, policy.partial_time)) == (kind, count, partial)
    assert RecomputePolicy.parse(str(policy)) == policy


@pytest.mark.parametrize("text", ["first:1,auto", "partial:1.5:0", "partial:0.2", "everything", "first:-2"])
def test_bad_recompute_forms_raise(text: str) -> None:
    with pytest.raises(ConfigError):
        RecomputePolicy.parse(text)
