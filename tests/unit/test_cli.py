"""The command line: output shapes, stable JSON names, and one-line errors with exit code 2."""
import json
import subprocess
import sys

import pytest

from pipeoffload.cli import main


def run(capsys, *argv: str) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_schedules_lists_every_family(capsys) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = run(capsys, "schedules")
    assert code == 0
    names = [line.split()[0] for line in out.splitlines()]
    assert {"gpipe", "1f1b", "interleaved-1f1b"} <= set(names)


def test_show_prints_a_grid(capsys) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = run(capsys, "show", "1f1b", "--ranks", "2", "--microbatches", "2")
    assert code == 0
    assert "rank 0" in out and "0F0" in out and "1B1" in out


@pytest.mark.parametrize("fmt", ["text", "csv", "json"])
def test_show_formats_round_trip(capsys, fmt: str) -> None:  # type: ignore[no-untyped-def]
    from pipeoffload import Schedule, generate

    code, out, _ = run(capsys, "show", "interleaved", "-d", "2", "-m", "4", "-v", "2", "--format", fmt)
    reader = {"text": Schedule.from_text, "csv": Schedule.from_csv, "json": Schedule.from_json}[fmt]
    assert code == 0 and reader(out).actions == generate("interleaved-1f1b", 2, 4, 2).actions


def test_simulate_json_has_the_stable_fields(capsys) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = run(capsys, "simulate", "1f1b", "--ranks", "4", "--microbatches", "8", "--json")
    data = json.loads(out)
    assert code == 0
    for key in ("schedule", "ranks", "microbatches", "stages_per_rank", "makespan", "bubble_ratio",
                "peak_activation_units", "peak_rank_units", "per_rank"):
        assert key in data
    assert data["makespan"] == 33 and data["bubble_ratio"] == pytest.approx(3 / 11)
    assert data["peak_activation_units"] == 4 and data["peak_rank_units"] == 4
    assert [r["rank"] for r in data["per_rank"]] == [0, 1, 2, 3]
    for key in ("rank", "busy", "bubble_ratio", "peak_activation_units", "peak_rank_units", "stall"):
        assert key in data["per_rank"][0]


def test_simulate_full_backward_costs_i_plus_w(capsys) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = run(capsys, "simulate", "gpipe", "-d", "2", "-m", "2", "--time-f", "1", "--time-i", "2",
                       "--time-w", "0.5", "--json")
    assert code == 0 and json.loads(out)["makespan"] == (2 + 2 - 1) * (1 + 2.5)


def test_simulate_prints_a_table(capsys) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = run(capsys, "simulate", "interleaved-1f1b", "-d", "4", "-m", "8")
    assert code == 0 and "bubble 15.79%" in out and "peak 5.5 rank units (11 activation units)" in out
    assert "makespan 28.5 t " in out  # per-rank costs: the same work as 1F1B on these ranks


@pytest.mark.parametrize("argv,fragment", [
    (["simulate", "nope"], "unknown schedule 'nope'; valid names:"),
    (["simulate", "1f1b", "--ranks", "0"], "must be >= 1"),
    (["simulate", "1f1b", "--ranks", "x"], "is not an integer"),
    (["simulate", "1f1b", "-v", "2"], "--stages-per-rank 2: 1f1b places one stage per rank"),
    (["simulate", "1f1b", "--time-f", "-1"], "must be >= 0"),
    (["simulate", "1f1b", "--time-f", "0", "--time-i", "0", "--time-w", "0"], "at least one compute time"),
    (["simulate", "interleaved-1f1b", "-d", "3", "-m", "7"], "--microbatches 7: interleaved-1f1b needs"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, fragment) -> None:  # type: ignore[no-untyped-def]
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2
    assert fragment in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_console_script_runs_as_a_module() -> None:
    result = subprocess.run([sys.executable, "-m", "pipeoffload", "simulate", "1f1b", "--json"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and json.loads(result.stdout)["ranks"] == 4
    bad = subprocess.run([sys.executable, "-m", "pipeoffload", "simulate", "1f1b", "-d", "0"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
