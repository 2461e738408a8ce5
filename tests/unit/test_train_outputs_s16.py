"""What a run writes for people: reload_stall_s counts every reload the step waited for, the second
window's (RELOAD_W, before W in zb-h1/zb-v) as well as the first's."""
from pipeoffload.ir import Action
from pipeoffload.runtime.trace import Trace, TraceRecord
from pipeoffload.train.metrics import reload_seconds


def test_reload_stall_counts_the_reloads_before_w_too() -> None:
    # a zb-v rank's copies as the CPU runtime runs them (python -m pipeoffload.runtime --spawn 2
    # --schedule zb-v --offload all: rank 1 spent 270 us of its 1273 us of reloads in RELOAD_W)
    records = [TraceRecord(Action.parse(a), s, e, 0) for a, s, e in [
        ("1F0", 0.0, 1.0), ("1OFFLOAD0", 1.0, 1.25), ("1RELOAD0", 2.0, 2.5), ("1I0", 2.5, 3.0),
        ("1OFFLOAD_W0", 3.0, 3.125), ("1RELOAD_W0", 4.0, 4.375), ("1W0", 4.375, 5.0)]]
    assert reload_seconds(Trace(1, 0, records)) == 0.5 + 0.375


def test_report_never_shows_a_non_zero_figure_as_zero() -> None:
    # a tiny model's activations and a GPU's asynchronous reloads (tens of microseconds) and fast steps
    from pipeoffload.train.report import RunMetrics, key_figures

    rows = [{"step": s, "loss": 2.0, "tokens_per_s": 1e6, "step_s": 0.0004, "layout": {"pp": 2, "dp": 1, "tp": 1},
             "peak_act_bytes": [4096, 2048], "sim_peak_act_bytes": [4096.0, 2048.0], "host_bytes": [1536, 0],
             "reload_stall_s": [2.5e-05, 0.0]} for s in (1, 2)]
    figures = dict(key_figures(RunMetrics(rows)))
    assert figures["step time (median, after step 1)"] == "0.0004 s"
    assert figures["peak activations, rank 0"] == "4,096 bytes (simulated 4,096 bytes, measured/simulated 1.000)"
    assert figures["peak host bytes (offloaded), max over ranks"] == "1,536 bytes"
    assert figures["worst reload stall in one step, max over ranks"] == "2.5e-05 s"
    big = dict(key_figures(RunMetrics([dict(rows[0], step_s=0.0595, reload_stall_s=[0.0026, 0.0])])))
    assert big["step time (step 1 only, its warm-up included)"] == "0.059 s"  # unchanged where the places show it
    assert big["worst reload stall in one step, max over ranks"] == "0.0026 s"
