"""Probe P, plan/estimate CLI: a family named twice is one, refusals and warnings say what works."""
from __future__ import annotations

import json

from tests.conftest import run_cli

LLAMA8 = ("--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--global-batch", "32", "--seq", "4096",
          "--top", "5", "--no-pareto", "--json")


def _best(*extra: str) -> list:
    code, out, err = run_cli("plan", *LLAMA8, *extra)
    assert code == 0, err
    return json.loads(out)["best"]


def test_a_family_named_twice_in_any_case_is_searched_once() -> None:
    once = _best("--schedules", "zb-v")
    assert len(once) == 5
    assert _best("--schedules", "ZB-V,zb-v") == once
    assert _best("--schedules", "1f1b,1f1b") == _best("--schedules", "1f1b")
