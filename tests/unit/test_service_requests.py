"""A request checks its values when it is built (docs/architecture.md): a ConfigError in one line naming the
field, the value and the rule, never a raw Python error later in ``run``."""
from __future__ import annotations

import json
import shlex

import pytest

import pipeoffload
from pipeoffload import ConfigError
from pipeoffload.cli import main
from pipeoffload.errors import FLAGS
from pipeoffload.planner import hardware_preset, model_preset
from pipeoffload.service import (
    CompareRequest,
    CompareTPRequest,
    EstimateRequest,
    OffloadRatioRequest,
    PlanRequest,
    SimulateRequest,
    run,
)
from pipeoffload.viz.report import html_report

A100 = hardware_preset("a100")
PLAN = dict(model=model_preset("gpt3-13b"), hardware=A100, gpus=16, global_batch=64, memory_budget=40 * 2**30)


def one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def test_simulate_request_keeps_the_numbers_it_reads_from_text() -> None:
    req = SimulateRequest("1f1b", ranks="8", microbatches="16", time_f="0.5", offload_ratio="1")  # type: ignore[arg-type]
    assert (req.ranks, req.microbatches, req.time_f, req.offload_ratio) == (8, 16, 0.5, 1.0)
    assert req == SimulateRequest("1f1b", ranks=8, microbatches=16, time_f=0.5, offload_ratio=1.0)
    assert run(req).timeline.makespan == run(SimulateRequest("1f1b", ranks=8, microbatches=16, time_f=0.5,
                                                             offload_ratio=1.0)).timeline.makespan


@pytest.mark.parametrize("kwargs, message", [
    ({"offload": None}, r"^offload=None: a policy is text, one of none, all"),
    ({"recompute": 1}, r"^recompute=1: a policy is text"),
    ({"shared_host_link": "no"}, r"^shared_host_link: 'no' is not True or False"),
    ({"separate_copy_engines": 1}, r"^separate_copy_engines: 1 is not True or False"),
    ({"family": "bogus"}, r"^unknown schedule 'bogus'; valid names: .*1f1b"),
    ({"family": 3}, r"^family=3: give a schedule family's name"),
    ({"group_size": 2}, r"^schedule '1f1b' does not take group_size \(group-interleaved does\); leave it out$"),
])
def test_simulate_request_refuses_at_build(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        SimulateRequest(**{"family": "1f1b", **kwargs})
    one_line(err)


def test_offload_ratio_request_keeps_tp_read_from_text_and_checks_switches() -> None:
    req = OffloadRatioRequest(model_preset("llama3-8b"), A100, tp="2")  # type: ignore[arg-type]
    assert req.tp == 2 and run(req).as_dict() == run(OffloadRatioRequest(model_preset("llama3-8b"), A100, tp=2)).as_dict()
    with pytest.raises(ConfigError, match=r"^shared_host_link: 'yes' is not True or False"):
        OffloadRatioRequest(model_preset("llama3-8b"), A100, shared_host_link="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("build", [
    lambda model, hw: OffloadRatioRequest(model, hw),
    lambda model, hw: EstimateRequest(model=model, hardware=hw, global_batch=8),
    lambda model, hw: PlanRequest(**{**PLAN, "model": model, "hardware": hw}),
])
def test_a_preset_name_is_refused_with_the_call_that_gives_its_spec(build) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as err:
        build("llama3-8b", A100)
    assert one_line(err) == ("model='llama3-8b' is a str, not a ModelSpec; use "
                             "pipeoffload.planner.model_preset('llama3-8b')")
    with pytest.raises(ConfigError, match=r"^hardware='a100' is a str, not a HardwareSpec; use "
                                          r"pipeoffload\.planner\.hardware_preset\('a100'\)"):
        build(model_preset("gpt3-13b"), "a100")


