"""``plan --compare-tp`` names the baseline that ran: TP8 at PP = 1 runs 1F1B, not interleaved 1F1B."""
from __future__ import annotations

import json

from pipeoffload.cli import main

PP1 = ["plan", "--model", "gpt3-13b", "--gpu", "a100", "--gpus", "8", "--global-batch", "32", "--compare-tp"]
PP2 = ["plan", "--model", "gpt3-13b", "--gpu", "a100", "--gpus", "16", "--global-batch", "32", "--compare-tp"]
PP1_LABEL = "tp8 (1f1b: interleaving needs PP > 1)"


def test_a_one_rank_pipeline_is_not_called_interleaved(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main([*PP1, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["tp"]["layout"]["pp"], data["tp"]["layout"]["tp"], data["tp"]["schedule"]) == (1, 8, "1f1b")
    assert data["baseline"] == PP1_LABEL and data["baseline_option"] == "tp8-interleaved"
    assert main(PP1) == 0
    out = capsys.readouterr().out
    assert "interleaved" not in out.replace(PP1_LABEL, "")
    row = next(line for line in out.splitlines() if line.startswith("baseline "))
    assert row.startswith(f"baseline {PP1_LABEL} ") and " PP1xTP8xDP1 1f1b " in row
    assert _columns_line_up(out)


def test_an_interleaved_baseline_keeps_its_name(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main([*PP2, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["tp"]["layout"]["pp"] > 1 and data["tp"]["schedule"] == "interleaved-1f1b"
    assert data["baseline"] == data["baseline_option"] == "tp8-interleaved"
    assert main(PP2) == 0
    lines = capsys.readouterr().out.splitlines()
    row = next(line for line in lines if line.startswith("baseline "))
    assert row.startswith("baseline tp8-interleaved ") and _columns_line_up("\n".join(lines))


def _columns_line_up(out: str) -> bool:
    lines = out.splitlines()
    end = lines[1].index("tokens/s") + len("tokens/s")
    rows = lines[2:4]  # the PP + offload row, then the baseline's
    return rows[0].startswith("PP + offload ") and rows[1].startswith("baseline ") and all(r[end - 1].isdigit() and r[end] == " " for r in rows)


def test_best_baseline_is_named_best(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main([*PP1, "--baseline", "best", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["baseline"] == data["baseline_option"] == "best"
