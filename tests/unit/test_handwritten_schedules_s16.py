"""A researcher's hand-written schedule is validated data: each mistake is refused with one line naming the
rank, the step, the action as the text form writes it and the rule (a ``ScheduleError`` adds its grid below
that line); a valid hand-written schedule round-trips and simulates as the generated one it copies."""
import json

import pytest

from pipeoffload import Schedule, generate, lower, simulate, validate
from pipeoffload.errors import ConfigError, ScheduleError
from pipeoffload.ir import Action

GOOD = {"name": "mine", "num_microbatches": 2, "placement": [0, 1],
        "actions": [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]]}


def _load_and_check(text: str) -> None:
    schedule = Schedule.from_json(text) if text.startswith("{") or text.startswith("[") else Schedule.from_text(text)
    validate(schedule)
    simulate(schedule)


@pytest.mark.parametrize("text,expected", [
    # text form: what cannot be read names the rank and step
    ("0F0 0F1 0X0 0B0 0B1\n1F0 1B0 1F1 1B1\n", "rank 0, step 2: cannot parse action '0X0'"),
    ("0F0 0f1 0B0 0B1\n1F0 1B0 1F1 1B1\n", "rank 0, step 1: cannot parse action '0f1' (did you mean '0F1'?)"),
    ("0F0 0B0\n1F0 1F-1 1B0\n", "rank 1, step 1: cannot parse action '1F-1'"),
    ("0F0 0F1 1B0 0B0 0B1\n1F0 1B0 1F1 1B1\n",
     "rank 1, step 0, action 1F0: stage 1 also has 1B0 on rank 0 (step 2): all of a stage's actions go on one"),
    ("0F0 0F1 0B0 0B1\n2F0 2B0 2F1 2B1\n",
     "stages used are not 0..S-1: stage 1 has no actions but stage 2 has (rank 1, step 0, action 2F0)"),
    ("# nothing yet\n\n", "the schedule has no actions"),
    # JSON: a field of the wrong type names the field
    (json.dumps({**GOOD, "num_microbatches": 0, "actions": [[], []]}), "num_microbatches=0: must be an integer >= 1"),
    (json.dumps({**GOOD, "num_microbatches": "two"}), "num_microbatches='two': must be an integer >= 1"),
    (json.dumps({**GOOD, "num_microbatches": 2.5}), "num_microbatches=2.5: must be an integer >= 1"),
    (json.dumps({**GOOD, "num_microbatches": True}), "num_microbatches=True: must be an integer >= 1"),
    (json.dumps({**GOOD, "placement": "loop"}), "placement='loop': give the rank of each stage"),
    (json.dumps({**GOOD, "name": 5}), "name=5: must be text"),
    (json.dumps({**GOOD, "actions": "0F0 0B0"}), "actions='0F0 0B0': give one list per rank"),
    (json.dumps({**GOOD, "actions": [["0F0", 1], []]}), "rank 0, step 1: cannot parse action 1"),
    (json.dumps({**GOOD, "actions": GOOD["actions"][:1]}), "placement [0, 1] puts stages on ranks up to 1 but "
                                                           "actions has 1 rank list(s)"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "actions"} | {"action": GOOD["actions"]}),
     "without the field(s) actions (it has 'action': a misspelling?)"),
])
def test_a_malformed_schedule_is_one_config_error_line(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        _load_and_check(text)
    assert expected in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("text,expected", [
    ("0F0 0F1 0F1 0B0 0B1\n1F0 1B0 1F1 1B1\n",
     "rank 0, step 2, action 0F1: duplicate 0F1: it already ran at step 1 on this rank"),
    ("0F0 0F1 0I0 0W0 0I1\n1F0 1I0 1F1 1I1 1W0 1W1\n", "rank 0, step 1, action 0F1: stage 0, microbatch 1 has no W"),
    ("0F0 0B0 0F1 0B1\n1B0 1F0 1F1 1B1\n", "rank 1, step 0, action 1B0: backward of stage 1, microbatch 0 runs before"),
    ("0F0 0F1 0RELOAD0 0B0 0B1\n1F0 1B0 1F1 1B1\n", "action 0RELOAD0: RELOAD of stage 0, microbatch 0 must come after"),
    ("0F0 0F1 0B0 0OFFLOAD0 0B1\n1F0 1B0 1F1 1B1\n", "action 0OFFLOAD0: OFFLOAD of stage 0, microbatch 0 must come"),
    ("0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1\n1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1\n",
     "rank 1, step 0, action 1F0: F of stage 1, microbatch 0 runs before its RECV_F (1RECV_F0)"),
    # valid on each rank, deadlocked across them
    ("0F0 0SEND_F0 0RECV_B0 0B0 0F1 0SEND_F1 0RECV_B1 0B1\n1RECV_F1 1F1 1B1 1SEND_B1 1RECV_F0 1F0 1B0 1SEND_B0\n",
     "rank 0, step 2, action 0RECV_B0: comm order deadlocks"),
    (json.dumps({**GOOD, "num_microbatches": 1}), "rank 0, step 1, action 0F1: 0F1 is outside stages 0..1"),
])
def test_a_broken_schedule_is_refused_at_its_rank_step_and_action(text: str, expected: str) -> None:
    with pytest.raises(ScheduleError) as err:
        _load_and_check(text)
    assert expected in str(err.value).splitlines()[0]


def test_a_schedule_too_large_is_refused_before_it_is_parsed() -> None:
    text = "0F0 0B0\n" * 3
    with pytest.raises(ConfigError, match="the schedule has 6 actions, above the limit of 5"):
        Schedule.from_text(text, max_actions=5)
    with pytest.raises(ConfigError, match="the schedule has 6 actions, above the limit of 5"):
        Schedule.from_csv(text.replace(" ", ","), max_actions=5)
    with pytest.raises(ConfigError, match="above the limit of 3"):
        Schedule.from_json(json.dumps(GOOD), max_actions=3)
    assert Schedule.from_json(json.dumps(GOOD), max_actions=None).num_actions() == 8


def test_action_parse_of_a_non_text_is_one_line_not_an_attribute_error() -> None:
    with pytest.raises(ConfigError, match="cannot parse action 5"):
        Action.parse(5)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["zb-h1", "1f1b"])
def test_a_hand_written_copy_round_trips_and_simulates_as_the_generated_one(name: str) -> None:
    generated = generate(name, 3, 4)
    mine = Schedule.from_text("# my copy\n" + generated.to_text(), name="mine")
    for back in (Schedule.from_json(mine.to_json()), Schedule.from_text(mine.to_text(), name="mine"),
                 Schedule.from_csv(mine.to_csv(), name="mine")):
        assert back == mine
    assert mine.actions == generated.actions and mine.placement == generated.placement
    for a, b in ((mine, generated), (lower(mine, offload="all"), lower(generated, offload="all"))):
        assert a.actions == b.actions
        ta, tb = simulate(a), simulate(b)
        assert (ta.start, ta.end, ta.makespan, ta.per_rank) == (tb.start, tb.end, tb.makespan, tb.per_rank)
        assert Schedule.from_json(a.to_json()).actions == a.actions
