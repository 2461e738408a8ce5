"""``pipeoffload simulate`` with group-interleaved, offload and recompute flags."""
from __future__ import annotations

import json

from pipeoffload.cli import main


def _json(capsys, *argv: str) -> dict:  # type: ignore[no-untyped-def]
    assert main(["simulate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_full_offload_reports_offloaded_stall_and_host_peak(capsys) -> None:  # type: ignore[no-untyped-def]
    base = _json(capsys, "group-interleaved", "-d", "8", "-m", "32", "-v", "2", "-g", "8")
    data = _json(capsys, "group-interleaved", "-d", "8", "-m", "32", "-v", "2", "-g", "8",
                 "--offload", "all", "--offload-ratio", "0.5")
    assert data["offloaded"] > 400 and data["stall"] == 0 and data["makespan"] == base["makespan"]
    assert data["peak_activation_units"] <= 3 < base["peak_activation_units"] == 16
    assert all(r["peak_host_units"] > 0 for r in data["per_rank"])
    assert data["offload_report"]["planned_peak_after"] == data["peak_activation_units"]


def test_group_size_backward_and_recompute_flags(capsys) -> None:  # type: ignore[no-untyped-def]
    split = _json(capsys, "pipeoffload", "-d", "4", "-m", "8", "-v", "2", "--group-size", "2")
    full = _json(capsys, "pipeoffload", "-d", "4", "-m", "8", "-v", "2", "-g", "2", "--backward", "full")
    assert split["peak_activation_units"] == 6 and full["actions"] < split["actions"]
    data = _json(capsys, "1f1b", "-d", "4", "-m", "8", "--recompute", "first:1,lgd")
    assert data["recomputed"] > 0 and data["offload_report"]["recompute"] == "first:1,lgd"


def test_shared_host_link_and_separate_engines(capsys) -> None:  # type: ignore[no-untyped-def]
    data = _json(capsys, "1f1b", "-d", "4", "-m", "8", "--offload", "auto", "--offload-ratio", "0.6",
                 "--shared-host-link", "--separate-copy-engines")
    assert data["stall"] == 0 and data["offloaded"] > 0


def test_text_summary_says_what_the_offload_pass_did(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["simulate", "1f1b", "-d", "4", "-m", "8", "--offload", "budget:1", "--offload-ratio", "2"]) == 0
    out = capsys.readouterr().out
    assert "that the copy lane could not hide" in out and "budget 1 NOT met" in out


def test_bad_policy_exits_2_with_one_line(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["simulate", "1f1b", "--offload", "half"]) == 2
    err = capsys.readouterr().err
    assert "valid forms" in err and len(err.strip().splitlines()) == 1
    assert main(["simulate", "1f1b", "--group-size", "2"]) == 2
    assert "does not take --group-size (group-interleaved does); leave it out" in capsys.readouterr().err


def test_json_says_the_stall_is_summed_over_ranks(capsys) -> None:  # type: ignore[no-untyped-def]
    """``stall`` (kept as it was) is the sum over ranks, as the text's "(summed over ranks)"; the JSON
    also names it (``stall_summed_over_ranks``) and gives the worst rank's (``stall_max_over_ranks``),
    and ``units`` says what each is."""
    data = _json(capsys, "zb-v", "-d", "8", "-m", "32", "--offload", "all", "--offload-ratio", "0.68",
                 "--max-stall", "2")
    stalls = [r["stall"] for r in data["per_rank"]]
    assert data["stall"] > max(stalls) > 0  # several ranks stall: the sum is above any one of them
    assert data["stall_summed_over_ranks"] == data["stall"] == sum(stalls)
    assert data["stall_max_over_ranks"] == max(stalls)
    assert "stall_summed_over_ranks" in data["units"]["fields"] and "stall_max_over_ranks" in data["units"]["fields"]
    none = _json(capsys, "1f1b", "-d", "4", "-m", "8")
    assert none["stall"] == none["stall_summed_over_ranks"] == none["stall_max_over_ranks"] == 0
