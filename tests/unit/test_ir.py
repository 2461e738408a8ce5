import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeoffload import Action, ActionKind, Placement, Schedule, generate, lower
from pipeoffload.ir import act

actions = st.builds(Action, st.sampled_from(list(ActionKind)), st.integers(0, 300), st.integers(0, 10_000))


@given(actions)
def test_action_text_round_trips(a: Action) -> None:
    assert Action.parse(str(a)) == a


def test_action_text_form_matches_torch_pipelining() -> None:
    assert str(act("F", 2, 0)) == "2F0"
    assert str(act("OFFLOAD", 0, 5)) == "0OFFLOAD5"
    assert Action.parse("1SEND_F3") == Action(ActionKind.SEND_F, 1, 3)
    assert Action.parse(" 3RECV_B12 ") == Action(ActionKind.RECV_B, 3, 12)


@pytest.mark.parametrize("text", ["", "F0", "2X0", "2F", "-1F0", "2f0", "2F0x"])
def test_bad_action_text_names_the_form(text: str) -> None:
    with pytest.raises(ValueError, match="expected"):
        Action.parse(text)


@pytest.mark.parametrize("name,d,m,v", [("1f1b", 4, 6, 1), ("interleaved-1f1b", 3, 6, 2), ("gpipe", 2, 3, 2)])
def test_schedule_round_trips_through_text_json_csv(name: str, d: int, m: int, v: int) -> None:
    for schedule in (generate(name, d, m, v), lower(generate(name, d, m, v))):
        assert Schedule.from_text(schedule.to_text()).actions == schedule.actions
        assert Schedule.from_text(schedule.to_text()).placement == schedule.placement
        assert Schedule.from_json(schedule.to_json()) == schedule
        back = Schedule.from_csv(schedule.to_csv())
        assert back.actions == schedule.actions and back.num_microbatches == m


def test_csv_reads_torch_style_rows_with_bubbles() -> None:
    text = "0F0,0F1,,0B0,0B1\n,1F0,1B0,1F1,1B1\n"
    schedule = Schedule.from_csv(text)
    assert [str(a) for a in schedule[1]] == ["1F0", "1B0", "1F1", "1B1"]
    assert schedule.placement.kind == "loop" and schedule.num_microbatches == 2


def test_from_text_infers_v_placement() -> None:
    schedule = generate("gpipe", 2, 1, 1)
    assert schedule.placement == Placement.loop(2, 1)
    v_rows = "0F0 3F0 3B0 0B0\n1F0 2F0 2B0 1B0\n"
    assert Schedule.from_text(v_rows).placement.kind == "v"


def test_text_accepts_comments_and_blank_lines() -> None:
    schedule = Schedule.from_text("# rank 0\n0F0 0B0\n\n1F0 1B0  # rank 1\n")
    assert schedule.num_ranks == 2


def test_compute_only_strips_comm() -> None:
    schedule = generate("1f1b", 3, 4)
    assert lower(schedule).compute_only() == schedule
