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
        "offload budget:2rank: 14 activations offloaded, 0 more kept on the device, as the copy lane could not hide their copies; "
        "recompute auto: 0 activations; planned peak 4 -> 2 activation units; budget 2 met")
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["offload_report"]
    assert (report["policy"], report["recompute"]) == ("budget:2rank", "auto")
    assert main(["simulate", "1f1b", "-d", "4", "-m", "8", "--offload", "first:1", "--recompute", "first:1,lgd",
                 "--offload-ratio", "0"]) == 0  # instant copies (the default k hides fewer)
    assert capsys.readouterr().out.splitlines()[-1] == (
        "offload first:1: 24 activations offloaded, 0 more kept on the device, as the copy lane could not hide their copies; recompute first:1,lgd: 0 "
        "activations; planned peak 2.35294 -> 0.588235 activation units")
    for argv in (["--recompute", "lgd"], []):  # no offload, no recompute action: no report line, as before
        assert main(["simulate", "1f1b", "-d", "4", "-m", "8", *argv]) == 0
        assert "planned peak" not in capsys.readouterr().out
