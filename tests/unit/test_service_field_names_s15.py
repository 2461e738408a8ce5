"""Notes, warnings and result text name the request's fields to a Python API user (``time_f=1``,
``memory_budget=80 GiB``, ``max_stall``), never a command-line flag they did not type (``--time-f 1``); the
command line still prints its flags, in the same words as before; the playground's JSON names its query
parameters, which are the fields. The errors' twin of this file is ``test_service_field_names_s14.py``."""
from __future__ import annotations

import json
import pickle
import re
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs

import pytest

from pipeoffload.errors import ConfigError
from pipeoffload.planner.hardware import GIB, hardware_preset
from pipeoffload.planner.presets import model_preset
from pipeoffload.planner.stagecosts import LayerCosts
from pipeoffload.service import (
    CompareRequest,
    CompareTPRequest,
    EstimateRequest,
    PlanRequest,
    SimulateRequest,
    compare,
    compare_tp,
    estimate,
    plan,
    simulate,
)
from tests.conftest import refused, run_cli

GPT, A100, H100 = model_preset("gpt3-1.3b"), hardware_preset("a100"), hardware_preset("h100")
PLAN = "plan --model gpt3-1.3b --gpu a100 --gpus 8 --global-batch 64"
PLAN_H100 = "plan --model gpt3-1.3b --gpu h100 --gpus 8 --global-batch 64"
EST = "estimate --model gpt3-1.3b --gpu a100 --global-batch 64"
# one layout, one schedule: a compare-tp whose both sides are quickly infeasible at 1 GiB
NARROW = dict(pp_sizes=(1,), schedules=("1f1b",), offload=("none",), recompute=("none",))
NARROW_FLAGS = "--pp 1 --schedules 1f1b --offload none --recompute none"


def _plan(hardware: object = A100, **fields: object) -> PlanRequest:
    return PlanRequest(model=GPT, hardware=hardware, gpus=8, global_batch=64,  # type: ignore[arg-type]
                       **{"memory_budget": 40 * GIB, **fields})  # type: ignore[arg-type]


def _capped() -> PlanRequest:
    """What ``plan --memory 80`` on an H100 asks: the device's memory, and the 80 GiB asked."""
    return _plan(H100, memory_budget=H100.memory_bytes, memory_asked=80 * GIB)


def _costs_file(tmp_path: Path) -> str:
    path = tmp_path / "costs.json"
    path.write_text('{"time_f": 1, "time_i": 1, "time_w": 1}')
    return str(path)


def _profile() -> LayerCosts:
    """Layer costs measured on some other, tiny layer."""
    return LayerCosts(time_f=1e-3, time_i=1e-3, time_w=1e-3, activation_bytes=1e6, params=12345, boundary_bytes=999)


def _profile_file(tmp_path: Path) -> str:
    path = tmp_path / "profile.json"
    lc = _profile()
    path.write_text(json.dumps({"format": "pipeoffload-layer-costs/1", "time_f": lc.time_f, "time_i": lc.time_i,
                                "time_w": lc.time_w, "activation_bytes": lc.activation_bytes, "params": lc.params,
                                "boundary_bytes": lc.boundary_bytes}))
    return str(path)


def _gpt2_dir(tmp_path: Path) -> str:
    """A Hugging Face folder of a GPT-2 with a learned position table of 1024 rows."""
    (tmp_path / "gpt2").mkdir(exist_ok=True)
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps({
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 12, "n_embd": 768, "n_head": 12,
        "vocab_size": 50257, "n_positions": 1024}))
    return str(tmp_path / "gpt2")


def _error(call: Callable[[], object]) -> str:
    with pytest.raises(ConfigError) as err:
        call()
    return str(err.value)


