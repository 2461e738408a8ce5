"""Every trace pipeoffload writes follows the Trace Event Format as Perfetto and chrome://tracing read
it: a `traceEvents` list of M/X/C events only, every process and lane named, ts/dur finite microseconds
>= 0, counters with one numeric arg named by the unit in the counter's name, and no two spans on one
lane that partly overlap (a lane runs one action at a time; only a batched send/receive pair on the
comm lane shares one interval)."""
import json
import math
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from pipeoffload import generate, lower
from pipeoffload.costs import CostModel
from pipeoffload.runtime.trace import Trace, TraceRecord, write_chrome_trace
from pipeoffload.simulator import simulate
from pipeoffload.viz.chrome_trace import LANES
from pipeoffload.viz.trace_compare import compare_trace
from tests.conftest import run_cli

METADATA = {"process_name": "name", "process_sort_index": "sort_index", "thread_name": "name",
            "thread_sort_index": "sort_index"}


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def _metadata(events: list[dict]) -> tuple[set[int], set[tuple[int, int]]]:
    procs, threads = set(), set()
    for e in events:
        if e["ph"] != "M":
            continue
        assert e["name"] in METADATA and METADATA[e["name"]] in e["args"], e
        if e["name"] == "process_name":
            procs.add(e["pid"])
        elif e["name"] == "thread_name":
            threads.add((e["pid"], e["tid"]))
    return procs, threads


def check_trace(data: dict) -> None:
    """The Trace Event Format rules above; an AssertionError names the first event that breaks one."""
    assert isinstance(data, dict) and isinstance(data["traceEvents"], list) and data["displayTimeUnit"] == "ms"
    events = data["traceEvents"]
    procs, threads = _metadata(events)
    lanes: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        assert e["ph"] in ("M", "X", "C") and isinstance(e["name"], str) and isinstance(e["pid"], int), e
        if e["ph"] == "M":
            continue
        assert _finite(e["ts"]) and e["pid"] in procs, e
        if e["ph"] == "X":
            assert _finite(e["dur"]) and (e["pid"], e["tid"]) in threads and e["tid"] in LANES.values(), e
            lanes[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
        else:
            unit = re.fullmatch(r".+ \((.+)\)", e["name"])
            assert unit is not None and list(e["args"]) == [unit.group(1)], e  # the value's key is its unit
            assert _finite(e["args"][unit.group(1)]), e
    for (pid, tid), spans in lanes.items():
        spans.sort()
        for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
            shared = tid == LANES["comm"] and math.isclose(a0, b0) and math.isclose(a1, b1)
            assert b0 >= a1 - 1e-6 * max(1.0, a1) or shared, f"pid {pid} tid {tid}: [{a0}, {a1}] and [{b0}, {b1}]"


@pytest.mark.parametrize("argv", [
    ["1f1b", "-d", "4", "-m", "8"],
    ["zb-v", "-d", "4", "-m", "8", "--offload", "all", "--offload-ratio", "0.7"],
    ["group-interleaved", "-d", "4", "-m", "8", "-v", "2", "-g", "2", "--offload", "all", "--offload-ratio", "0.5"],
])
def test_simulate_trace_follows_the_format(argv: list[str], tmp_path: Path) -> None:
    path = tmp_path / "sim.json"
    code, _, err = run_cli("simulate", *argv, "--trace", str(path))
    assert code == 0, err
    check_trace(json.loads(path.read_text()))


def measured_traces(d: int = 2, m: int = 4) -> list[Trace]:
    """Runtime traces of a lowered, offloaded 1f1b with the simulator's times standing in for measured
    ones (milliseconds) and its memory levels as the resident bytes."""
    schedule = lower(generate("1f1b", d, m), offload="all")
    ones = (1.0,) * schedule.num_stages
    timeline = simulate(schedule, CostModel(time_f=ones, time_i=ones, time_w=ones, d2h_time=0.3, h2d_time=0.3))
    return [Trace(r, 0, [TraceRecord(a, s / 1e3, e / 1e3, 4096 * (i % 3)) for i, (a, s, e) in
                         enumerate(timeline.events(r))], 8192, 0, epoch=1000.0 + r / 1e3) for r in range(d)]


def test_runtime_trace_and_its_comparison_follow_the_format(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    write_chrome_trace(measured_traces(), str(path))
    data = json.loads(path.read_text())
    check_trace(data)
    merged, _, _ = compare_trace(data)
    check_trace(merged)


def _process_names(data: dict) -> set[str]:
    return {e["args"]["name"] for e in data["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}


def test_a_trace_in_t_says_in_the_viewer_that_its_seconds_are_t(tmp_path: Path) -> None:
    # Perfetto shows every trace in seconds and never otherData: 33 t of 1F1B would read "33 s", unlabelled
    path, costs = tmp_path / "t.json", tmp_path / "costs.json"
    assert run_cli("simulate", "1f1b", "-d", "2", "-m", "4", "--trace", str(path))[0] == 0
    assert _process_names(json.loads(path.read_text())) == {f"simulated rank {r} (1 t shown as 1 s)" for r in (0, 1)}
    costs.write_text(json.dumps({"time_unit": "s", "time_f": 0.002, "time_i": 0.002, "time_w": 0.002}))
    assert run_cli("simulate", "1f1b", "-d", "2", "-m", "4", "--costs", str(costs), "--trace", str(path))[0] == 0
    assert _process_names(json.loads(path.read_text())) == {"simulated rank 0", "simulated rank 1"}  # seconds: as is
    run = tmp_path / "run.json"
    write_chrome_trace(measured_traces(), str(run))
    merged, _, _ = compare_trace(json.loads(run.read_text()))
    assert {n for n in _process_names(merged) if n.startswith("simulated")} == {"simulated rank 0", "simulated rank 1"}
