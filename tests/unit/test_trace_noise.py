"""The simulated timeline's Chrome trace: no float noise as durations, no empty per_rank field."""
from __future__ import annotations

from pipeoffload import generate, lower
from pipeoffload.ir import Action, ActionKind
from pipeoffload.simulator import simulate
from pipeoffload.viz.chrome_trace import span_events, timeline_trace


def test_a_span_of_rounding_error_is_no_duration() -> None:
    # 0.1 + 0.2 - 0.3 is 5.6e-17: a receive the simulator ends "after" it starts by that much is instant
    recv, fwd = Action(ActionKind.RECV_F, 1, 0), Action(ActionKind.F, 1, 0)
    events = span_events(0, [(recv, 0.3, 0.1 + 0.2), (fwd, 0.1 + 0.2, 1.3)], scale=1e6)
    assert [e["name"] for e in events] == [str(fwd)]
    assert events[0]["dur"] == (1.3 - (0.1 + 0.2)) * 1e6


def test_the_trace_metadata_has_no_null_per_rank() -> None:
    timeline = simulate(lower(generate("1f1b", 4, 8)))
    other = timeline_trace(timeline)["otherData"]
    assert "per_rank" not in other and other["makespan"] == timeline.makespan


def test_a_costs_file_trace_says_its_times_are_per_stage(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from pipeoffload.cli import main

    costs, trace = tmp_path / "c.json", tmp_path / "t.json"
    costs.write_text(json.dumps({"time_f": 1, "time_i": 1, "time_w": 1}))
    assert main(["simulate", "1f1b", "--costs", str(costs), "--trace", str(trace)]) == 0
    note = json.loads(trace.read_text())["otherData"]["time_unit"]
    assert "per stage" in note and "--time-f 1" not in note


def test_trace_compare_refuses_json_nested_too_deep(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from pipeoffload.cli import main

    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    assert main(["trace", "compare", str(deep)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nested too deeply" in err[0]
