import pytest

from pipeoffload import ConfigError, Placement


def test_loop_placement() -> None:
    p = Placement.loop(4, 2)
    assert p.stage_to_rank == (0, 1, 2, 3, 0, 1, 2, 3)
    assert p.stages_of(1) == (1, 5) and p.rank_of(6) == 2 and p.local_index(5) == 1
    assert p.num_stages == 8 and p.stages_per_rank == 2


def test_v_placement_rank_r_holds_r_and_2d_minus_1_minus_r() -> None:
    d = 4
    p = Placement.v(d)
    for r in range(d):
        assert p.stages_of(r) == (r, 2 * d - 1 - r)


def test_custom_placement_recognises_known_shapes() -> None:
    assert Placement.custom([0, 1, 1, 0]).kind == "v"
    assert Placement.custom([0, 1, 0, 1]).kind == "loop"
    assert Placement.custom([1, 0]).kind == "custom"


@pytest.mark.parametrize("call", [lambda: Placement.loop(0), lambda: Placement.v(2, 3),
                                  lambda: Placement.custom([0, 5], num_ranks=2)])
def test_bad_placements_raise_config_error(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError):
        call()
