"""Pictures and traces: real files with the content a viewer needs, written atomically."""
import json
from pathlib import Path

import pytest

from pipeoffload import CostModel, generate, lower, simulate
from pipeoffload.cli import main
from pipeoffload.fileio import write_atomic
from pipeoffload.ir import ActionKind
from pipeoffload.viz.chrome_trace import timeline_trace
from tests.unit.test_simulate import _offload_everything


@pytest.fixture(scope="module")
def timeline():  # type: ignore[no-untyped-def]
    schedule = lower(_offload_everything(generate("interleaved-1f1b", 2, 4, 2)))
    return simulate(schedule, CostModel.uniform(p2p=0.1).with_offload_ratio(0.5))


def test_chrome_trace_has_every_timed_action_and_memory_counters(timeline) -> None:  # type: ignore[no-untyped-def]
    events = timeline_trace(timeline)["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    timed = [a for r in range(2) for a, s, e in timeline.events(r) if e > s or a.kind not in
             (ActionKind.SEND_F, ActionKind.SEND_B, ActionKind.RECV_F, ActionKind.RECV_B)]
    assert len(spans) == len(timed)
    assert {e["tid"] for e in spans if e["cat"] == "OFFLOAD"} == {1}  # copies on their own lane
    device = [e for e in events if e["ph"] == "C" and e["name"].startswith("device memory")]
    host = [e for e in events if e["ph"] == "C" and e["name"].startswith("host memory")]
    assert max(e["args"]["rank units"] for e in device) == timeline.peak_rank_units
    assert max(e["args"]["rank units"] for e in host) == timeline.peak_host_units / 2
    names = {(e["pid"], e["args"]["name"]) for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {(0, "simulated rank 0 (1 t shown as 1 s)"), (1, "simulated rank 1 (1 t shown as 1 s)")}
    lanes = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert lanes == {"compute", "copy", "comm"}
    json.dumps(events)


def test_cli_writes_plot_trace_report(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    png, svg, trace, report = (tmp_path / n for n in ("a.png", "a.svg", "t.json", "r.html"))
    assert main(["simulate", "1f1b", "-d", "2", "-m", "3", "--plot", str(png), "--trace", str(trace),
                 "--report", str(report)]) == 0
    assert main(["simulate", "gpipe", "-d", "2", "-m", "2", "--plot", str(svg)]) == 0
    assert png.read_bytes().startswith(b"\x89PNG")
    assert b"<svg" in svg.read_bytes()[:500]
    assert json.loads(trace.read_text())["traceEvents"]
    assert "<img" in report.read_text() and "1f1b" in report.read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary files left


def test_bad_output_path_writes_nothing(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    trace = tmp_path / "t.json"
    code = main(["simulate", "1f1b", "--trace", str(trace), "--plot", str(tmp_path / "missing" / "a.png")])
    assert code == 2 and not trace.exists()
    assert "does not exist" in capsys.readouterr().err


def test_write_atomic_leaves_old_file_when_writing_fails(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    write_atomic(target, "old")

    with pytest.raises(TypeError):
        write_atomic(target, 12345)  # type: ignore[arg-type]
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]
