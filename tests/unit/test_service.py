"""The typed service: requests check their values (with the checks the CLI's flags use), results are what
the CLI prints, and the command line a request names makes the same request again."""
from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import pytest

import pipeoffload
from pipeoffload.cli import build_parser
from pipeoffload.cli.simulate import request_from_args
from pipeoffload.costs import CostModel, load_cost_file
from pipeoffload.errors import FLAGS, ConfigError
from pipeoffload.planner.hardware import hardware_preset
from pipeoffload.planner.presets import model_preset
from pipeoffload.service import (
    CompareRequest,
    OffloadRatioRequest,
    SimulateRequest,
    compare,
    offload_ratio,
    run,
    simulate,
    strict_json,
)
from tests.conftest import run_cli


@pytest.mark.parametrize("fields,message", [
    ({"ranks": 0}, "ranks: 0 must be >= 1"),
    ({"ranks": True}, "ranks: True is not an integer"),
    ({"microbatches": 2.5}, "microbatches: 2.5 is not an integer"),
    ({"time_f": math.inf}, "time_f: inf is not a finite number"),
    ({"p2p_time": math.nan}, "p2p_time: nan is not a finite number"),
    ({"offload_ratio": -1.0}, "offload_ratio: -1.0 must be >= 0"),
    ({"plan_ratio": math.inf, "offload": "all"}, "plan_ratio: inf is not a finite number"),
    ({"plan_ratio": 1.0}, "plan_ratio=1 plans offload copies, but offload is none"),
    ({"max_stall": -0.5, "offload": "all"}, "max_stall: -0.5 must be >= 0"),
    ({"max_stall": 2.0}, "max_stall=2 lets offload copies stall, but offload is none"),
    ({"backward": "half"}, "backward: 'half' is not one of split, full"),
    ({"offload": "bogus"}, "offload='bogus': the policy is not understood"),
    ({"family": " "}, "family is missing"),
])
def test_a_request_refuses_bad_values_when_built(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(")):
        SimulateRequest(**({"family": "1f1b"} | fields))


@pytest.mark.parametrize("argv", [
    "1f1b -d 4 -m 8",
    "group-interleaved -d 4 -m 8 -g 2 --offload all --offload-ratio 0.5 --time-w 0.5 --shared-host-link",
    "zb-v -d 4 --recompute first:1 --p2p-time 0.25 --separate-copy-engines",
    "zb-h1 -d 4 -m 8 --offload all --plan-ratio 1 --offload-ratio 0.4",
    "zb-v -d 4 -m 6 --offload all --offload-ratio 0.7 --max-stall 10",
])
def test_the_result_is_what_the_cli_prints_and_its_command_repeats_it(argv: str) -> None:
    request = request_from_args(build_parser().parse_args(["simulate", *shlex.split(argv)]))
    result = simulate(request)
    code, out, _ = run_cli("simulate", *shlex.split(argv), "--json")
    assert code == 0 and json.loads(out) == result.as_dict(FLAGS)  # as_dict() names the fields, not the flags
    again = request_from_args(build_parser().parse_args(request.command()[1:]))
    assert again == request


def test_labels_name_what_differs_and_repeats_are_numbered() -> None:
    base = SimulateRequest("group-interleaved", ranks=4, microbatches=8, group_size=2, offload="all")
    result = compare(CompareRequest((base, base, SimulateRequest("1f1b", ranks=4))))
    assert [r.label for r in result.rows] == [  # d=4 m=8 is every row's: said once, not in each label
        "group-interleaved v=2 · group-size 2 · offload all",
        "group-interleaved v=2 · group-size 2 · offload all (repeat 2)",
        "1f1b v=1",
    ]
    assert result.shared == "d=4 m=8"
    alone = compare(CompareRequest((base,)))  # one row: nothing to differ from, the whole label
    assert alone.rows[0].label == "group-interleaved d=4 m=8 v=2 · group-size 2 · offload all" and alone.shared == ""
    assert result.time_unit == "t" and result.makespan == max(r.result.timeline.makespan for r in result.rows)


def test_compare_refuses_mixed_time_units(tmp_path: Path) -> None:
    measured = tmp_path / "measured.json"
    measured.write_text(json.dumps({"time_f": 1e-3, "time_b": 2e-3, "time_unit": "s"}))
    with pytest.raises(ConfigError, match="mix time units"):
        compare(CompareRequest((SimulateRequest("1f1b"), SimulateRequest("1f1b", costs_file=str(measured)))))
    with pytest.raises(ConfigError, match="^run 2: stages_per_rank=2: 1f1b places one stage per rank"):
        compare(CompareRequest((SimulateRequest("1f1b"), SimulateRequest("1f1b", stages_per_rank=2))))
    with pytest.raises(ConfigError, match="^unknown schedule 'nope'"):  # refused when the request is built
        SimulateRequest("nope")


def test_run_carries_out_any_request() -> None:
    result = pipeoffload.run(pipeoffload.SimulateRequest("1f1b", ranks=2))
    assert result.timeline.makespan == simulate(SimulateRequest("1f1b", ranks=2)).timeline.makespan
    k = run(OffloadRatioRequest(model_preset("llama3-8b"), hardware_preset("a100")))
    assert k.as_dict() == offload_ratio(OffloadRatioRequest(model_preset("llama3-8b"), hardware_preset("a100"))).as_dict()
    with pytest.raises(TypeError, match="not a service request"):
        run("1f1b")  # type: ignore[call-overload]


def test_offload_ratio_request_checks_tp() -> None:
    with pytest.raises(ConfigError, match="tp: 0 must be >= 1"):
        OffloadRatioRequest(model_preset("llama3-8b"), hardware_preset("a100"), tp=0)
    with pytest.raises(ConfigError, match="^tp=3: must divide"):
        OffloadRatioRequest(model_preset("llama3-8b"), hardware_preset("a100"), tp=3)


@pytest.mark.parametrize("fields", [{"p2p_time": math.nan}, {"time_f": math.inf}, {"time_w": (1.0, math.nan)},
                                    {"d2h_time": math.inf}, {"activation_bytes": math.nan}, {"time_i": "1"}])
def test_a_cost_model_refuses_non_finite_numbers(fields: dict) -> None:
    with pytest.raises(ConfigError, match="must be a finite number"):
        CostModel(**fields)


@pytest.mark.parametrize("text,message", [
    ('{"time_f": 1, "time_b": 2, "p2p_time": NaN}', "p2p_time=nan: must be a finite number"),
    ('{"time_f": 0, "time_b": 0, "time_w": 0}', "every compute time"),
    ('{"time_f": [0, 0], "time_i": [0, 0], "time_w": [0, 0]}', "every compute time"),
    ('{"costs": 5}', "costs = 5: expected a table"),
    ('[1, 2]', "expected an object"),
])
def test_a_cost_file_is_checked_like_the_flags(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "costs.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"^costs_file='{path}': .*{message.replace('[', '.')}"):
        load_cost_file(str(path))


def test_an_overflowing_step_time_is_an_error_not_inf() -> None:
    with pytest.raises(ConfigError, match="step time overflows"):
        simulate(SimulateRequest("1f1b", time_f=1e308))


def test_strict_json_refuses_non_finite_numbers() -> None:
    assert strict_json({"a": 1.5}) == '{"a": 1.5}'
    with pytest.raises(ValueError):
        strict_json({"a": math.nan})


def test_simulate_report_shows_the_command_of_its_request(tmp_path: Path) -> None:
    page = tmp_path / "r.html"
    code, _, _ = run_cli("simulate", "zb-v", "-d", "2", "--offload", "all", "--report", str(page))
    assert code == 0 and "<code>pipeoffload simulate zb-v --ranks 2 --offload all</code>" in page.read_text()


def test_estimate_is_a_service_operation_and_the_cli_prints_its_result() -> None:
    """``run(EstimateRequest)`` is what ``pipeoffload estimate --json`` prints, for a layout that does not
    fit the budget too (an answer marked not fitting, never a refusal)."""
    from pipeoffload.cli.estimate import request_from_args as estimate_args
    from pipeoffload.service import EstimateRequest, EstimateResult

    argv = "estimate --model gpt3-175b --tp 8 --pp 2 --global-batch 16 --json"
    req = estimate_args(build_parser().parse_args(shlex.split(argv)))
    assert isinstance(req, EstimateRequest)
    result = pipeoffload.run(req)
    assert isinstance(result, EstimateResult) and not result.estimate.fits
    assert pipeoffload.EstimateRequest is EstimateRequest
    code, out, _ = run_cli(*shlex.split(argv))
    assert code == 0 and json.loads(out) == json.loads(strict_json(result.as_dict()))
    assert json.loads(out)["fits"] is False and "DOES NOT FIT" in result.text()


@pytest.mark.parametrize("planned,k", [(1.0, 0.5), (0.5, 0.7)])
def test_copies_planned_for_another_k_run_at_the_one_asked_for(planned: float, k: float) -> None:
    """``plan_ratio``: the copies of the plan made for ``planned``, simulated with those of ``k``. A
    slower link than planned stalls here, where the plan made for it does not."""
    from dataclasses import replace

    from pipeoffload.passes.lower import lower
    from pipeoffload.schedules import generate
    from pipeoffload.simulator import simulate as simulate_timeline
    request = SimulateRequest("zb-v", ranks=8, microbatches=32, offload="all", offload_ratio=k, plan_ratio=planned)
    result = simulate(request)
    costs = CostModel.uniform(0.5, 0.5, 0.5)  # one rank's unit times over its two stages
    made = lower(generate("zb-v", 8, 32, 2), costs.with_offload_ratio(planned), offload="all")
    assert result.timeline.as_dict() == simulate_timeline(made, costs.with_offload_ratio(k)).as_dict()
    assert result.as_dict()["planned_offload_ratio"] == planned and result.as_dict()["offload_ratio"] == k
    assert f"copies planned for k={planned:g}" in result.title()
    if planned > k:  # a faster link than planned: no stall, and (own links) no higher peak than planned
        as_planned = simulate(replace(request, offload_ratio=planned, plan_ratio=None)).timeline
        assert result.timeline.stall == 0
        assert result.timeline.peak_activation_units <= as_planned.peak_activation_units
    else:
        assert result.timeline.stall > 0 and simulate(replace(request, plan_ratio=None)).timeline.stall == 0
