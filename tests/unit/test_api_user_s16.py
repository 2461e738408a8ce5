"""The sixteenth session's audit of the Python API as a library user meets it: the package is typed for
type checkers (``py.typed``), results and schedules survive pickling and their JSON form unchanged, frozen
values cannot be changed, and a wrong argument gives one ``ConfigError`` line naming it (no
AttributeError, JSONDecodeError or IndexError from inside)."""
from __future__ import annotations

import pickle
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import pytest

import pipeoffload
from pipeoffload import ConfigError, CostModel, Placement, PlanRequest, Schedule, SimulateRequest, generate, run
from pipeoffload.ir import Action
from pipeoffload.planner import hardware_preset, model_preset
from pipeoffload.planner.hardware import GIB
from pipeoffload.service import CompareResult, EstimateResult, OffloadRatioResult, PlanResult, SimulateResult
from pipeoffload.simulator import Timeline

PACKAGE = Path(pipeoffload.__file__).parent
ROOT = PACKAGE.parent

USER_SCRIPT = '''
from pipeoffload import CostModel, SimulateRequest, Timeline, generate, lower, run, simulate


def makespan(ranks: int) -> float:
    costs = CostModel.uniform(f=0.5, i=0.5, w=0.5).with_offload_ratio(0.5)
    timeline: Timeline = simulate(lower(generate("1f1b", ranks, 2 * ranks), costs, offload="all"), costs)
    return timeline.makespan + sum(timeline.stalls.values()) + next(iter(timeline.events(0)))[1]


def peak(ranks: int) -> float:
    return run(SimulateRequest("zb-v", ranks=ranks, offload="all")).timeline.peak_rank_units
'''


def test_the_package_ships_py_typed_and_the_wheel_lists_it() -> None:
    assert (PACKAGE / "py.typed").is_file()
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in data["tool"]["setuptools"]["package-data"]["pipeoffload"]


def test_a_user_script_type_checks_strictly_against_the_installed_package(tmp_path: Path) -> None:
    """As after ``pip install``: the package in a site-packages directory, so mypy reads its hints only if it
    ships ``py.typed`` (else every name is Any and ``--strict`` reports the import)."""
    pytest.importorskip("mypy")
    site = tmp_path / "site-packages"
    shutil.copytree(PACKAGE, site / "pipeoffload", ignore=shutil.ignore_patterns("__pycache__", "static"))
    script = tmp_path / "user.py"
    script.write_text(USER_SCRIPT)
    # MYPYPATH would read the package as source; a site-packages directory makes it an installed one
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\n")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--config-file", str(config),
         "--cache-dir", str(tmp_path / "cache"), "--python-executable", _python_with(site, tmp_path), str(script)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def _python_with(site: Path, tmp_path: Path) -> str:
    """A python whose site-packages is ``site``: a venv without pip, its site-packages replaced."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    shutil.rmtree(purelib)
    shutil.move(str(site), purelib)
    return str(python)


@pytest.mark.parametrize("result", [SimulateResult, CompareResult, PlanResult, EstimateResult, OffloadRatioResult,
                                    Timeline])
def test_as_dict_says_its_keys_are_text(result: type) -> None:
    """``-> dict`` is ``dict[Any, Any]`` to a type checker; a JSON object's keys are str."""
    returned = typing.get_type_hints(result.as_dict)["return"]
    obj = typing.get_args(returned)[0] if typing.get_origin(returned) is list else returned
    assert typing.get_origin(obj) is dict and typing.get_args(obj)[0] is str


# ---- plain data: pickled, JSON, frozen --------------------------------------------------------------------
def test_a_timelines_stalls_cannot_be_changed_and_survive_pickling() -> None:
    timeline = run(SimulateRequest("zb-v", offload="all", offload_ratio=2.0, plan_ratio=0.1)).timeline
    action = next(iter(timeline.stalls))
    with pytest.raises(TypeError):
        timeline.stalls[action] = 0.0  # type: ignore[index]
    copy = pickle.loads(pickle.dumps(timeline))
    assert copy == timeline and hash(copy) == hash(timeline) and copy.stalls == dict(timeline.stalls)


def test_a_dict_given_as_stalls_stays_the_callers() -> None:
    base = run(SimulateRequest("1f1b", ranks=2)).timeline
    mine = {Action.parse("0B0"): 0.5}
    timeline = Timeline(base.schedule, base.costs, base.start, base.end, base.makespan, base.per_rank, mine)
    mine.clear()
    assert timeline.stalls == {Action.parse("0B0"): 0.5}


