"""The thirteenth session's probe of the Python API: every public entry point refuses a value of the wrong
kind in one ``ConfigError`` line naming the value and the fix (no deep traceback, no silently wrong
result)."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from pipeoffload import CostModel, generate, lower, simulate, validate
from pipeoffload.errors import ConfigError
from pipeoffload.ir import Schedule
from pipeoffload.planner.estimate import EstimateRequest
from pipeoffload.planner.hardware import GIB, hardware_preset
from pipeoffload.planner.plans import PlanRequest
from pipeoffload.planner.presets import model_preset
from pipeoffload.planner.stagecosts import TrainingSetup

MODEL, HW = model_preset("gpt3-13b"), hardware_preset("a100")


def _one_line(err: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


# ---- 1: a loss that is not a scalar ----------------------------------------------------------------
def test_runner_refuses_a_per_sample_loss_at_the_first_forward() -> None:
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    from pipeoffload.runtime import PipelineRunner

    model = torch.nn.Linear(4, 3)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    runner = PipelineRunner({0: model}, generate("1f1b", 1, 4), 0,
                            loss_fn=lambda o, t: F.cross_entropy(o, t, reduction="none"))
    with pytest.raises(Exception, match=r"loss_fn returned \(2,\), not a scalar tensor.*reduction=\"mean\"") as err:
        runner.step(x, y)
    assert "action #0 0F0" in _one_line(err)
    assert model.weight.grad is None  # nothing was trained on the gradient of the sum
    runner = PipelineRunner({0: model}, generate("1f1b", 1, 4), 0, loss_fn=F.cross_entropy)
    assert runner.step(x, y) is not None  # a scalar loss still trains


# ---- 2: True/False fields refuse text ----------------------------------------------------------------
@pytest.mark.parametrize("field", ["distributed_optimizer", "sequence_parallel"])
def test_estimate_request_refuses_text_for_a_boolean(field: str) -> None:
    with pytest.raises(ConfigError, match=rf"{field}='no': must be True or False") as err:
        EstimateRequest(model=MODEL, hardware=HW, global_batch=64, pp=2, dp=2, **{field: "no"})
    _one_line(err)
    with pytest.raises(ConfigError, match=r"partial_recompute=1: must be True or False or None"):
        EstimateRequest(model=MODEL, hardware=HW, global_batch=64, pp=2, partial_recompute=1)
    EstimateRequest(model=MODEL, hardware=HW, global_batch=64, pp=2, dp=2, **{field: False})


@pytest.mark.parametrize("field", ["prune", "escalate", "exact_frontier", "best_per_tp"])
def test_plan_request_refuses_text_for_a_boolean(field: str) -> None:
    base = dict(model=MODEL, hardware=HW, gpus=8, global_batch=64, memory_budget=40 * GIB)
    with pytest.raises(ConfigError, match=rf"{field}='no': must be True or False"):
        PlanRequest(**base, **{field: "no"})  # type: ignore[arg-type]
    PlanRequest(**base, **{field: True})  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["distributed_optimizer", "sequence_parallel", "selective_recompute"])
def test_training_setup_refuses_text_for_a_boolean(field: str) -> None:
    with pytest.raises(ConfigError, match=rf"{field}='no': must be True or False"):
        dataclasses.replace(TrainingSetup(), **{field: "no"})


def test_service_checks_boolean_is_the_one_rule() -> None:
    from pipeoffload import policies
    from pipeoffload.service import checks

    assert checks.boolean is policies.boolean


# ---- 3: a bool is not an integer to generate ---------------------------------------------------------
@pytest.mark.parametrize("args, kw, name", [
    (("1f1b", True, 8), {}, "num_ranks=True"),
    (("1f1b", 2, True), {}, "num_microbatches=True"),
    (("interleaved-1f1b", 2, 4, True), {}, "stages_per_rank=True"),
    (("group-interleaved", 4, 8, 2), {"group_size": True}, "group_size=True"),
])
def test_generate_refuses_a_bool_for_a_size(args: tuple, kw: dict, name: str) -> None:
    with pytest.raises(ConfigError, match=rf"{name}: must be an integer"):
        generate(*args, **kw)


# ---- 4: wrong types at the public entry points --------------------------------------------------------
def test_wrong_types_are_one_config_error_line() -> None:
    s = generate("1f1b", 4, 8)
    cases = [
        (lambda: CostModel().with_offload_ratio("0.5"), r"offload ratio k='0.5': must be a number"),
        (lambda: generate("zb", 4, 8, memory_limit="x"), r"memory_limit='x': must be a finite number"),
        (lambda: generate("zb", 4, 8, memory_limit=[1, "2", 3, 4]), r"memory_limit=.*one per rank"),
        (lambda: generate("zb", 4, 8, costs="fast"), r"costs='fast' must be a CostModel"),
        (lambda: lower(s, costs="fast"), r"lower: costs='fast' must be a CostModel"),
        (lambda: lower(s, costs="fast", offload="all"), r"lower: costs='fast' must be a CostModel"),
        (lambda: lower(None), r"lower takes a Schedule, not None: pass one from generate"),
        (lambda: simulate("x"), r"simulate takes a Schedule, not 'x'"),
        (lambda: simulate(lower(s), "x"), r"simulate: costs='x' must be a CostModel"),
        (lambda: validate("x"), r"validate takes a Schedule, not 'x'"),
        (lambda: Schedule.from_json('{"x": 1}'), r"schedule JSON without the field\(s\) num_microbatches, "
                                                 r"placement, actions"),
        (lambda: Schedule.from_json('[1]'), r"schedule JSON without the field"),
        (lambda: EstimateRequest(model=MODEL, hardware=HW, global_batch=64, pp=2, memory_budget="40"),
         r"memory_budget='40': must be a number of bytes per GPU \(40 GiB is 40 \* 2\*\*30\)"),
    ]
    for call, pattern in cases:
        with pytest.raises(ConfigError, match=pattern) as err:
            call()
        _one_line(err)
    assert Schedule.from_json(lower(s).to_json()) == lower(s)
    assert generate("zb", 4, 8, memory_limit=[4, 4, 4, 4]).num_ranks == 4


def test_runner_refuses_text_for_its_rank_and_a_non_schedule() -> None:
    torch = pytest.importorskip("torch")
    from pipeoffload.runtime import PipelineRunner

    stages = {0: torch.nn.Linear(4, 3)}
    with pytest.raises(ConfigError, match=r"rank='0': must be an integer in 0..0"):
        PipelineRunner(stages, generate("1f1b", 1, 4), "0")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"PipelineRunner takes a Schedule, not '1f1b'"):
        PipelineRunner(stages, "1f1b", 0)  # type: ignore[arg-type]


# ---- 4 and 5: train_model checks its arguments before any rank starts --------------------------------
def _layers() -> list:
    import torch

    return [torch.nn.Linear(8, 8), torch.nn.Linear(8, 3)]


class _NoVal:
    tokens_per_sample = 1

    def __init__(self, cfg: object) -> None:
        self.cfg = cfg

    def train(self, step: int, dp_rank: int) -> None:
        raise AssertionError("never reached")


def test_train_model_refuses_wrong_arguments_before_any_rank_or_folder(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import torch.nn.functional as F

    from pipeoffload.train import TrainConfig, train_model

    out = tmp_path / "run"
    cfg = TrainConfig.build(schedule="1f1b", pp=2, nproc=2, microbatches=4, global_batch=32, steps=2,
                            progress=False, out=str(out))
    cases = [
        ((dict(schedule="1f1b"), _layers, F.cross_entropy, _NoVal),
         r"cfg: train_model takes a TrainConfig, not a dict; build one with TrainConfig.build\("),
        ((cfg, _layers(), F.cross_entropy, _NoVal), r"layers=a list: not callable.*pass layers, not layers\(\)"),
        ((cfg, _layers, None, _NoVal), r"loss_fn=None: not callable; give a function loss_fn\(output, target\)"),
        ((cfg, _layers, F.cross_entropy, _NoVal(None)), r"batches=a _NoVal: not callable; give a function or class"),
        ((cfg, _layers, F.cross_entropy, _NoVal), r"batches=_NoVal: the class has no .val\(\)"),
    ]
    for args, pattern in cases:
        with pytest.raises(ConfigError, match=pattern) as err:
            train_model(*args)  # type: ignore[arg-type]
        _one_line(err)
        assert not out.exists()


# ---- 7: init_from_env outside torchrun ---------------------------------------------------------------
def test_init_from_env_outside_torchrun_says_how_to_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    from pipeoffload.runtime.launch import init_from_env

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ConfigError, match=r"RANK and WORLD_SIZE not set.*launch with torchrun.*spawn") as err:
        init_from_env()
    _one_line(err)
    assert "RANK" not in os.environ


# ---- 8: simulate refuses a forward without its backward (validate's rule, checked cheaply) -------------
def test_simulate_refuses_a_forward_without_its_backward() -> None:
    from pipeoffload.errors import ScheduleError
    from pipeoffload.simulator import simulate_figures

    bad = Schedule.from_text("0F0 0F1 0B0\n")
    for run in (simulate, simulate_figures):
        with pytest.raises(ScheduleError, match=r"stage 0, microbatch 1 has an F but no B .*validate\(schedule\)"):
            run(bad)
    assert simulate(Schedule.from_text("0F0 0F1 0B0 0B1\n")).makespan > 0
    assert simulate(Schedule.from_text("0F0 0I0 0W0\n")).makespan > 0  # a split backward counts
    assert simulate(Schedule.from_text("0F0 0F1\n")).makespan == 2  # forwards only: an evaluation's
