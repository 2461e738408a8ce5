"""``OffloadReport`` carries typed policies; its text and JSON forms are the policies' text forms."""
from __future__ import annotations

import json

import pytest

from pipeoffload.cli import main
from pipeoffload.costs import CostModel
from pipeoffload.passes.lower import lower_with_report
from pipeoffload.policies import OffloadPolicy, RecomputePolicy
from pipeoffload.schedules import generate


@pytest.mark.parametrize("offload, recompute", [
    ("none", "none"), ("all", "none"), ("first:1", "first:1,lgd"), ("budget:2rank", "auto"),
    ("auto", "partial:0.3:0.1"), ("budget:2.5", "all"),
])
def test_report_policies_are_typed_and_print_as_before(offload: str, recompute: str) -> None:
    costs = CostModel.uniform().with_offload_ratio(0.5)
    _, report = lower_with_report(generate("1f1b", 4, 8), costs, offload=offload, recompute=recompute)
    assert isinstance(report.policy, OffloadPolicy) and isinstance(report.recompute, RecomputePolicy)
    assert report.policy == OffloadPolicy.parse(offload)
    assert report.recompute == RecomputePolicy.parse(recompute)
    assert (str(report.policy), str(report.recompute)) == (offload, recompute)


def test_summary_and_json_keep_the_text_forms(capsys) -> None:  # type: ignore[no-untyped-def]
    argv = ["simulate", "1f1b", "-d", "4", "-m", "8", "--offload-ratio", "0.5", "--offload", "budget:2rank",
            "--recompute", "auto"]
    assert main(argv) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "offload budget:2rank: 14 activations offloaded; kept on the device: 8 whose window is too short to leave the "
        "device; "
        "recompute auto: 0 activations; planned peak 4 -> 2 activation units; budget 2 met")
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["offload_report"]
    assert (report["policy"], report["recompute"]) == ("budget:2rank", "auto")
    assert main(["simulate", "1f1b", "-d", "4", "-m", "8", "--offload", "first:1", "--recompute", "first:1,lgd",
                 "--offload-ratio", "0"]) == 0  # instant copies (the default k hides fewer)
    assert capsys.readouterr().out.splitlines()[-1] == (
        "offload first:1: 24 activations offloaded; kept on the device: 8 whose window is too short to leave the device; "
        "recompute first:1,lgd: 0 "
        "activations; planned peak 2.35294 -> 0.588235 activation units")
    for argv in (["--recompute", "lgd"], []):  # no offload, no recompute action: no report line, as before
        assert main(["simulate", "1f1b", "-d", "4", "-m", "8", *argv]) == 0
        assert "planned peak" not in capsys.readouterr().out


def test_the_summary_names_only_what_was_kept_and_why(capsys) -> None:  # type: ignore[no-untyped-def]
    # a k so large that every window is too short: no "could not hide" clause for nothing hidden
    assert main(["simulate", "zb-v", "--offload", "all", "--offload-ratio", "1e308"]) == 0
    last = [line for line in capsys.readouterr().out.splitlines() if line.startswith("offload all:")][0]
    assert last.startswith("offload all: 0 activations offloaded; kept on the device: 64 whose window is too short")
    assert "could not hide" not in last