# (id, what the Python API gives (text), what it says, the same through the CLI, what that prints: "out" on
# stdout, "err" on stderr, "refused" as its one-line error)
CASES: list[tuple[str, Callable[[Path], str], str, str, str, str]] = [
    ("simulate: the time unit", lambda _: simulate(SimulateRequest("1f1b")).as_dict()["units"]["time"],
     "one rank's forward of one microbatch (time_f=1)", "simulate 1f1b --json", "(--time-f 1)", "out"),
    ("simulate: the time unit's help", lambda _: simulate(SimulateRequest("1f1b")).time_help(),
     "(time_f=1)", "simulate 1f1b", "units: t: the cost model's time unit; by default one rank's forward of one "
     "microbatch (--time-f 1)", "out"),
    ("simulate: a costs file's time unit",
     lambda tmp: simulate(SimulateRequest("zb-v", costs_file=_costs_file(tmp))).as_dict()["units"]["time"],
     "not per rank as the request's time_f, time_i and time_w are", "simulate zb-v --costs {costs} --json",
     "not per rank as --time-f/-i/-w are", "out"),
    ("compare: the time unit",
     lambda _: compare(CompareRequest((SimulateRequest("1f1b"), SimulateRequest("zb-v")))).as_dict()[0]["units"]
     ["time"], "(time_f=1)", "compare 1f1b zb-v --json", "(--time-f 1)", "out"),
    ("plan: a memory budget above the device", lambda _: _capped().notes()[0],
     "memory_asked=80 GiB is above the h100's 79.65 GiB; plans are checked against 79.65 GiB (raise it with "
     "hardware=dataclasses.replace(hardware, memory_bytes=...))", f"{PLAN_H100} --memory 80",
     "pipeoffload plan: warning: --memory 80 GiB is above the h100's 79.65 GiB; plans are checked against 79.65 "
     "GiB (raise it with --hw memory_gib=...)", "err"),
    ("plan: the capped budget in the JSON", lambda _: plan(_capped()).as_dict()["warnings"][0],
     "memory_asked=80 GiB is above", f"{PLAN_H100} --memory 80 --json", "--memory 80 GiB is above", "err"),
    ("plan: the stall budget", lambda _: plan(_plan(memory_budget=12 * GIB, max_stall=2.0)).text(),
     "may lengthen the step by up to 2 % (max_stall)", f"{PLAN} --memory 12 --max-stall 2",
     "may lengthen the step by up to 2 % (--max-stall)", "out"),
    ("plan: the host link the copies are planned for",
     lambda _: plan(_plan(memory_budget=8 * GIB)).as_dict()["notes"][0],
     "(hardware.d2h_bandwidth): a faster link", f"{PLAN} --memory 8 --json", "(--offload-bw): a faster link", "out"),
    ("plan --compare-tp: a side that does not fit",
     lambda _: compare_tp(CompareTPRequest(_plan(memory_budget=1 * GIB, **NARROW))).text(),
     "raise memory_budget or add GPUs", f"{PLAN} --memory 1 --compare-tp {NARROW_FLAGS}",
     "raise --memory or add GPUs", "out"),
    ("plan --compare-tp: the JSON's error",
     lambda _: compare_tp(CompareTPRequest(_plan(memory_budget=1 * GIB, **NARROW))).as_dict()["tp_error"],
     "raise memory_budget", f"{PLAN} --memory 1 --compare-tp {NARROW_FLAGS} --json", "raise --memory", "out"),
    ("estimate: a memory budget above the device",
     lambda _: estimate(EstimateRequest(model=GPT, hardware=H100, global_batch=64, memory_budget=80 * GIB))
     .warnings[0], "memory_budget=80 GiB is above the h100's 79.65 GiB; fits is checked against 79.65 GiB",
     "estimate --model gpt3-1.3b --gpu h100 --global-batch 64 --memory 80",
     "pipeoffload estimate: warning: --memory 80 GiB is above the h100's 79.65 GiB; fits is checked", "err"),
    ("estimate: the capped budget in the JSON",
     lambda _: estimate(EstimateRequest(model=GPT, hardware=H100, global_batch=64, memory_budget=80 * GIB))
     .as_dict()["warnings"][0], "memory_budget=80 GiB", "estimate --model gpt3-1.3b --gpu h100 --global-batch 64 "
     "--memory 80 --json", "--memory 80 GiB", "err"),
    ("estimate: what the budget leaves, and the balanced split",
     lambda _: estimate(EstimateRequest(model=GPT, hardware=A100, global_batch=64, pp=4, offload="budget",
                                        memory_budget=20 * GIB)).text(),
     "GiB: what memory_budget leaves for activations", f"{EST} --pp 4 --offload budget --memory 20",
     "GiB: what --memory leaves for activations", "out"),
    ("estimate: the split that weighs the head",
     lambda _: estimate(EstimateRequest(model=GPT, hardware=A100, global_batch=64, pp=4)).text(),
     "; split=balanced weighs the embedding and the head", f"{EST} --pp 4",
     "; --split balanced weighs the embedding and the head", "out"),
    ("a gpu that is not a preset", lambda _: _error(lambda: _plan(hardware_preset("x100"))),
     "(or describe one in a TOML file read by pipeoffload.planner.load_hardware)",
     "plan --model gpt3-1.3b --gpu x100 --gpus 8 --global-batch 64",
     "(or describe one in a TOML file with --hardware-file)", "refused"),
    ("a sequence past the learned positions", lambda _: _error(lambda: GPT.with_(positions=1024)),
     "which it cannot run past; use seq=1024 or less",
     "estimate --model hf:{gpt2} --gpu a100 --global-batch 64 --seq 2048", "use --seq 1024 or less", "refused"),
    ("plan: layer costs of another layer", lambda _: _error(lambda: _plan(measured=_profile())),
     "measured (the LayerCosts) was measured on a layer of 12,345 parameters", f"{PLAN} --profile {{profile}}",
     "--profile was measured on a layer of 12,345 parameters", "refused"),
    ("plan: layer costs of another layer, the fix", lambda _: _error(lambda: _plan(measured=_profile())),
     "re-profile this model at this model.seq and model.microbatch (pipeoffload.profiling.measure_layer_costs), "
     "or leave measured None", f"{PLAN} --profile {{profile}}", "re-profile this model at this --seq and "
     "--microbatch-size (pipeoffload.profiling.measure_layer_costs), or drop --profile", "refused"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_the_python_api_names_the_field(tmp_path: Path, case: tuple) -> None:
    _, call, words, _, _, _ = case
    text = call(tmp_path)
    assert words in text and not re.search(r"--[a-z]", text), text


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_the_cli_still_names_the_flag(tmp_path: Path, case: tuple) -> None:
    _, _, _, command, words, where = case
    command = command.format(costs=_costs_file(tmp_path), profile=_profile_file(tmp_path), gpt2=_gpt2_dir(tmp_path))
    if where == "refused":
        refused(command, words)
        return
    code, out, err = run_cli(*command.split())
    assert code == 0 and words in (out if where == "out" else err), (code, out, err)


def test_the_playground_names_its_query_parameters() -> None:
    """The playground's parameters are the request's fields: its results and family notes name them."""
    from pipeoffload.web.server import route

    _, _, body = route("/api/simulate", parse_qs("family=1f1b"))
    assert "(time_f=1)" in json.loads(body)["units"]["time"], body
    _, _, body = route("/api/families", {})
    summary = next(f["summary"] for f in json.loads(body) if f["name"] == "group-interleaved")
    assert summary.endswith("I/W split (or backward=full)") and "--" not in body.decode(), summary


def test_the_schedules_command_still_names_its_flag() -> None:
    code, out, _ = run_cli("schedules")
    assert code == 0 and "I/W split (or --backward full) (also: pipeoffload)" in out, out


def test_a_worded_text_keeps_both_namings() -> None:
    """A note is text naming the fields wherever it goes, and the flags where the command line asks;
    pickled (a planner worker's answer) it keeps both."""
    from pipeoffload.errors import FLAGS, Worded, in_words

    note = pickle.loads(pickle.dumps(Worded.named(lambda n: f"{n.given('memory_budget', '80 GiB')} is a lot")))
    assert note == "memory_budget=80 GiB is a lot" and json.dumps(note) == '"memory_budget=80 GiB is a lot"'
    assert in_words(note, FLAGS) == "--memory 80 GiB is a lot" and in_words("plain text", FLAGS) == "plain text"
