"""CLI refusals and messages added in the tenth session (each test fails before its fix)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import refused, run_cli


@pytest.mark.parametrize("flags, named", [("--temperature 5", "--temperature 5"), ("--seed 3", "--seed 3"),
                                          ("--temperature 0.5 --seed 1", "--temperature 0.5 --seed 1")])
def test_greedy_with_a_sampling_flag_is_refused(flags: str, named: str, tmp_path: Path) -> None:
    """``generate --greedy --temperature 5`` ran greedily, silently ignoring the temperature."""
    refused(f"generate {tmp_path} --greedy {flags}", f"--greedy with {named}", "not both")


@pytest.mark.parametrize("flags", ["--greedy", "--temperature 0.5 --seed 2", ""])
def test_greedy_or_sampling_alone_passes_that_check(flags: str, tmp_path: Path) -> None:
    err = refused(f"generate {tmp_path} {flags}", "no config.toml")
    assert "--greedy with" not in err


def _notes(*flags: str) -> list[str]:
    from pipeoffload.cli import build_parser
    from pipeoffload.cli.train import resolve

    return resolve(build_parser().parse_args(["train", *flags]))[1]


@pytest.mark.parametrize("flags, words", [
    (["--zero", "1"], "zero=1 with dp=1: one replica holds the whole optimizer state"),
    (["--offload-ratio", "0.7"], "offload_ratio=0.7 with offload='none': no copies are planned"),
    (["--steps", "10", "--warmup", "50"], "warmup=50 is above steps=10: the learning rate is still warming up"),
    (["--steps", "10"], "warmup=20 is above steps=10"),  # the default warm-up, the user's steps
])
def test_a_setting_that_does_nothing_is_said(flags: list[str], words: str) -> None:
    """Accepted (a plan or a shared TOML may carry it) but said in the printed configuration's notes;
    it was silent."""
    assert any(words in note for note in _notes(*flags)), _notes(*flags)


@pytest.mark.parametrize("flags", [[], ["--zero", "1", "--dp", "2", "--nproc", "2"],
                                   ["--offload", "all", "--offload-ratio", "0.7"], ["--steps", "30", "--warmup", "5"]])
def test_settings_that_act_get_no_such_note(flags: list[str]) -> None:
    assert not [n for n in _notes(*flags) if "no effect" in n or "warming up" in n]


def test_a_config_file_key_that_does_nothing_is_said(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text("[schedule]\noffload = 'none'\noffload_ratio = 0.5\n")
    notes = _notes("--config", str(path))
    assert any("offload_ratio=0.5 with offload='none'" in n for n in notes), notes


@pytest.mark.parametrize("flag", ["--pp", "--tp", "--stages-per-rank", "--group-sizes"])
@pytest.mark.parametrize("text", ["2_0", "\u0662", "2,x", "2.0"])
def test_plan_integer_lists_are_plain_ascii(flag: str, text: str) -> None:
    """``plan --pp 2_0`` searched PP 20, and ``--pp ٢`` (an Arabic-Indic two) PP 2: Python's int rules,
    which every other number flag stopped using."""
    refused(f"plan --model gpt3-1.3b --gpu a100 --gpus 8 --global-batch 64 {flag} {text}",
            f"argument {flag}:", "expected comma-separated integers")


def test_plan_group_sizes_restrict_the_search() -> None:
    code, out, err = run_cli("plan", "--model", "gpt3-1.3b", "--gpu", "a100", "--gpus", "8", "--global-batch", "64",
                             "--pp", "8", "--group-sizes", "3", "--json")
    plans = json.loads(out)["best"]
    assert code == 0 and plans and {(p["schedule"], p["group_size"]) for p in plans} == {("group-interleaved", 3)}


def test_plan_group_sizes_without_a_family_that_has_one_is_refused() -> None:
    refused("plan --model gpt3-1.3b --gpu a100 --gpus 8 --global-batch 64 --schedules 1f1b,zb-v --group-sizes 4",
            "--group-sizes 4: no family in --schedules 1f1b,zb-v has a group size (only group-interleaved)")


@pytest.mark.parametrize("ratio, words", [("20", "hides none of the 4 activation windows"),
                                          ("0.5", "hides 1 of the 4 activation windows")])
def test_an_offload_policy_that_leaves_activations_on_the_device_is_said(ratio: str, words: str) -> None:
    """A plan for a small model carries a large k (its copies take many forwards): train's copy lane
    then hid none of them and the run measured no host memory, with nothing said."""
    notes = _notes("--pp", "2", "--nproc", "2", "--microbatches", "4", "--global-batch", "8", "--offload", "all",
                   "--offload-ratio", ratio)
    assert any(words in n and "stay on the device" in n for n in notes), notes


@pytest.mark.parametrize("flags", [["--offload-ratio", "0"], []])
def test_an_offload_policy_that_places_everything_gets_no_such_note(flags: list[str]) -> None:
    notes = _notes("--pp", "2", "--nproc", "2", "--microbatches", "4", "--global-batch", "8", "--offload", "all",
                   *flags)
    assert not [n for n in notes if "stay on the device" in n], notes


def test_a_comma_list_given_twice_is_shown_as_typed() -> None:
    refused("plan --model gpt3-1.3b --gpu a100 --gpus 8 --global-batch 64 --pp 8,4 --pp 1",
            "given twice (--pp 8,4, then --pp 1)")


@pytest.mark.parametrize("flags, words", [
    ("--layers 4 --hidden 64 --heads 4 --seq 64 --vocab 256 --gpus 4 --global-batch 8 --pp 4 "
     "--schedules group-interleaved", "group-interleaved on PP 4 needs at least 8 stages (v=2), more than the 4 "
                                      "layers fill"),
    ("--model gpt3-1.3b --gpu a100 --gpus 8 --global-batch 60 --schedules interleaved-1f1b --pp 8",
     "interleaved-1f1b needs the 60 microbatches to be a multiple of PP 8"),
    ("--model gpt3-1.3b --gpu a100 --gpus 8 --global-batch 64 --schedules zb-v --pp 1", "zb-v needs PP > 1"),
])
def test_no_schedule_names_the_rule_that_ruled_each_family_out(flags: str, words: str) -> None:
    """It said "every family but 1f1b needs PP > 1" for a PP 4 search whose layers could not fill
    its stages."""
    refused(f"plan {flags}", words)


@pytest.mark.parametrize("toml, words", [
    ('[schedule]\nmicrobatches = "8"\n', "microbatches='8' in {path}: must be an integer; write it without quotes"),
    ('[model]\ntie_embeddings = "false"\n', "tie_embeddings='false' in {path}: must be true or false"),
    ("[optim]\nlr = true\n", "lr=True in {path}: must be a number"),
    ("[run]\nsteps = 10.5\n", "steps=10.5 in {path}: must be an integer"),
])
def test_a_config_file_value_of_the_wrong_toml_type_is_refused(tmp_path: Path, toml: str, words: str) -> None:
    """``microbatches = "8"`` ran as 8; a quoted "false" for a switch is the kind that reads as true."""
    path = tmp_path / "run.toml"
    path.write_text(toml)
    refused(f"train --config {path}", words.format(path=path))


def test_a_tiny_models_memory_minimum_is_shown_with_its_digits() -> None:
    """It read "no plan fits 0.0 GiB ... smallest feasible memory is 0.1 GiB (parameters 0.0 + optimizer
    0.0 + activations 0.0 GiB)": neither the budget nor the parts were readable, nor did they add up."""
    import re

    tiny = "plan --layers 8 --hidden 64 --heads 4 --seq 64 --vocab 256 --gpus 4 --global-batch 8"
    err = refused(f"{tiny} --memory 0.001", "no plan fits 0.001 GiB per GPU")
    need = re.search(r"smallest feasible memory is ([0-9.]+) GiB", err).group(1)  # type: ignore[union-attr]
    assert float(need) < 0.01, err
    code, out, _ = run_cli(*f"{tiny} --memory {need} --json".split())
    assert code == 0 and json.loads(out)["best"]  # rounded up: passing it back fits


