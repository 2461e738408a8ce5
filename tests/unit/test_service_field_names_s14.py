"""A bad value in a service request names the request's field to a Python API user (``tp=3``, ``time_f +
time_i + time_w``), never a command-line flag they did not type (``--tp 3``); the command line still names
its flags, in the same words as before; the playground names its query parameters, which are the fields."""
from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs

import pytest

from pipeoffload.errors import ConfigError
from pipeoffload.planner.hardware import GIB, hardware_preset
from pipeoffload.planner.presets import model_preset
from pipeoffload.service import (
    CompareRequest,
    CompareTPRequest,
    EstimateRequest,
    OffloadRatioRequest,
    PlanRequest,
    SimulateRequest,
    compare,
    compare_tp,
    plan,
    simulate,
)
from tests.conftest import refused

GPT, LLAMA, A100 = model_preset("gpt3-1.3b"), model_preset("llama3-8b"), hardware_preset("a100")
EST = "estimate --model gpt3-1.3b --gpu a100 --global-batch 64"
PLAN = "plan --model gpt3-1.3b --gpu a100 --gpus 8 --global-batch 64"


def _estimate(**fields: object) -> EstimateRequest:
    return EstimateRequest(model=GPT, hardware=A100, **{"global_batch": 64, **fields})  # type: ignore[arg-type]


def _plan(**fields: object) -> PlanRequest:
    return PlanRequest(model=GPT, hardware=A100, gpus=8, global_batch=64,
                       **{"memory_budget": 40 * GIB, **fields})  # type: ignore[arg-type]


def _bad_costs_file(tmp_path: Path) -> str:
    path = tmp_path / "costs.json"
    path.write_text('{"time_f": 1, "warp": 2}')
    return str(path)


