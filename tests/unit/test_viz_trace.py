"""Runtime traces: named processes and lanes, memory counters, and `trace compare` laying a real
measured run (one rank, two stages, full offload) above its simulation."""
import json
from pathlib import Path

import pytest

from pipeoffload import generate, lower
from pipeoffload.cli import main
from pipeoffload.models import sample_batch
from pipeoffload.runtime import write_chrome_trace
from pipeoffload.viz.chrome_trace import SIM_PID_BASE
from tests.unit.test_runtime_executor import CFG, _runner


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> tuple[Path, object]:  # type: ignore[no-untyped-def]
    """One real step, traced once for the module (a runner step takes seconds on a loaded machine)."""
    tmp_path = tmp_path_factory.mktemp("trace")
    schedule = lower(generate("interleaved-1f1b", 1, 4, 2), offload="all")
    runner, _ = _runner(schedule)
    runner.step(*sample_batch(CFG, 8, seed=1))
    path = tmp_path / "run.json"
    write_chrome_trace([runner.trace], str(path))
    return path, runner.trace


def test_runtime_trace_names_lanes_and_counts_memory(measured) -> None:  # type: ignore[no-untyped-def]
    path, trace = measured
    data = json.loads(path.read_text())
    events = data["traceEvents"]
    meta = {(e["name"], e.get("tid")): e["args"] for e in events if e["ph"] == "M"}
    assert meta[("process_name", None)]["name"].startswith("measured rank 0")
    assert {meta[("thread_name", t)]["name"] for t in (0, 1, 2)} == {"compute", "copy", "comm"}
    spans = [e for e in events if e["ph"] == "X"]
    assert [e["args"]["action"] for e in sorted(spans, key=lambda e: e["args"]["index"])] == \
        [str(a) for a in trace.actions()]  # type: ignore[attr-defined]
    assert {e["tid"] for e in spans if e["cat"] in ("OFFLOAD", "RELOAD")} == {1}
    counters = [e["args"]["MiB"] for e in events if e["ph"] == "C"]
    assert max(counters) > 0 and data["otherData"]["peak_bytes"]["0"] == trace.peak_bytes  # type: ignore[attr-defined]


def test_trace_compare_puts_the_measured_run_above_its_simulation(measured, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path, trace = measured
    out = tmp_path / "both.json"
    assert main(["trace", "compare", str(path), "-o", str(out)]) == 0
    assert "measured step" in capsys.readouterr().out
    events = json.loads(out.read_text())["traceEvents"]
    order = {e["pid"]: e["args"]["sort_index"] for e in events if e["name"] == "process_sort_index"}
    assert order == {0: 0, SIM_PID_BASE: 1}  # measured first, then simulated
    actions = [str(a) for a in trace.actions()]  # type: ignore[attr-defined]
    measured = sorted(e["args"]["action"] for e in events if e["ph"] == "X" and e["pid"] == 0)
    simulated = sorted(e["args"]["action"] for e in events if e["ph"] == "X" and e["pid"] == SIM_PID_BASE)
    assert measured == simulated == sorted(actions)
    assert any(e["ph"] == "C" and e["pid"] == SIM_PID_BASE and e["name"].startswith("host memory") for e in events)


def test_trace_compare_rejects_what_is_not_a_trace(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.json"
    bad.write_text("{\"traceEvents\": []}")
    assert main(["trace", "compare", str(bad)]) == 2
    assert "no actions" in capsys.readouterr().err
    assert main(["trace", "compare", str(tmp_path / "missing.json")]) == 2


def test_ranks_share_one_clock_from_their_step_starts(measured, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Each rank's records count from its own step start; its wall-clock start (``epoch``) puts the ranks
    on one time axis, so a rank that started 0.25 s later is drawn 0.25 s to the right."""
    from dataclasses import replace

    from pipeoffload.runtime.trace import Trace, chrome_events
    _, trace = measured
    assert trace.epoch > 1.6e9  # a real wall-clock time was recorded at the step start
    early = replace(trace, rank=0, epoch=1000.0)
    late = replace(trace, rank=1, epoch=1000.25)
    events = chrome_events([early, late])
    first = {r: min(e["ts"] for e in events if e["ph"] == "X" and e["pid"] == r) for r in (0, 1)}
    assert first[1] - first[0] == pytest.approx(0.25e6)
    assert Trace.from_dict(late.as_dict()).epoch == 1000.25
    path = tmp_path / "two.json"
    write_chrome_trace([early, late], str(path))
    assert json.loads(path.read_text())["otherData"]["clock"].startswith("shared")
    unsynced = [replace(early, epoch=0.0), late]  # an older trace without epochs: each rank from its own start
    old = chrome_events(unsynced)
    assert min(e["ts"] for e in old if e["ph"] == "X" and e["pid"] == 1) == pytest.approx(first[0])


def test_trace_compare_refuses_to_write_over_its_input(measured, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Probe C 2.1: ``-o`` naming RUN_TRACE itself (under any spelling) would replace the only copy of the
    measured trace with the merged one; it is refused and the trace is left as it was."""
    path, _ = measured
    run = tmp_path / "r.json"
    run.write_bytes(path.read_bytes())
    for out in (run, tmp_path / "." / "r.json"):
        assert main(["trace", "compare", str(run), "-o", str(out)]) == 2
        err = capsys.readouterr().err
        assert "-o" in err and "is RUN_TRACE" in err and len(err.splitlines()) == 1, err
    assert run.read_bytes() == path.read_bytes()


def test_trace_compare_refuses_an_output_that_is_not_json(measured, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    path, _ = measured
    assert main(["trace", "compare", str(path), "-o", str(tmp_path / "out.png")]) == 2
    assert ".json" in capsys.readouterr().err
    assert not (tmp_path / "out.png").exists()
