"""`plan` prints a small model's step times in ms: in seconds to three places every row read "0.000"."""
from __future__ import annotations

from tests.conftest import run_cli

TINY = ("--layers", "4", "--hidden", "64", "--heads", "4", "--seq", "64", "--vocab", "256", "--gpu", "a100",
        "--gpus", "2", "--global-batch", "8")


def _rows(out: str) -> tuple[str, list[list[str]]]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("best plans that fit")) + 1
    header, rows = lines[start], []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        rows.append(line.split())
    return header, rows


def test_a_tiny_models_steps_are_in_ms() -> None:
    code, out, err = run_cli("plan", *TINY)
    assert code == 0, err
    header, rows = _rows(out)
    assert " step ms " in header and " step s " not in header
    column = header.split().index("ms") - 1  # "step ms" is two words: the rows' column is that of "step"
    steps = [float(row[column]) for row in rows]
    assert rows and all(0.001 < s < 10 for s in steps), steps  # not "0.000"


def test_a_real_models_steps_stay_in_seconds() -> None:
    code, out, err = run_cli("plan", "--model", "llama3-8b", "--gpu", "a100", "--gpus", "8", "--global-batch", "64")
    assert code == 0, err
    header, rows = _rows(out)
    assert " step s " in header and rows
