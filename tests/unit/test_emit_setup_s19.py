"""The service's ``PlanResult.emit`` (and ``CompareTPResult.emit``) refuse a setup train does not run, as
``plan --emit`` refuses its flags: one check (``planner.emit.check_emit_setup``), naming the request's field
to an API user and the flag on the command line; train's own setup passes and writes the file."""
from __future__ import annotations

from pathlib import Path

import pytest

from pipeoffload.errors import FLAGS, ConfigError
from pipeoffload.planner.emit import check_emit_setup, train_setup
from pipeoffload.planner.hardware import GIB, hardware_preset
from pipeoffload.planner.model import ModelSpec
from pipeoffload.planner.stagecosts import TrainingSetup
from pipeoffload.service import CompareTPRequest, PlanRequest, compare_tp, plan

MODEL = ModelSpec(name="tiny", layers=4, hidden=64, heads=4, seq=32, vocab=256)
CASES = [({"partial_recompute": True}, "setup.partial_recompute=True", "--partial-recompute", "partial (LGD)"),
         ({"sequence_parallel": False}, "setup.sequence_parallel=False", "--no-sequence-parallel",
          "always sequence-parallel"),
         ({"selective_recompute": True}, "setup.selective_recompute=True", "--recompute selective",
          "selective recomputation")]


def _request(setup: TrainingSetup, gpus: int = 2) -> PlanRequest:
    return PlanRequest(model=MODEL, hardware=hardware_preset("a100"), gpus=gpus, global_batch=8,
                       memory_budget=40 * GIB, setup=setup, top=1)


@pytest.mark.parametrize(("fields", "named", "flag", "why"), CASES)
def test_plan_result_emit_refuses_a_setup_train_does_not_run(tmp_path: Path, fields: dict, named: str, flag: str,
                                                              why: str) -> None:
    path = tmp_path / "run.toml"
    result = plan(_request(TrainingSetup(**fields)))
    with pytest.raises(ConfigError) as caught:
        result.emit(path)
    assert len(str(caught.value).splitlines()) == 1 and named in str(caught.value) and why in str(caught.value)
    assert f"{flag} with --emit" in caught.value.in_words(FLAGS)  # the CLI's words, from the same check
    assert not path.exists()


@pytest.mark.parametrize(("fields", "named", "flag", "why"), CASES[:1])
def test_compare_tp_emit_refuses_it_too(tmp_path: Path, fields: dict, named: str, flag: str, why: str) -> None:
    path = tmp_path / "run.toml"
    result = compare_tp(CompareTPRequest(_request(TrainingSetup(**fields), gpus=8), baseline="best"))
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        result.emit(path)
    assert not path.exists()


def test_train_setup_passes_and_writes(tmp_path: Path) -> None:
    check_emit_setup(train_setup())
    check_emit_setup(TrainingSetup(partial_recompute=False, distributed_optimizer=False))
    path = tmp_path / "run.toml"
    assert "pipeoffload train --config" in plan(_request(train_setup())).emit(path) and path.exists()