@pytest.mark.parametrize("kwargs, message", [
    ({"tp_sizes": (0,)}, r"^tp_sizes=\(0,\): every value must be an integer >= 1"),
    ({"pp_sizes": (0,)}, r"^pp_sizes=\(0,\): every value must be an integer >= 1"),
    ({"stages_per_rank": (0,)}, r"^stages_per_rank=\(0,\): every value must be an integer >= 1"),
    ({"stages_per_rank": (-3,)}, r"^stages_per_rank=\(-3,\): every value must be an integer >= 1"),
    ({"tp_sizes": ("2",)}, r"^tp_sizes=\('2',\): every value must be an integer >= 1"),
    ({"top": 0}, r"^top=0: must be an integer >= 1"),
    ({"top": -1}, r"^top=-1: must be an integer >= 1"),
    ({"gpus": "16"}, r"^gpus='16': must be an integer >= 1"),
    ({"schedules": "1f1b"}, r"^schedules='1f1b': takes a tuple of family names, e.g. schedules=\('1f1b',\)"),
    ({"schedules": (1,)}, r"^schedules=\(1,\): every entry must be a family's name"),
    ({"offload": "all"}, r"^offload='all': takes a tuple of policies, e.g. offload=\('all',\)"),
    ({"recompute": "auto"}, r"^recompute='auto': takes a tuple of policies"),
    ({"tp_sizes": 2}, r"^tp_sizes=2: takes a tuple of integers"),
    ({"memory_budget": "40"}, r"^memory_budget='40': must be a number of bytes per GPU"),
    ({"host_memory_budget": 0}, r"^host_memory_budget=0: must be a finite number of bytes > 0"),
])
def test_plan_request_refuses_at_build(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        PlanRequest(**{**PLAN, **kwargs})
    one_line(err)


def test_plan_request_keeps_lists_as_tuples_and_stays_hashable() -> None:
    req = PlanRequest(**{**PLAN, "tp_sizes": [1, 2], "schedules": ["1f1b", "zb-v"], "offload": ["none", "all"]})
    assert req.tp_sizes == (1, 2) and req.schedules == ("1f1b", "zb-v") and req.offload == ("none", "all")
    assert hash(req) == hash(PlanRequest(**{**PLAN, "tp_sizes": (1, 2), "schedules": ("1f1b", "zb-v"),
                                            "offload": ("none", "all")}))


def test_a_budget_given_in_gib_is_named_as_bytes_when_nothing_fits() -> None:
    with pytest.raises(ConfigError, match=r"memory_budget is in bytes: 40 GiB is 40 \* 2\*\*30\)$") as err:
        run(PlanRequest(**{**PLAN, "memory_budget": 40, "schedules": ("1f1b",), "offload": ("none",),
                           "recompute": ("none",)}))
    one_line(err)


def test_compare_request_refuses_what_is_not_a_simulate_request() -> None:
    with pytest.raises(ConfigError) as err:
        CompareRequest(("1f1b", "zb-v"))  # type: ignore[arg-type]
    assert one_line(err) == ("run 1 is '1f1b', not a SimulateRequest; every run must be one, "
                             "e.g. SimulateRequest('1f1b')")
    with pytest.raises(ConfigError, match=r"^runs=SimulateRequest\(.*give a tuple of SimulateRequest"):
        CompareRequest(SimulateRequest("1f1b"))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^plan='x': give the PlanRequest"):
        CompareTPRequest("x")  # type: ignore[arg-type]


def test_compare_request_keeps_a_list_as_a_tuple() -> None:
    req = CompareRequest([SimulateRequest("1f1b"), SimulateRequest("zb-v")])  # type: ignore[arg-type]
    assert isinstance(req.runs, tuple)
    assert hash(req) == hash(CompareRequest((SimulateRequest("1f1b"), SimulateRequest("zb-v"))))


def test_compare_result_as_dict_is_what_compare_json_prints(capsys: pytest.CaptureFixture[str]) -> None:
    specs = ["1f1b -d 4", "zb-v -d 4 --offload all --offload-ratio 0.5"]
    assert main(["compare", *specs, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    result = run(CompareRequest((SimulateRequest("1f1b"), SimulateRequest("zb-v", offload="all", offload_ratio=0.5))))
    commands = [shlex.join(["pipeoffload", "simulate", *shlex.split(spec)]) for spec in specs]
    assert result.as_dict(commands, FLAGS) == printed  # the command line's words; as_dict() names the fields
    # by default each row's command is its request's own, which reproduces it
    default = result.as_dict()
    assert [row["command"] for row in default] == [shlex.join(r.result.request.command()) for r in result.rows]
    assert [{k: v for k, v in row.items() if k != "command"} for row in result.as_dict(naming=FLAGS)] == \
        [{k: v for k, v in row.items() if k != "command"} for row in printed]


def test_results_and_timelines_hash() -> None:
    req = SimulateRequest("zb-v", offload="all", offload_ratio=2.0, plan_ratio=0.1)  # copies slower than planned
    result = run(req)
    assert result.timeline.stalls  # a timeline whose stalls dict is not empty
    assert hash(result.timeline) == hash(run(req).timeline)
    hash(result)


def test_html_report_refuses_lists_of_the_wrong_length() -> None:
    timeline = run(SimulateRequest("1f1b", ranks=2)).timeline
    with pytest.raises(ConfigError) as err:
        html_report([timeline, timeline], pictures=[b"x"])
    assert one_line(err) == ("html_report: 1 pictures for 2 timelines; give one per timeline, or leave pictures out")
    with pytest.raises(ConfigError, match=r"^html_report: 1 labels for 2 timelines"):
        html_report([timeline, timeline], pictures=[b"x", b"y"], labels=["a"])
    with pytest.raises(ConfigError, match=r"^html_report: 3 commands for 2 timelines"):
        html_report([timeline, timeline], pictures=[b"x", b"y"], commands=["a", "b", "c"])


def test_dir_lists_the_names_that_load_on_first_use() -> None:
    names = dir(pipeoffload)
    assert {"PlanRequest", "SimulateRequest", "run", "simulate", "Timeline"} <= set(names)
