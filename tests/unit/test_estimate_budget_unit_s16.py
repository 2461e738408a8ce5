"""`EstimateRequest.memory_budget` is in bytes: a budget that reads as the device's memory in GiB (40)
says so, as `plan`'s refusal hints, instead of a bare "DOES NOT FIT of 0.0 GiB"."""
from __future__ import annotations

from pipeoffload.errors import FLAGS, in_words
from pipeoffload.planner.hardware import GIB, hardware_preset
from pipeoffload.planner.presets import model_preset
from pipeoffload.service import EstimateRequest, run

MODEL, HW = model_preset("gpt3-1.3b"), hardware_preset("a100")


def _warnings(budget: float | None) -> tuple[str, ...]:
    req = EstimateRequest(model=MODEL, hardware=HW, global_batch=16, pp=2, dp=2, memory_budget=budget)
    return run(req).warnings


def test_a_budget_given_in_gib_is_named_as_bytes() -> None:
    [warning] = [w for w in _warnings(40) if "bytes" in w]
    assert warning == "memory_budget=40 is 40 bytes, so nothing fits: memory_budget is in bytes (40 GiB is 40 * 2**30)"
    assert in_words(warning, FLAGS).startswith("--memory")


def test_a_budget_in_bytes_gets_no_such_note() -> None:
    assert not [w for w in _warnings(40 * GIB) if "bytes" in w]
    assert not [w for w in _warnings(None) if "bytes" in w]
