"""The playground draws a real run's runtime trace beside its simulation: the trace comes from a tiny real
run (2 gloo ranks, a 2-layer GPT, one step, everything offloaded), read by `pipeoffload trace compare`'s
code on the server; a wrong file shows one line and the page keeps working."""
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from pipeoffload.runtime.trace import DEVICE_COUNTER
from tests.browser.conftest import Console
from tests.conftest import run_cli

RUN = ["--spawn", "2", "--schedule", "1f1b", "--microbatches", "4", "--steps", "1", "--layers", "2",
       "--hidden", "64", "--seq", "32", "--batch", "4", "--offload", "all", "--timeout", "60"]


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Chrome trace `python -m pipeoffload.runtime --trace` writes for a tiny real run."""
    from pipeoffload.runtime.demo import main

    path = tmp_path_factory.mktemp("run") / "trace.json"
    main([*RUN, "--trace", str(path)])
    return path


def _post(base: str, body: bytes) -> dict:
    request = urllib.request.Request(base + "/api/trace", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def _spans(trace: Path) -> list[dict]:
    """The file's compute and copy actions (communication has no box)."""
    return [e for e in json.loads(trace.read_text())["traceEvents"]
            if e["ph"] == "X" and not e["name"][1:].startswith(("SEND", "RECV"))]


def test_the_server_reads_a_real_trace_as_trace_compare_does(base: str, trace: Path, tmp_path: Path) -> None:
    answer = _post(base, trace.read_bytes())
    code, out, _ = run_cli("trace", "compare", str(trace), "-o", str(tmp_path / "merged.json"))
    assert code == 0, out
    other = json.loads((tmp_path / "merged.json").read_text())["otherData"]
    assert answer["ranks"] == 2 and answer["measured_step_s"] == other["measured_step_s"]
    assert answer["simulated_makespan_s"] == other["simulated_makespan_s"]
    for mine, theirs in zip(answer["per_rank"], other["per_rank"], strict=True):
        assert {k: mine[k] for k in theirs} == theirs
    assert len(answer["measured"]["boxes"]) == len(_spans(trace))
    assert {b[2] for b in answer["measured"]["boxes"]} == {"F", "B", "OFFLOAD", "RELOAD"}
    counters: dict[int, float] = {}
    for e in json.loads(trace.read_text())["traceEvents"]:
        if e["ph"] == "C" and e["name"] == DEVICE_COUNTER:  # the host counter is the run's host memory
            counters[e["pid"]] = max(counters.get(e["pid"], 0.0), e["args"]["MiB"])
    assert [r["measured_peak_mib"] for r in answer["per_rank"]] == [counters[0], counters[1]]
    assert answer["has_memory"] and min(counters.values()) > 0  # the run measured its activations


def test_the_page_draws_a_runs_trace_beside_its_simulation(browser: Any, base: str, trace: Path,
                                                            tmp_path: Path) -> None:
    p = browser.new_page(viewport={"width": 1300, "height": 1000})
    console = Console(p)
    p.goto(base + "/?family=1f1b&ranks=4&microbatches=8")
    p.wait_for_selector("#chart:not(.stale) svg[data-ranks='4']", timeout=30_000)
    p.set_input_files("#trace-file", str(trace))
    p.wait_for_selector("#trace-measured svg[data-ranks='2']", timeout=30_000)
    answer = _post(base, trace.read_bytes())
    spans = len(_spans(trace))
    assert p.locator("#trace-measured rect.box").count() == spans
    assert p.locator("#trace-simulated rect.box").count() == len(answer["simulated"]["boxes"]) > 0
    assert p.locator("#trace-measured path.device").count() == 2 and p.locator("#trace-simulated path.device").count() == 2
    assert "MiB" in p.inner_text("#trace-measured") and "rank units" in p.inner_text("#trace-simulated")
    for row in answer["per_rank"]:
        cell = p.inner_text(f"#trace-charts tr[data-rank='{row['rank']}'] td.measured-peak")
        assert float(cell) == pytest.approx(row["measured_peak_mib"], rel=1e-5)
        for name, key in (("measured-span", "measured_span_s"), ("start-skew", "start_skew_s")):
            # each rank timed from its own first action, its start after the first rank's apart
            cell = p.inner_text(f"#trace-charts tr[data-rank='{row['rank']}'] td.{name}")
            assert cell.endswith(" ms") and float(cell[:-3]) == pytest.approx(row[key] * 1e3, rel=1e-2, abs=1e-3)
    # a wrong file: one line naming what is wrong, the charts dimmed, the page still working
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1, "loss": 5.0}\n{"step": 2, "loss": 4.0}\n')
    p.set_input_files("#trace-file", str(metrics))
    p.wait_for_selector("#trace-error:has-text('metrics.jsonl: the file has one JSON object per line')", timeout=30_000)
    assert p.locator("#trace-charts.stale").count() == 1
    nan = tmp_path / "nan.json"
    nan.write_text('{"traceEvents": [{"ph": "X", "name": "0F0", "ts": NaN}]}')
    p.set_input_files("#trace-file", str(nan))
    p.wait_for_selector("#trace-error:has-text('nan.json: the file is not strict JSON')", timeout=30_000)
    p.fill("[name=ranks]", "3")
    p.dispatch_event("[name=ranks]", "change")
    p.wait_for_selector("#chart:not(.stale) svg[data-ranks='3']", timeout=30_000)
    p.set_input_files("#trace-file", str(trace))
    p.wait_for_selector("#trace-error[hidden]", state="attached", timeout=30_000)
    assert p.locator("#trace-charts:not(.stale) #trace-measured svg").count() == 1
    assert console.errors == []
    p.close()


