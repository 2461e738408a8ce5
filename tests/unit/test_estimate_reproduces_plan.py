"""Every row ``plan`` prints can be reproduced by an ``estimate`` command: the same layout and schedule
(v, g), the same memory policies in the words the row prints (offload ``auto``, ``budget``, a stall
budget ``auto+5%`` or ``budget:X+5%``; recompute ``first:K``, ``auto``), the same layer split (an
uneven ``even`` split too) give the same step time, tokens/s, MFU and memory. The commands are the
CLI's, as a user types them."""
from __future__ import annotations

import json
import re

import pytest

from pipeoffload.cli import main
from pipeoffload.errors import ConfigError
from pipeoffload.planner.estimate import EstimateRequest, estimate
from pipeoffload.planner.hardware import hardware_preset
from pipeoffload.planner.presets import model_preset
from pipeoffload.planner.split import even_split

# (plan's flags, the flags of the same job in estimate's words). plan shards the optimizer state by
# default; estimate by --distributed-optimizer
GPT13_G = (["--model", "gpt3-13b", "--gpus", "16", "--global-batch", "64", "--memory", "40", "--pp", "4", "--tp",
            "4", "--schedules", "group-interleaved", "--stages-per-rank", "4", "--group-sizes", "2"],
           ["--model", "gpt3-13b", "--global-batch", "64", "--memory", "40", "--distributed-optimizer"])
GPT13_TOP = (["--model", "gpt3-13b", "--gpus", "16", "--global-batch", "64", "--memory", "40", "--top", "10"],
             ["--model", "gpt3-13b", "--global-batch", "64", "--memory", "40", "--distributed-optimizer"])
POLICIES = (["--model", "gpt3-1.3b", "--gpus", "4", "--global-batch", "16", "--memory", "12", "--tp", "1", "--pp",
             "4", "--schedules", "zb-v,group-interleaved", "--stages-per-rank", "2", "--offload", "none,auto,budget",
             "--recompute", "none,first:1,auto", "--max-stall", "5", "--exhaustive", "--top", "40", "--no-pareto"],
            ["--model", "gpt3-1.3b", "--global-batch", "16", "--memory", "12", "--distributed-optimizer"])
# --offload budget under a stall budget: at 44 GiB only ZB-H1's budget plan made for faster copies fits
# (budget:X+5%); estimate fills the same target and plans the copies under the same stall budget
STALL_BUDGET = (["--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--global-batch", "64", "--memory", "44",
                 "--tp", "1", "--schedules", "zb-v,zb-h1", "--offload", "budget", "--max-stall", "5"],
                ["--model", "llama3-8b", "--gpu", "h100", "--global-batch", "64", "--memory", "44",
                 "--distributed-optimizer"])

# plan's job switches, in estimate's flags of the same names: Megatron's selective recomputation under
# the policies, LGD on every plan, the balanced split and a serialized shared host link
SETUP = (["--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "32", "--memory", "20", "--tp", "2", "--pp", "4",
          "--schedules", "zb-v,1f1b", "--recompute", "selective,none,first:1", "--offload", "none,auto",
          "--partial-recompute", "--split", "balanced", "--shared-host-link", "serialized", "--exhaustive", "--top",
          "20", "--no-pareto"],
         ["--model", "gpt3-1.3b", "--global-batch", "32", "--memory", "20", "--distributed-optimizer", "--recompute",
          "selective", "--partial-recompute", "--split", "balanced", "--shared-host-link", "serialized"])


def _plan_rows(capsys: pytest.CaptureFixture, argv: list[str]) -> list[dict]:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["best"]


