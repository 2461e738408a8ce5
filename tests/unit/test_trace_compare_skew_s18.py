"""``trace compare`` compares like with like: the simulation starts every rank at 0 with its first action,
so each measured rank is timed from its own first action, and what the shared clock adds (the time in a
step before its first action, one rank starting after another) is reported apart. The trace is written
by the runtime's own writer from records whose times are set by hand, so every figure is known."""
import json
from pathlib import Path

import pytest

from pipeoffload import generate, lower
from pipeoffload.cli import main
from pipeoffload.runtime.trace import Trace, TraceRecord, write_chrome_trace

MS = 1e-3


def _trace(rank: int, row: list, epoch: float, setup: float) -> Trace:
    """Rank ``rank`` running ``row`` one action per millisecond from ``setup`` s after its step start,
    its step ending 2 ms after its last action."""
    records = [TraceRecord(a, setup + i * MS, setup + (i + 1) * MS, 0) for i, a in enumerate(row)]
    return Trace(rank, 1, records, wall=setup + len(row) * MS + 2 * MS, epoch=epoch)


def test_each_rank_is_timed_from_its_own_first_action(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    schedule = lower(generate("1f1b", 2, 4))
    n0, n1 = (len(row) for row in schedule.actions)
    # rank 1's step starts first; rank 0's 5 ms later, and it spends 20 ms before its first action
    # (rank 1: 10 ms): on the shared clock rank 0's first action is at 25 ms, rank 1's at 10 ms
    traces = [_trace(0, list(schedule.actions[0]), 1000.005, 20 * MS),
              _trace(1, list(schedule.actions[1]), 1000.0, 10 * MS)]
    path, out = tmp_path / "run.json", tmp_path / "both.json"
    write_chrome_trace(traces, str(path))
    assert main(["trace", "compare", str(path), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    other = json.loads(out.read_text())["otherData"]
    rank0, rank1 = other["per_rank"]
    assert rank0["measured_span_s"] == pytest.approx(n0 * MS)  # not its 25 ms + n0 ms end on the shared clock
    assert rank1["measured_span_s"] == pytest.approx(n1 * MS)
    assert rank0["measured_end_s"] == pytest.approx((25 + n0) * MS)  # where Perfetto draws it, as before
    assert (rank0["start_skew_s"], rank1["start_skew_s"]) == pytest.approx((15 * MS, 0.0))
    assert other["start_skew_s"] == pytest.approx(15 * MS)
    assert other["measured_step_s"] == pytest.approx(max(25 + n0, 10 + n1) * MS - 10 * MS)
    assert rank0["wall_s"] == pytest.approx((20 + n0 + 2) * MS)
    assert rank0["outside_actions_s"] == pytest.approx(22 * MS)  # its setup and the 2 ms after its last action
    assert f"rank 0: measured {n0:.3f} ms from its first action" in text
    assert "first action 15.000 ms after the first rank's" in text
    assert "22.000 ms of it outside its actions" in text
    assert f"measured step {max(15 + n0, n1):.3f} ms" in text


def test_a_trace_without_step_times_reports_the_spans_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The JSON Array Format (the events alone, no ``otherData``): no runtime step time to set beside."""
    schedule = lower(generate("1f1b", 2, 2))
    traces = [_trace(r, list(row), 1000.0, 3 * MS) for r, row in enumerate(schedule.actions)]
    path = tmp_path / "run.json"
    write_chrome_trace(traces, str(path))
    events = tmp_path / "events.json"
    events.write_text(json.dumps(json.loads(path.read_text())["traceEvents"]))
    assert main(["trace", "compare", str(events), "-o", str(tmp_path / "both.json")]) == 0
    text = capsys.readouterr().out
    assert "outside its actions" not in text
    other = json.loads((tmp_path / "both.json").read_text())["otherData"]
    assert [r["measured_span_s"] for r in other["per_rank"]] == pytest.approx([len(row) * MS for row in schedule.actions])
    assert other["start_skew_s"] == 0.0 and "wall_s" not in other["per_rank"][0]