def test_the_pp_vs_tp_pages_hand_commands_give_its_table(tmp_path: Path) -> None:
    """docs/pp-offload-vs-tp.md's "one side by hand" commands reproduce the 42.9B row of the committed
    results file (they gave 230.634 s against its 230.7: the benchmark ties the embeddings, which
    estimate had no flag for)."""
    import re

    root = Path(__file__).resolve().parents[2]
    page = (root / "docs" / "pp-offload-vs-tp.md").read_text()
    block = page[page.index("# one side by hand"):].split("```")[0]
    commands = [" ".join(c.split()) for c in block.replace("\\\n", " ").splitlines()[1:] if c.strip()]
    results = (root / "benchmarks" / "results" / "plan_pp_vs_tp_paper.txt").read_text()
    row = results[results.index("42.9B"):]
    want = [float(x) for x in re.findall(r":\s+([0-9.]+) s MFU", row)[:2]]
    got = []
    for command in commands:
        code, out, err = run_cli(*command.split()[1:], "--json")
        assert code == 0, err
        got.append(round(json.loads(out)["step_seconds"], 1))
    assert got == want, (got, want)


def test_tied_embeddings_flag_sets_the_models_tying() -> None:
    base = "estimate --model gpt3-1.3b --gpu a100 --pp 4 --global-batch 64 --json"
    untied, tied = (json.loads(run_cli(*f"{base} {flag}".split())[1]) for flag in ("--no-tied-embeddings",
                                                                                    "--tied-embeddings"))
    # a pipeline holds both copies either way; tying adds their gradients' all-reduce to the step
    assert tied["step_seconds"] > untied["step_seconds"]
    assert tied["breakdown_seconds"]["dp_sync"] > untied["breakdown_seconds"]["dp_sync"]


