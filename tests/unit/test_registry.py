"""Registry-wide properties: every family, over a grid of sizes, either produces a schedule that
validates, lowers and simulates without deadlock, or refuses with a ConfigError naming the rule."""
import itertools

import pytest

from pipeoffload import ConfigError, generate, lower, schedule_names, simulate, validate
from pipeoffload.costs import CostModel
from pipeoffload.schedules import get_spec

RANKS = (1, 2, 3, 4, 8)
STAGES_PER_RANK = (1, 2, 4)
GRID = [(d, m, v) for d in RANKS for m in range(1, 3 * d + 1) for v in STAGES_PER_RANK]


@pytest.mark.parametrize("name", schedule_names())
def test_every_configuration_is_valid_or_refused_clearly(name: str) -> None:
    accepted = 0
    costs = CostModel.uniform(1.0, 1.0, 1.0, p2p=0.25)
    for d, m, v in GRID:
        try:
            schedule = generate(name, d, m, v)
        except ConfigError as err:
            assert "=" in str(err) and len(str(err).splitlines()) == 1, f"{name} {d=} {m=} {v=}: {err}"
            continue
        accepted += 1
        assert (schedule.num_ranks, schedule.num_microbatches) == (d, m)
        validate(schedule)
        lowered = lower(schedule)
        timeline = simulate(lowered, costs)
        compute = simulate(schedule, costs)
        # implicit transfers of a compute-only schedule time exactly like explicit SEND/RECV
        assert timeline.makespan == pytest.approx(compute.makespan), (name, d, m, v)
        assert all(r.memory[-1][1] == 0 for r in timeline.per_rank if r.memory), "activations left at end"
    assert accepted > len(GRID) // 4, f"{name} refuses most of the grid"


def test_names_are_case_insensitive_and_misses_list_valid_names() -> None:
    assert generate("1F1B", 2, 2).name == generate("1f1b", 2, 2).name
    with pytest.raises(ConfigError, match="valid names: .*1f1b"):
        generate("one-f-one-b", 2, 2)


def test_unknown_options_are_refused() -> None:
    with pytest.raises(ConfigError, match="does not take group_size"):
        generate("1f1b", 2, 2, 1, group_size=3)


@pytest.mark.parametrize("bad", [dict(num_ranks=0), dict(num_microbatches=0), dict(stages_per_rank=0)])
def test_non_positive_sizes_are_refused(bad: dict) -> None:
    sizes = dict(num_ranks=2, num_microbatches=2, stages_per_rank=1) | bad
    with pytest.raises(ConfigError, match=">= 1"):
        generate("gpipe", **sizes)


def test_every_family_documents_itself() -> None:
    for name in schedule_names():
        spec = get_spec(name)
        assert spec.summary and spec.generator.__doc__, name


def test_grid_covers_non_divisible_microbatches() -> None:
    assert any(m % d for d, m, _ in GRID if d > 1)
    assert set(itertools.chain(*((d,) for d, _, _ in GRID))) == set(RANKS)