def estimate_flags(row: dict) -> list[str]:
    """The estimate flags of one plan row (its JSON), in the words the row's text prints."""
    layout = row["layout"]
    argv = ["--pp", str(layout["pp"]), "--tp", str(layout["tp"]), "--dp", str(layout["dp"]),
            "--schedule", row["schedule"], "--stages-per-rank", str(row["stages_per_rank"])]
    if row["group_size"] is not None:
        argv += ["--group-size", str(row["group_size"])]
    # the text prints a budget target as GiB: the target the memory budget leaves, as plan's --offload budget
    argv += ["--offload", "budget" if row["offload"].startswith("budget:") else row["offload"]]
    if row["max_stall"]:
        argv += ["--max-stall", f"{row['max_stall']:g}"]
    if row["recompute"] != "none":  # pipeoffload's policy; estimate's --recompute is Megatron's
        argv += ["--recompute-policy", row["recompute"]]
    return argv


def _estimate(capsys: pytest.CaptureFixture, argv: list[str]) -> dict:
    assert main(["estimate", *argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def _assert_same(row: dict, est: dict) -> None:
    what = f"{row['layout']} {row['schedule']} v={row['stages_per_rank']} g={row['group_size']} " \
           f"offload={row['offload']}+{row['max_stall']} recompute={row['recompute']}"
    assert est["step_seconds"] == pytest.approx(row["step_time_s"], rel=1e-12), what
    assert est["tokens_per_second"] == pytest.approx(row["tokens_per_s"], rel=1e-12), what
    assert est["mfu"] == pytest.approx(row["mfu"], rel=1e-12), what
    assert est["memory_gib"]["worst"] == pytest.approx(row["memory_gib"]["total"], rel=1e-12), what
    assert est["memory_gib"]["host"] == pytest.approx(row["memory_gib"]["host"], rel=1e-12, abs=1e-12), what
    assert est["bubble_ratio"] == pytest.approx(row["bubble_ratio"], rel=1e-9, abs=1e-12), what
    assert est["fits"] is True


def test_an_uneven_even_split_is_estimated_as_plan_splits_it(capsys: pytest.CaptureFixture) -> None:
    """40 layers over PP4 x v=4: plan splits them 3,...,3,2,...,2 (the remainder to the earliest stages);
    estimate refused the layout as not divisible. Now it costs the same split and prints it."""
    plan_argv, job = GPT13_G
    (row,) = _plan_rows(capsys, plan_argv)
    est = _estimate(capsys, [*job, *estimate_flags(row)])
    _assert_same(row, est)
    assert est["layers_per_stage"] == list(even_split(40, 16)) == [3] * 8 + [2] * 8
    assert est["group_size"] == 2
    assert main(["estimate", *job, *estimate_flags(row)]) == 0
    text = capsys.readouterr().out
    assert "group-interleaved v=4 g=2" in text
    assert "layers per stage 3,3,3,3,3,3,3,3,2,2,2,2,2,2,2,2 (uneven: the remainder on the earliest stages)" in text


@pytest.mark.parametrize("case", [GPT13_TOP, POLICIES, SETUP, STALL_BUDGET],
                         ids=["gpt3-13b-top10", "gpt3-1.3b-policies", "gpt3-1.3b-setup", "llama3-8b-budget-stall"])
def test_every_plan_row_is_reproduced_by_its_estimate_command(capsys: pytest.CaptureFixture, case: tuple) -> None:
    plan_argv, job = case
    rows = _plan_rows(capsys, plan_argv)
    if case is POLICIES:  # rows estimate could not express: recompute first:1 and auto, auto+5%, a budget target
        assert {r["recompute"] for r in rows} >= {"first:1", "auto"}
        assert any(r["max_stall"] > 0 for r in rows) and any(r["offload"].startswith("budget:") for r in rows)
    elif case is STALL_BUDGET:  # estimate refused --offload budget --max-stall (plan kept the target infinite)
        assert rows and all(r["offload"].startswith("budget:") and r["max_stall"] == 5 for r in rows)
    elif case is SETUP:
        assert {r["recompute"] for r in rows} >= {"none", "first:1"} and any(r["offload"] == "auto" for r in rows)
    else:  # an even split and group sizes: g=1 and g=2 rows of group-interleaved
        assert {r["group_size"] for r in rows if r["schedule"] == "group-interleaved"} >= {1, 2}
    for row in rows:
        _assert_same(row, _estimate(capsys, [*job, *estimate_flags(row)]))


def test_a_budget_row_is_reproduced() -> None:
    """``--offload budget`` fills its target with what the memory budget leaves, as plan's does: the
    target the JSON names, and the same figures as ``--offload budget:X`` with that X."""
    base = dict(model=model_preset("gpt3-1.3b"), hardware=hardware_preset("a100"), pp=4, global_batch=16,
                schedule="zb-v", distributed_optimizer=True, memory_budget=9 * 2**30, recompute_policy="auto")
    filled = estimate(EstimateRequest(**base, offload="budget"))  # type: ignore[arg-type]
    target = filled.as_dict()["offload"]
    assert re.fullmatch(r"budget:[0-9.]+", target)
    given = estimate(EstimateRequest(**base, offload=target))  # type: ignore[arg-type]
    assert (given.step_seconds, given.memory_worst) == (filled.step_seconds, filled.memory_worst)


def test_group_size_is_the_one_asked_and_shown(capsys: pytest.CaptureFixture) -> None:
    """plan's PP2xTP2xDP4 group-interleaved v=4 g=2 row: 3.875 s, 34.1 GiB; estimate used g=1 (3.938 s)."""
    job = ["--model", "gpt3-13b", "--global-batch", "64", "--memory", "40", "--distributed-optimizer",
           "--pp", "2", "--tp", "2", "--dp", "4", "--schedule", "group-interleaved", "--stages-per-rank", "4"]
    g2, g1, default = (_estimate(capsys, job + extra) for extra in (["--group-size", "2"], ["--group-size", "1"], []))
    assert round(g2["step_seconds"], 3) == 3.875 and round(g2["memory_gib"]["worst"], 1) == 34.1
    assert round(g1["step_seconds"], 3) == 3.938 and g1["group_size"] == 1
    assert default["group_size"] == 1  # the family's own: ceil(PP/2)
    assert default["step_seconds"] == pytest.approx(g1["step_seconds"], rel=1e-9)


@pytest.mark.parametrize("argv, needle", [
    (["--pp", "4", "--schedule", "zb-v", "--group-size", "2"],
     "--group-size 2: schedule zb-v has no group size (only group-interleaved has one); drop the flag"),
    (["--pp", "4", "--schedule", "group-interleaved", "--group-size", "5"],
     "--group-size 5: must be in 1..pp = 1..4"),
    (["--pp", "5", "--schedule", "interleaved-1f1b", "--stages-per-rank", "5"],
     "--layers 24 cannot give each of pp x stages-per-rank = 5 x 5 stages a layer (--split even); use fewer "
     "stages or --split balanced"),
    (["--pp", "4", "--max-stall", "5"], "--max-stall 5 lets offload copies stall, but --offload is none"),
    (["--pp", "4", "--recompute-policy", "auto"],
     "--recompute-policy auto recomputes what the offload policy could not move"),
    (["--pp", "4", "--recompute", "full", "--recompute-policy", "first:1"],
     "--recompute full with --recompute-policy first:1"),
    (["--pp", "4", "--recompute", "first:1"],
     "--recompute first:1 is a pipeoffload recompute policy (plan's recompute column): give it as "
     "--recompute-policy first:1"),
    (["--pp", "4", "--recompute-policy", "lgd"],
     "--recompute-policy lgd: partial recomputation is --partial-recompute here"),
    (["--pp", "4", "--recompute", "first:1,lgd"], "--recompute first:1,lgd: partial recomputation is "
                                                  "--partial-recompute here"),
    (["--pp", "4", "--offload", "auto", "--max-stall", "5", "--recompute-policy", "auto"],
     "--max-stall 5 with --recompute-policy auto"),
    (["--pp", "4", "--offload", "auto+5%"], "--offload auto+5%: write the stall budget as --offload auto --max-stall 5"),
    (["--pp", "4", "--layers-per-stage", "6,6,6"], "--layers-per-stage 6,6,6: needs 4 stages (pp x stages-per-rank"),
    (["--pp", "4", "--layers-per-stage", "6,6,6,5"], "--layers-per-stage 6,6,6,5: holds 23 layers, the model has 24"),
    (["--pp", "4", "--layers-per-stage", "6,6,6,6", "--split", "balanced"],
     "--layers-per-stage with --split balanced"),
])
def test_new_flags_refuse_bad_input_in_one_line(capsys: pytest.CaptureFixture, argv: list, needle: str) -> None:
    shape = ["--layers", "24", "--hidden", "2048", "--heads", "16", "--seq", "2048", "--vocab", "50257",
             "--global-batch", "32"]
    code = main(["estimate", *shape, *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and needle in err and len(err.splitlines()) == 1, err


def test_an_explicit_split_is_the_one_costed(capsys: pytest.CaptureFixture) -> None:
    """``--layers-per-stage`` takes what ``plan --emit`` writes as ``layers_per_stage``."""
    job = ["--model", "gpt3-1.3b", "--global-batch", "16", "--pp", "4", "--schedule", "zb-v"]
    balanced = _estimate(capsys, job + ["--split", "balanced"])
    given = _estimate(capsys, job + ["--layers-per-stage", ",".join(map(str, balanced["layers_per_stage"]))])
    assert given["layers_per_stage"] == balanced["layers_per_stage"]
    assert given["step_seconds"] == balanced["step_seconds"]
    assert given["memory_gib"]["worst"] == balanced["memory_gib"]["worst"]


def test_too_few_layers_for_an_even_split_is_refused_before_costing() -> None:
    with pytest.raises(ConfigError) as err:
        EstimateRequest(model=model_preset("gpt3-1.3b").with_(layers=6), hardware=hardware_preset("a100"), pp=4,
                        global_batch=8, schedule="interleaved-1f1b", stages_per_rank=2)
    assert "model.layers=6 cannot give each of pp x stages-per-rank = 4 x 2 stages a layer" in str(err.value)
    assert "split=balanced" in str(err.value)


def test_the_busiest_rank_line_says_what_its_time_holds(capsys: pytest.CaptureFixture) -> None:
    """With TP > 1 the busy time includes the TP collectives the breakdown lists apart: the line under
    the step says so instead of calling it compute."""
    assert main(["estimate", "--model", "llama3-8b", "--global-batch", "64", "--pp", "4", "--tp", "2",
                 "--dp", "2"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "uneven stage loads" in x)
    assert "computes" not in line
    busy = re.search(r"is busy ([0-9.]+) s \(compute and TP communication\)", line)
    breakdown = re.search(r"compute ([0-9.]+) s .*tp comm ([0-9.]+) s", out)
    assert busy and breakdown
    assert float(busy.group(1)) == pytest.approx(float(breakdown.group(1)) + float(breakdown.group(2)), abs=2e-3)


def test_train_help_names_the_models_it_trains(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())  # the help column wraps with the terminal
    assert "train train a GPT, Llama or Hugging Face model on text" in text


def test_schedules_say_which_memory_unit(capsys: pytest.CaptureFixture) -> None:
    assert main(["schedules"]) == 0
    lines = {x.split()[0]: x for x in capsys.readouterr().out.splitlines()}
    assert "g(v-1)+d activation units" in lines["group-interleaved"]
    assert "(g(v-1)+d)/v rank units" in lines["group-interleaved"]
    for name in ("zb-h1", "zb-h2", "zb-v", "dualpipe-v"):
        assert "rank units" in lines[name], lines[name]