# (id, the request through the Python API, what its message says, the same through the CLI, what that says)
CASES: list[tuple[str, Callable[[Path], object], str, str, str]] = [
    ("simulate: no compute time", lambda _: simulate(SimulateRequest("1f1b", time_f=0, time_i=0, time_w=0)),
     "time_f + time_i + time_w is 0", "simulate 1f1b --time-f 0 --time-i 0 --time-w 0",
     "--time-f + --time-i + --time-w is 0"),
    ("simulate: copy time overflows",
     lambda _: simulate(SimulateRequest("1f1b", time_f=1e308, offload="all", offload_ratio=10)),
     "offload_ratio=10 times time_f + time_i + time_w overflows",
     "simulate 1f1b --time-f 1e308 --offload all --offload-ratio 10",
     "--offload-ratio 10 times --time-f + --time-i + --time-w overflows"),
    ("simulate: planned copy time overflows",
     lambda _: simulate(SimulateRequest("1f1b", time_f=1e308, offload="all", offload_ratio=0.1, plan_ratio=10)),
     "plan_ratio=10 times", "simulate 1f1b --time-f 1e308 --offload all --offload-ratio 0.1 --plan-ratio 10",
     "--plan-ratio 10 times"),
    ("simulate: a bad costs file", lambda tmp: simulate(SimulateRequest("1f1b", costs_file=_bad_costs_file(tmp))),
     "costs_file='", "simulate 1f1b --costs {costs}", "--costs '"),
    ("simulate: recompute auto without offload", lambda _: simulate(SimulateRequest("1f1b", recompute="auto")),
     "pass offload=budget:X (or all, first:K, auto), or use recompute=first:K", "simulate 1f1b --recompute auto",
     "pass --offload budget:X (or all, first:K, auto), or use --recompute first:K"),
    ("simulate: too big", lambda _: simulate(SimulateRequest("1f1b", ranks=512, microbatches=4096)),
     "use fewer ranks or microbatches", "simulate 1f1b -d 512 -m 4096", "use fewer ranks (-d) or microbatches (-m)"),
    ("compare: a run's error", lambda _: compare(CompareRequest((SimulateRequest("1f1b", time_f=0, time_i=0,
                                                                                 time_w=0),))),
     "run 1: time_f + time_i + time_w is 0", "compare '1f1b --time-f 0 --time-i 0 --time-w 0'",
     "'1f1b --time-f 0 --time-i 0 --time-w 0': --time-f + --time-i + --time-w is 0"),
    ("k: tp does not divide", lambda _: OffloadRatioRequest(LLAMA, A100, tp=3),
     "tp=3: must divide the model's heads (32)", "k --model llama3-8b --tp 3", "--tp 3: must divide the model's heads"),
    ("k: tp above a node", lambda _: OffloadRatioRequest(model_preset("gpt3-175b"), A100, tp=16),
     "tp=16 is above the 8 GPUs per node (tensor parallelism stays inside a node); use a smaller tp",
     "k --model gpt3-175b --tp 16", "--tp 16 is above the 8 GPUs per node"),
    ("estimate: tp does not divide", lambda _: _estimate(tp=3), "tp=3 must divide the heads (16)", f"{EST} --tp 3",
     "--tp 3 must divide the heads (16)"),
    ("estimate: a stall budget without offload", lambda _: _estimate(max_stall=5),
     "max_stall=5 lets offload copies stall, but offload is none", f"{EST} --max-stall 5",
     "--max-stall 5 lets offload copies stall, but --offload is none"),
    ("estimate: a policy as Megatron's recompute", lambda _: _estimate(recompute="first:2"),
     "give it as recompute_policy=first:2", f"{EST} --recompute first:2", "give it as --recompute-policy first:2"),
    ("estimate: a group size 1f1b lacks", lambda _: _estimate(pp=4, group_size=2),
     "group_size=2: schedule 1f1b has no group size", f"{EST} --pp 4 --group-size 2",
     "--group-size 2: schedule 1f1b has no group size (only group-interleaved has one); drop the flag"),
    ("estimate: a split of too few layers", lambda _: _estimate(pp=2, layers_per_stage=(12, 11)),
     "layers_per_stage=(12, 11): holds 23 layers", f"{EST} --pp 2 --layers-per-stage 12,11",
     "--layers-per-stage 12,11: holds 23 layers"),
    ("estimate: a global batch dp does not divide", lambda _: _estimate(global_batch=63, dp=2),
     "global_batch=63 is not divisible", "estimate --model gpt3-1.3b --gpu a100 --global-batch 63 --dp 2",
     "--global-batch 63 is not divisible"),
    ("plan: a stall budget without offload", lambda _: _plan(max_stall=2, offload=("none",)),
     "max_stall=2 lets offload plans stall, but offload is none", f"{PLAN} --max-stall 2 --offload none",
     "--max-stall 2 lets offload plans stall, but --offload is none"),
    ("plan: group sizes no family has", lambda _: _plan(group_sizes=(4,), schedules=("1f1b",)),
     "group_sizes=(4,): no family in schedules=('1f1b',) has a group size", f"{PLAN} --group-sizes 4 --schedules 1f1b",
     "--group-sizes 4: no family in --schedules 1f1b has a group size"),
    ("plan: no schedules", lambda _: _plan(schedules=()), "(schedules) is empty; name at least one, e.g. "
     "schedules=('1f1b',)", f"{PLAN} --schedules ''", "(--schedules) is empty; name at least one, e.g. --schedules 1f1b"),
    ("plan: nothing fits", lambda _: plan(_plan(memory_budget=1 * GIB)), "raise memory_budget or add GPUs",
     "plan --model gpt3-1.3b --gpu a100 --gpus 8 --global-batch 64 --memory 1", "raise --memory or add GPUs"),
    ("plan: a pipeline size that does not divide", lambda _: plan(_plan(pp_sizes=(3,))),
     "pp_sizes=(3,) does not divide the GPUs left", f"{PLAN} --pp 3", "--pp 3 does not divide the GPUs left"),
    ("plan: no schedule on the layouts",
     lambda _: plan(_plan(schedules=("interleaved-1f1b",), stages_per_rank=(1,))),
     "needs stages_per_rank 2 or more); widen pp_sizes, tp_sizes or schedules",
     f"{PLAN} --schedules interleaved-1f1b --stages-per-rank 1",
     "needs --stages-per-rank 2 or more); widen --pp, --tp or --schedules"),
    ("plan: the host budget", lambda _: plan(_plan(host_memory_budget=0.001 * GIB, offload=("all",), tp_sizes=(1,),
                                                   pp_sizes=(8,))),
     "raise host_memory_budget or drop it", f"{PLAN} --host-memory 0.001 --offload all --tp 1 --pp 8",
     "raise --host-memory or drop it"),
    ("compare-tp: a baseline the GPUs do not divide",
     lambda _: compare_tp(CompareTPRequest(PlanRequest(model=LLAMA, hardware=A100, gpus=12, global_batch=48,
                                                       memory_budget=40 * GIB))),
     "baseline=tp8-interleaved needs GPUs (12)", "plan --model llama3-8b --gpu a100 --gpus 12 --global-batch 48 "
     "--compare-tp", "--baseline tp8-interleaved needs GPUs (12)"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_the_python_api_names_the_field(tmp_path: Path, case: tuple) -> None:
    _, call, words, _, _ = case
    with pytest.raises(ConfigError) as err:
        call(tmp_path)
    message = str(err.value)
    assert words in message and "--" not in message and "(-d)" not in message and "\n" not in message, message


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_the_cli_still_names_the_flag(tmp_path: Path, case: tuple) -> None:
    _, _, _, command, words = case
    refused(command.format(costs=_bad_costs_file(tmp_path)), words)


def test_the_playground_names_its_query_parameters() -> None:
    """The playground's parameters are the request's fields: its errors name them as the API does."""
    from pipeoffload.web.server import route

    for query, words in [("time_f=0&time_i=0&time_w=0", "time_f + time_i + time_w is 0"),
                         ("recompute=auto", "pass offload=budget:X")]:
        status, _, body = route("/api/simulate", parse_qs(f"family=1f1b&{query}"))
        assert status == 400 and words in body.decode() and "--" not in body.decode(), body


def test_a_named_error_keeps_both_namings_across_processes() -> None:
    """The planner's workers send errors back pickled: the CLI's words travel with the API's."""
    from pipeoffload.errors import FLAGS

    err = pickle.loads(pickle.dumps(ConfigError.named(lambda n: f"{n.given('tp_sizes', (3,))} is bad")))
    assert str(err) == "tp_sizes=(3,) is bad" and err.in_words(FLAGS) == "--tp 3 is bad"


def test_the_runtime_command_still_names_its_flags(capsys: pytest.CaptureFixture) -> None:
    """``python -m pipeoffload.runtime`` is a command line too: the lowering's refusal names its flags."""
    pytest.importorskip("torch")
    from pipeoffload.runtime.demo import main

    with pytest.raises(SystemExit) as stopped:
        main(["--spawn", "2", "--schedule", "1f1b", "--recompute", "auto"])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "pass --offload budget:X (or all, first:K, auto), or use --recompute first:K" in err