def _held(p: Any, held: list[Any], count: int) -> None:
    """Until ``count`` trace uploads are held by the route (its handler runs while Playwright waits)."""
    for _ in range(600):
        if len(held) >= count:
            return
        p.wait_for_timeout(50)
    raise AssertionError(f"{len(held)} trace uploads held, expected {count}")


def test_an_upload_says_reading_the_trace_and_the_status_never_sticks(browser: Any, base: str, trace: Path,
                                                                       tmp_path: Path) -> None:
    """While the server reads an uploaded trace a status line (role=status, as "simulating…" for a chart) says
    "reading the trace…"; it clears when the charts, the server's one-line refusal or a failed request
    arrive, and an older upload a newer one superseded neither draws nor clears it."""
    p = browser.new_page(viewport={"width": 1300, "height": 1000})
    console = Console(p)
    p.goto(base + "/?family=1f1b&ranks=4&microbatches=8")
    p.wait_for_selector("#chart:not(.stale) svg[data-ranks='4']", timeout=30_000)
    assert p.get_attribute("#trace-busy", "role") == "status" and p.get_attribute("#trace-busy", "aria-live") == "polite"
    assert p.inner_text("#trace-busy") == ""
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1, "loss": 5.0}\n{"step": 2, "loss": 4.0}\n')
    held: list[Any] = []
    p.route("**/api/trace", lambda route: held.append(route))
    try:
        p.set_input_files("#trace-file", str(trace))  # success: the charts, then no status
        _held(p, held, 1)
        p.wait_for_selector("#trace-busy:has-text('reading the trace…')", timeout=30_000)
        held[0].continue_()
        p.wait_for_selector("#trace-measured svg[data-ranks='2']", timeout=30_000)
        p.wait_for_selector("#trace-busy:text-is('')", state="attached", timeout=30_000)
        p.set_input_files("#trace-file", str(metrics))  # the server's refusal: its line, then no status
        _held(p, held, 2)
        p.wait_for_selector("#trace-busy:has-text('reading the trace…')", timeout=30_000)
        held[1].continue_()
        p.wait_for_selector("#trace-error:has-text('metrics.jsonl: the file has one JSON object per line')",
                            timeout=30_000)
        assert p.inner_text("#trace-busy") == ""
        p.set_input_files("#trace-file", str(trace))  # superseded by the next file, its answer arriving last
        _held(p, held, 3)
        p.set_input_files("#trace-file", str(metrics))
        _held(p, held, 4)
        held[3].continue_()
        p.wait_for_selector("#trace-busy:text-is('')", state="attached", timeout=30_000)
        with p.expect_response(lambda r: r.url.endswith("/api/trace")) as older:
            held[2].continue_()
        older.value.finished()
        p.wait_for_timeout(300)  # the page has read the older answer by now: it drew nothing, set no status
        assert p.inner_text("#trace-busy") == "" and p.locator("#trace-charts.stale").count() == 1
        assert "metrics.jsonl" in p.inner_text("#trace-error")
    finally:
        p.unroute("**/api/trace")
    assert console.errors == []
    p.route("**/api/trace", lambda route: route.abort())
    try:
        p.set_input_files("#trace-file", str(trace))  # a failed request: its line, then no status
        p.wait_for_selector("#trace-error:has-text('cannot reach the playground server')", timeout=30_000)
        assert p.inner_text("#trace-busy") == ""
    finally:
        p.unroute("**/api/trace")
    assert [e for e in console.errors if "net::ERR_FAILED" not in e] == []  # the browser logs the aborted request
    p.close()