def test_requests_and_results_pickle_equal() -> None:
    request = SimulateRequest("group-interleaved", ranks=4, group_size=2, offload="all", offload_ratio=0.5)
    result = run(request)
    for value in (request, result, result.timeline, result.timeline.schedule, result.timeline.costs):
        assert pickle.loads(pickle.dumps(value)) == value


def test_a_schedule_round_trips_through_json_with_its_placement_kind() -> None:
    """A placement built as 'custom' whose map is a loop came back as 'loop': unequal to what was saved."""
    rows = [[Action.parse("0F0"), Action.parse("0B0")], [Action.parse("1F0"), Action.parse("1B0")]]
    schedule = Schedule.from_rows(rows, Placement((0, 1), 2))
    assert Schedule.from_json(schedule.to_json()) == schedule
    for name in ("zb-v", "interleaved-1f1b", "1f1b"):
        generated = generate(name, 4, 8)
        assert Schedule.from_json(generated.to_json()) == generated


def test_a_placement_keeps_a_list_as_a_tuple() -> None:
    placement = Placement([0, 1, 1, 0], 2)  # type: ignore[arg-type]
    assert placement.stage_to_rank == (0, 1, 1, 0)
    hash(placement)  # its schedules hash by it


@pytest.mark.parametrize("args, words", [
    (((0, 1), 2, "zigzag"), "kind='zigzag': use one of loop, v, custom"),
    (((0, 1), 2, "v"), "kind='v' but stage_to_rank=(0, 1) is not the v map of 2 ranks"),
    (((0, 1, 1, 0), 2, "loop"), "is not the loop map of 2 ranks; use Placement.custom"),
    (("01", 2), "stage_to_rank='01': give a tuple of rank numbers"),
    (((0, 1), "2"), "num_ranks='2': must be an integer >= 1"),
])
def test_a_placement_refuses_a_kind_or_map_it_is_not(args: tuple[object, ...], words: str) -> None:
    with pytest.raises(ConfigError) as err:
        Placement(*args)  # type: ignore[arg-type]
    assert words in str(err.value) and "\n" not in str(err.value)


# ---- one ConfigError line naming the argument ------------------------------------------------------------
def test_generate_refuses_a_name_that_is_not_text() -> None:
    with pytest.raises(ConfigError, match=r"^schedule name 3 is a int; give a family's name as text, one of gpipe"):
        generate(3, 2, 4)  # type: ignore[arg-type]


def test_schedule_from_json_refuses_text_that_is_not_json() -> None:
    with pytest.raises(ConfigError, match=r"^schedule JSON that does not parse \(Expecting value"):
        Schedule.from_json("not json")


def test_with_offload_ratio_refuses_a_stage_the_costs_lack() -> None:
    costs = CostModel.per_stage([1, 1], [1, 1], [1, 1])
    with pytest.raises(ConfigError, match=r"^stage=5: the cost model's per-stage times hold fewer stages"):
        costs.with_offload_ratio(0.5, stage=5)
    with pytest.raises(ConfigError, match=r"^stage=-1: must be a stage index"):
        costs.with_offload_ratio(0.5, stage=-1)


@pytest.mark.parametrize("field, value, words", [
    ("offload", ("al",), "offload='al': the policy is not understood"),
    ("recompute", ("sel",), "recompute='sel': the policy is not understood"),
])
def test_plan_request_refuses_a_policy_it_cannot_read_when_built(field: str, value: tuple[str, ...],
                                                                 words: str) -> None:
    """It was refused only by ``run``, after the search had begun; other fields are checked when built."""
    with pytest.raises(ConfigError, match=words):
        PlanRequest(model=model_preset("gpt3-13b"), hardware=hardware_preset("a100"), gpus=8, global_batch=16,
                    memory_budget=40 * GIB, **{field: value})


def test_plan_request_still_takes_the_planners_budget_target() -> None:
    request = PlanRequest(model=model_preset("gpt3-13b"), hardware=hardware_preset("a100"), gpus=8,
                          global_batch=16, memory_budget=40 * GIB, offload=("budget", "all"), recompute=("auto",))
    assert request.offload == ("budget", "all")


@pytest.mark.parametrize("name", pipeoffload.__all__)
def test_every_public_name_has_its_own_docstring(name: str) -> None:
    """``help(pipeoffload.PlanRequest)`` showed only the generated signature: not that the budget is bytes."""
    obj = getattr(pipeoffload, name)
    doc = obj.__doc__ or ""
    assert doc.strip() and not doc.startswith(f"{name}("), name
