"""benchmarks/sim_vs_measured.py: reading its results files back (``--from-results``), every format it wrote."""
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import sim_vs_measured as bench  # noqa: E402

CASE = ("2 ranks 1f1b              v=1: measured 0.326 s; simulated ... slowdown with 1..2 ranks computing: 1.00, 1.03; "
        "load 2.1 -> 2.0")
MESSAGES = ("    the runtime's messages (measure_message_costs): 0.17 ms on the lane per send/receive and 0.12 ms of CPU "
            "on the transport's threads, 1.23 ms from a send to a waiting receiver")
BATCHES = "    in send/receive batches per step, per rank: 55 ms, 20 ms; simulated (waiting in receives): 60, 21 ms"
SHARING = "    processor sharing on the run's own thread CPU per action (the timeline model alone): 0.288 s (-11.7%)"


def test_rows_are_found_under_their_header_in_every_format() -> None:
    old = [CASE, MESSAGES, BATCHES,
           "    per action (ms): runtime wall / thread CPU | profile CPU / wall | CPU with concurrency | replayed together",
           "      B0:  24.28 /  24.27 |  21.58 /  19.34 |  22.44 |  24.60",
           "      F0:  16.04 /  15.96 |  11.17 /  14.57 |  11.61 |  15.96", "2 ranks interleaved-1f1b ..."]
    assert bench._table(old, 1) == {"B0": (pytest.approx(0.02427), pytest.approx(0.02158), None),
                                    "F0": (pytest.approx(0.01596), pytest.approx(0.01117), None)}
    # a line more before the header (processor sharing on the run's own CPU): read from a fixed offset, it was missed
    shared = old[:3] + [SHARING] + old[3:]
    assert bench._table(shared, 1) == bench._table(old, 1)
    new = [CASE, MESSAGES, BATCHES, SHARING,
           "    per action (ms): runtime wall / thread CPU | replayed alone CPU | profile CPU / wall | CPU with concurrency"
           " | replayed together",
           "      B0:  34.42 /  17.37 |  16.98 |  17.07 /  16.98 |  30.53 |  34.40"]
    assert bench._table(new, 1) == {"B0": (pytest.approx(0.01737), pytest.approx(0.01707), pytest.approx(0.01698))}


def test_from_results_simulates_each_column_the_file_has(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = ["      B0:  24.00 /  20.00 |  10.00 /  10.00 |  10.00 |  10.00",
            "      F0:  12.00 /  10.00 |   5.00 /   5.00 |   5.00 |   5.00",
            "      B1:  24.00 /  20.00 |  10.00 /  10.00 |  10.00 |  10.00",
            "      F1:  12.00 /  10.00 |   5.00 /   5.00 |   5.00 |   5.00"]
    header = "    per action (ms): runtime wall / thread CPU | profile CPU / wall | CPU with concurrency | replayed together"
    path = tmp_path / "results.txt"
    path.write_text("\n".join([CASE, MESSAGES, BATCHES, SHARING, header, *rows]) + "\n")
    bench._from_results(str(path), "1-100", 0.0, 2)
    line = capsys.readouterr().out.splitlines()[-1].split()
    profile, replay, own = float(line[4]), line[6], float(line[8])
    assert replay == "-"  # no replay column in that file
    assert own > profile  # the run's own CPU is twice the profile's per action
    with pytest.raises(SystemExit) as exc:
        bench._from_results(str(path), "5-2", 0.0, 2)
    assert exc.value.code == 2
