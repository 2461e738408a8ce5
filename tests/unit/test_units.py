"""One unit convention: per-rank times (the work of a step does not depend on v), rank-unit memory,
and every output saying its units."""
import json

import pytest

from pipeoffload.cli import main


def _json(capsys, *argv: str) -> dict:  # type: ignore[no-untyped-def]
    assert main(["simulate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name,v", [("1f1b", 1), ("interleaved-1f1b", 2), ("interleaved-1f1b", 4), ("zb-v", 2)])
def test_time_flags_are_per_rank_whatever_v(capsys, name: str, v: int) -> None:  # type: ignore[no-untyped-def]
    data = _json(capsys, name, "-d", "4", "-m", "8", "-v", str(v), "--time-f", "1", "--time-i", "2", "--time-w", "0.5")
    assert all(r["busy"] == pytest.approx(8 * 3.5) for r in data["per_rank"])  # m x (F + I + W) on every rank


def test_memory_headline_is_rank_units(capsys) -> None:  # type: ignore[no-untyped-def]
    one = _json(capsys, "1f1b", "-d", "4", "-m", "8")
    two = _json(capsys, "interleaved-1f1b", "-d", "4", "-m", "8", "-v", "2", "--offload", "all", "--offload-ratio", "0.5")
    assert one["peak_rank_units"] == 4 == one["peak_activation_units"]  # 1F1B peaks at d rank units
    assert two["peak_rank_units"] * 2 == two["peak_activation_units"]
    assert two["peak_host_rank_units"] * 2 == two["peak_host_units"] > 0
    assert set(one["units"]) >= {"time", "memory", "activation_units", "fields"}
    assert main(["simulate", "interleaved-1f1b", "-d", "4", "-m", "8"]) == 0
    text = capsys.readouterr().out
    assert "makespan 28.5 t" in text and "peak 5.5 rank units" in text and "units: t:" in text
