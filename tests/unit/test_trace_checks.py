"""A runtime trace is checked before it is simulated: a duplicated or missing action, a rank without
events, a JSON-array trace and a file of NaN, answered alike by `trace compare` and `POST /api/trace`
(both read it with viz.trace_compare)."""
import json
import urllib.request
from pathlib import Path

import pytest

from pipeoffload import generate, lower
from pipeoffload.costs import CostModel
from pipeoffload.runtime.trace import Trace, TraceRecord, chrome_events
from pipeoffload.simulator import simulate
from tests.conftest import run_cli

HINT = "; expected the Chrome trace JSON of a run (python -m pipeoffload.runtime --trace FILE)"


def run_trace(d: int = 2, m: int = 4) -> dict:
    """A trace in the runtime's layout (``runtime.trace.chrome_events``) of a lowered, offloaded 1f1b,
    with the simulator's times standing in for measured ones (milliseconds)."""
    schedule = lower(generate("1f1b", d, m), offload="all")
    ones = (1.0,) * schedule.num_stages
    timeline = simulate(schedule, CostModel(time_f=ones, time_i=ones, time_w=ones))
    traces = [Trace(r, 0, [TraceRecord(a, s / 1e3, e / 1e3, 0) for a, s, e in timeline.events(r)], epoch=1000.0)
              for r in range(d)]
    return {"traceEvents": chrome_events(traces), "displayTimeUnit": "ms",
            "otherData": {"kind": "pipeoffload measured trace", "peak_bytes": {str(r): 0 for r in range(d)}}}


def _spans(data: dict) -> list[int]:
    return [i for i, e in enumerate(data["traceEvents"]) if e.get("ph") == "X"]


def duplicated(data: dict) -> dict:
    """The first three actions twice, as the probe's dup.json."""
    events = data["traceEvents"]
    first = _spans(data)[:3]
    return data | {"traceEvents": events[:first[-1] + 1] + [events[i] for i in first] + events[first[-1] + 1:]}


def missing_last_b(data: dict) -> dict:
    """Rank 0's last backward removed, as the probe's missing.json."""
    events = data["traceEvents"]
    last = max(i for i in _spans(data) if events[i]["args"]["rank"] == 0 and events[i]["cat"] in ("B", "I"))
    return data | {"traceEvents": events[:last] + events[last + 1:]}


def without_rank(data: dict, rank: int) -> dict:
    return data | {"traceEvents": [e for e in data["traceEvents"] if e.get("pid") != rank]}


def _post(base: str, body: bytes) -> dict:
    request = urllib.request.Request(base + "/api/trace", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


def _both(base: str, tmp_path: Path, body: bytes) -> tuple[str, str]:
    """(the CLI's one error line without its prefix, the API's error): each must refuse the file."""
    path = tmp_path / "run.json"
    path.write_bytes(body)
    out = tmp_path / "out.json"
    code, stdout, err = run_cli("trace", "compare", str(path), "-o", str(out))
    assert code == 2 and stdout == "" and len(err.splitlines()) == 1 and not out.exists(), (code, stdout, err)
    answer = _post(base, body)
    assert answer.get("status") == 400 and "\n" not in answer["error"], answer
    return err.strip().removeprefix("pipeoffload trace: error: "), answer["error"]


def test_an_intact_trace_is_read_by_both(base: str, tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run_trace()))
    code, out, _ = run_cli("trace", "compare", str(path), "-o", str(tmp_path / "out.json"))
    assert code == 0 and out.startswith("2 ranks: measured step 15.000 ms")
    assert _post(base, path.read_bytes())["measured_step_s"] == pytest.approx(0.015)


@pytest.mark.parametrize("broken,words", [
    (duplicated, "rank 0, step 1, action 0F0: duplicate 0F0"),
    (missing_last_b, "stage 0, microbatch 3 has no B"),
])
def test_a_duplicated_or_missing_action_is_refused_not_simulated(base: str, tmp_path: Path, broken, words) -> None:  # type: ignore[no-untyped-def]
    cli, api = _both(base, tmp_path, json.dumps(broken(run_trace())).encode())
    assert cli.startswith("the trace's actions are not the schedule of a run: ") and words in cli, cli
    assert api == cli + HINT


@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_without_events_is_named(base: str, tmp_path: Path, rank: int) -> None:
    cli, api = _both(base, tmp_path, json.dumps(without_rank(run_trace(), rank)).encode())
    assert f"rank {rank} has no events" in cli and "deadlock" not in cli, cli
    assert api == cli + HINT


def test_a_rank_without_events_is_named_without_the_runs_own_notes(base: str, tmp_path: Path) -> None:
    """No otherData: the last rank is found missing because rank 0 sends to a stage nobody runs."""
    data = without_rank(run_trace(), 1)
    del data["otherData"]
    cli, api = _both(base, tmp_path, json.dumps(data).encode())
    assert "0SEND_F0 sends to stage 1, which no rank in the trace runs" in cli and "no events" in cli, cli
    assert api == cli + HINT


def test_a_json_array_trace_is_read(base: str, tmp_path: Path) -> None:
    """The Chrome trace format's JSON Array Format: the events alone, as a list."""
    data = run_trace()
    path = tmp_path / "array.json"
    path.write_text(json.dumps(data["traceEvents"]))
    code, out, err = run_cli("trace", "compare", str(path), "-o", str(tmp_path / "out.json"))
    assert code == 0 and out.startswith("2 ranks: measured step 15.000 ms"), err
    assert _post(base, path.read_bytes())["measured_step_s"] == pytest.approx(0.015)


@pytest.mark.parametrize("ending", ["", ",", ",\n  \n"])
def test_a_json_array_trace_without_its_closing_bracket_is_read(base: str, tmp_path: Path, ending: str) -> None:
    """The array form may end without its ``]`` (a tracer stopped mid-write), and Perfetto reads it:
    so do ``trace compare`` and the playground (they answered "not JSON")."""
    text = json.dumps(run_trace()["traceEvents"], indent=1).rstrip().removesuffix("]").rstrip() + ending
    path = tmp_path / "open.json"
    path.write_text(text)
    code, out, err = run_cli("trace", "compare", str(path), "-o", str(tmp_path / "out.json"))
    assert code == 0 and out.startswith("2 ranks: measured step 15.000 ms"), err
    assert _post(base, path.read_bytes())["measured_step_s"] == pytest.approx(0.015)


def test_a_truncated_event_is_still_refused_with_the_files_own_error(base: str, tmp_path: Path) -> None:
    text = json.dumps(run_trace()["traceEvents"])[:-40]  # cut inside the last event
    cli, api = _both(base, tmp_path, text.encode())
    assert cli.startswith(f"RUN_TRACE {tmp_path / 'run.json'}: not JSON (") and "not JSON (" in api, (cli, api)


@pytest.mark.parametrize("body", [b"NaN", b"-Infinity", b'{"traceEvents": [{"ph": "X", "name": "0F0", "ts": NaN}]}'])
def test_nan_gets_the_same_words_from_the_cli_and_the_api(base: str, tmp_path: Path, body: bytes) -> None:
    cli, api = _both(base, tmp_path, body)
    assert cli.startswith("the file is not strict JSON (") and "NaN or Infinity" in cli, cli
    assert api == cli + HINT
