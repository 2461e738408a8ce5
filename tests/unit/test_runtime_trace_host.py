"""The runtime's trace carries the host memory of offloaded activations (it had only device memory,
though `Trace.peak_host_bytes` was measured and simulated traces show host memory), and names its step
as the run's log and failures do: from 1, as `pipeoffload train` counts (it said "step 1" for the second
step of a run whose log said "step 2")."""
import json
from pathlib import Path

from pipeoffload import generate, lower
from pipeoffload.models import GPTConfig, build_rank_stages, even_counts, gpt_layers, lm_loss, sample_batch
from pipeoffload.runtime import PipelineRunner
from pipeoffload.runtime.demo import main
from pipeoffload.runtime.trace import MIB, Trace
from pipeoffload.viz.trace_compare import compare_trace, load_measured, measured_chart
from tests.unit.test_trace_event_format import check_trace

HOST = "host activation memory (MiB)"


def _counter(data: dict, name: str) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for e in data["traceEvents"]:
        if e["ph"] == "C" and e["name"] == name:
            out.setdefault(e["pid"], []).extend(e["args"].values())
    return out


def test_a_runtime_trace_shows_host_memory_per_rank_up_to_its_peak(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "run.json"
    main(["--spawn", "2", "--schedule", "1f1b", "--microbatches", "2", "--batch", "4", "--steps", "2", "--layers", "2",
          "--hidden", "32", "--seq", "16", "--offload", "all", "--trace", str(path)])
    capsys.readouterr()
    data = json.loads(path.read_text())
    check_trace(data)  # the new counter too: one numeric arg named by the unit its name says
    peaks = {int(r): b for r, b in data["otherData"]["peak_host_bytes"].items()}
    host = _counter(data, HOST)
    # rank 0 offloads; rank 1 (the last stage runs each B right after its F) does not: as in a simulated
    # trace, only the rank that offloaded has a host counter
    assert sorted(host) == [0] and peaks[0] > 0 == peaks[1], (sorted(host), peaks)
    for rank, levels in host.items():  # MiB over the step, from the offloads up to the recorded peak and back
        assert max(levels) * MIB == peaks[rank] and levels[-1] == 0, (rank, levels, peaks)
    names = {e["args"]["name"] for e in data["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {"measured rank 0 (step 2)", "measured rank 1 (step 2)"}  # the last of 2 steps, as logged
    merged, _, _ = compare_trace(data)
    check_trace(merged)
    assert sorted(_counter(merged, HOST)) == [0]  # measured host memory ...
    assert sorted(_counter(merged, "host memory (rank units)")) == [1000]  # ... beside the simulated rank 0's
    chart = measured_chart(load_measured(data))
    assert [c.peak * MIB for c in chart.host] == [peaks[0], peaks[1]] and "host peak" in chart.summary


def test_a_trace_without_offload_has_no_host_counter(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "run.json"
    main(["--spawn", "1", "--schedule", "1f1b", "--microbatches", "2", "--steps", "1", "--layers", "2",
          "--hidden", "32", "--seq", "16", "--trace", str(path)])
    capsys.readouterr()
    data = json.loads(path.read_text())
    assert _counter(data, HOST) == {} and _counter(data, "device activation memory (MiB)")


def test_the_trace_names_the_step_as_the_caller_numbers_it() -> None:
    cfg = GPTConfig(vocab=32, seq=8, hidden=16, heads=2, layers=4)
    schedule = lower(generate("gpipe", 1, 2, 2), offload="all")
    layers = gpt_layers(cfg, seed=0)
    stages = build_rank_stages(layers, even_counts(len(layers), 2), schedule.placement, 0)
    runner = PipelineRunner(stages, schedule, 0, loss_fn=lm_loss)
    runner.step(*sample_batch(cfg, 4), step=257)  # train's 1-based step, continuing after a resume
    trace = runner.trace
    assert trace is not None and trace.step == 257
    assert max(b for _, b in trace.host_curve()) == trace.peak_host_bytes > 0
    assert Trace.from_dict(json.loads(json.dumps(trace.as_dict()))) == trace  # host bytes survive the gather


def test_a_trace_dict_from_before_host_bytes_still_loads() -> None:
    old = {"rank": 0, "step": 1, "peak_bytes": 8, "end_bytes": 0, "wall": 0.1,
           "records": [["0F0", 0.0, 0.1, 8], ["0B0", 0.1, 0.2, 0]]}
    trace = Trace.from_dict(old)
    assert [r.host_bytes for r in trace.records] == [0, 0] and trace.peak_host_bytes == 0