def test_a_simulated_traces_host_peak_is_given_in_its_counters_unit(tmp_path: Path) -> None:
    """otherData had only peak_host_units (activation units) beside counters in rank units, unlabelled."""
    trace = tmp_path / "t.json"
    code, _, err = run_cli("simulate", "group-interleaved", "-d", "4", "-m", "8", "--offload", "all",
                           "--offload-ratio", "0.5", "--trace", str(trace))
    assert code == 0, err
    data = json.loads(trace.read_text())
    other = data["otherData"]
    host = [e["args"]["rank units"] for e in data["traceEvents"]
            if e.get("ph") == "C" and e["name"].startswith("host memory")]
    assert other["peak_host_rank_units"] == max(host) == other["peak_host_units"] / 2
    assert "rank units" in other["units"]["counters"] and "activation units" in other["units"]["fields"]


def test_a_missing_action_says_where_the_list_ends_and_which_microbatches_there_are() -> None:
    """`0F1 0B1` (no microbatch 0) marked 0B1 with "stage 0, microbatch 0 has no F": the marked action
    is where rank 0's list ends, and microbatch 0 exists because 1 does."""
    from pipeoffload import Schedule, ScheduleError, validate

    with pytest.raises(ScheduleError) as info:
        validate(Schedule.from_text("0F1 0B1\n1F1 1B1"))
    assert ("stage 0, microbatch 0 has no F on rank 0 (its list ends at step 1 without it; the schedule has "
            "microbatches 0..1)") in str(info.value)


@pytest.mark.parametrize("split", ["even", "balanced"])
def test_plan_emits_the_layer_split_it_costed_and_train_takes_it(tmp_path: Path, split: str) -> None:
    """A plan is costed with its split of the blocks over the stages (balanced: gpt3-1.3b PP4 x v=2 gets
    2,3,4,4,3,3,3,2); train split the modules evenly whatever the plan said."""
    from pipeoffload.train.config import blocks_per_stage, build_config, load_toml, validate

    path = tmp_path / "run.toml"
    args = ("--model gpt3-1.3b --gpu a100 --gpus 8 --global-batch 64 --pp 4 --schedules zb-v --top 1 --no-pareto "
            f"--split {split} --emit {path}").split()
    assert run_cli("plan", *args)[0] == 0
    cfg = validate(build_config(load_toml(path)), data_exists=False)
    blocks = blocks_per_stage(cfg, 8)
    assert blocks is not None and sum(blocks) == 24
    assert (blocks == (3,) * 8) == (split == "even")


@pytest.mark.parametrize("text, words", [
    ("1,2", "2 numbers for the schedule's 4 stages"), ("1,1,1,2", "adds up to 5 blocks, the model has layers=4"),
    ("2,0,1,1", "stage 1 would hold nothing"), ("1,x,1,1", "give whole numbers separated by commas"),
])
def test_a_layer_split_that_does_not_fit_is_refused(text: str, words: str) -> None:
    refused(f"train --pp 2 --stages-per-rank 2 --schedule interleaved-1f1b --nproc 2 --layers 4 "
            f"--layers-per-stage {text}", f"layers_per_stage='{text}'", words)


def test_a_split_with_an_embedding_only_and_a_head_only_stage_is_taken() -> None:
    """What the paper's layout needs (PP x 2 stages for 2 layers fewer than stages)."""
    from pipeoffload.cli import build_parser
    from pipeoffload.cli.train import resolve

    cfg = resolve(build_parser().parse_args("train --pp 2 --stages-per-rank 2 --schedule interleaved-1f1b --nproc 2 "
                                            "--layers 2 --layers-per-stage 0,1,1,0".split()))[0]
    assert cfg.parallel.layers_per_stage == "0,1,1,0"


def test_plan_auto_trains_the_split_its_plan_was_costed_with() -> None:
    from pipeoffload.cli import build_parser
    from pipeoffload.cli.train import config_from_args
    from pipeoffload.train.config import blocks_per_stage

    cfg = config_from_args(build_parser().parse_args(
        "train --plan auto --memory 0.2 --nproc 2 --pp 2 --global-batch 8 --layers 6".split()))
    blocks = blocks_per_stage(cfg, cfg.parallel.pp * cfg.schedule.stages_per_rank)
    assert blocks is not None and sum(blocks) == 6
    one = config_from_args(build_parser().parse_args(
        "train --plan auto --memory 0.2 --nproc 2 --pp 1 --global-batch 8 --layers 6".split()))
    assert one.parallel.layers_per_stage == ""


def test_zero_with_tensor_parallel_is_refused_before_the_ranks_start() -> None:
    """It failed in every rank (c10d.broadcast_ has no sharding strategy for a DTensor parameter)."""
    refused("train --nproc 4 --dp 2 --tp 2 --zero 1 --hidden 64 --seq-len 32",
            "zero=1 with tp=2: ZeroRedundancyOptimizer cannot shard tensor-parallel (DTensor) parameters")
