"""``train --plan auto`` keeps the constraints it cannot pass to the planner (FSDP/ZeRO layouts, the stages of a
``--layers-per-stage``) and a refusal after the search is one line (seventeenth session)."""
from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from pipeoffload.errors import ConfigError

PLAN = ("--plan", "auto", "--memory", "0.01", "--steps", "2")


def _resolve(*argv: str) -> tuple[Any, list[str]]:
    from pipeoffload.cli import build_parser
    from pipeoffload.cli.train import resolve

    return resolve(build_parser().parse_args(["train", *PLAN, *argv]))


def test_plan_auto_with_fsdp_searches_only_layouts_fsdp_runs_on() -> None:
    # offload all is fastest on pp 2 x dp 1 here, where FSDP (dp >= 2) was then refused after the search
    cfg, _ = _resolve("--nproc", "4", "--offload", "all", "--fsdp")
    assert cfg.parallel.fsdp and cfg.parallel.dp >= 2 and cfg.parallel.tp == 1
    with pytest.raises(ConfigError, match=r"^--plan auto: no plan for 2 ranks keeping --offload all --fsdp fits"):
        _resolve("--nproc", "2", "--offload", "all", "--fsdp")


def test_plan_auto_refuses_zero_with_a_fixed_tp_naming_both() -> None:
    with pytest.raises(ConfigError, match=r"^--plan auto: --tp 2 --zero 1 cannot split the 2 ranks .*--zero 1 needs tp 1"):
        _resolve("--nproc", "2", "--tp", "2", "--zero", "1")


@pytest.mark.parametrize("split, stages", [("1,1,1,1", 4), ("1,3", 2), ("4", 1)])
def test_plan_auto_plans_the_stages_of_a_given_layers_per_stage(split: str, stages: int) -> None:
    # 1,1,1,1 on 2 ranks: the plan was pp 1 (one stage), then refused for its 4 numbers
    cfg, _ = _resolve("--nproc", "2", "--layers-per-stage", split)
    assert cfg.parallel.pp * cfg.schedule.stages_per_rank == stages
    assert cfg.parallel.layers_per_stage == split


def test_plan_auto_refuses_a_split_no_layout_has_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"^--plan auto: --layers-per-stage 1,1,1 lists 3 stages, .*--pp 2"):
        _resolve("--nproc", "4", "--pp", "2", "--layers-per-stage", "1,1,1")


def test_plan_auto_says_its_choice_with_the_config_and_a_later_refusal_is_one_line() -> None:
    _, notes = _resolve("--nproc", "2")
    assert notes[0].startswith("--plan auto chose pp=1, tp=1, dp=2, schedule=1f1b"), notes
    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, "-m", "pipeoffload", "train", *PLAN, "--nproc", "2", "--eval-every", "0"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == ["pipeoffload train: error: eval_every=0: must be >= 1"], done.stderr


def test_plan_auto_plans_offload_without_lgd_which_train_does_not_perform(planned: list[Any]) -> None:
    # the planner's default assumes LGD partial recomputation on every plan that offloads: the plan of
    # --offload all counted 2 layers of 448 KiB, not 640 KiB, and predicted 1835008
    # activation bytes on rank 0 where the run (offload_ratio 20.2: the copies hide nothing) measured 2654208
    from pipeoffload.planner.search import find_plans as real  # the search itself (``planned`` spies on the package's)

    def plan_of(offload: str) -> Any:
        _resolve("--nproc", "4", "--pp", "4", "--layers", "8", "--schedule", "zb-h1", "--microbatches", "8",
                 "--offload", offload)
        return real(planned[-1]).fitting[0]

    offloaded, kept = plan_of("all"), plan_of("none")
    assert offloaded.choice.offload.kind == "all" and kept.choice.offload.kind == "none"
    # 2 blocks a stage: 64 fp32 bytes a token and hidden unit, the 4 heads' fp32 scores, the s x s bool causal
    # mask and the two LayerNorms' fp32 mean and rstd (16 bytes a token: planner.trainblocks)
    assert offloaded.unit_bytes == kept.unit_bytes == 2 * (64 * 64 * 64 + 4 * 4 * 64 * 64 + 64 * 64 + 16 * 64)


def test_plan_emit_writes_the_dtype_it_planned(tmp_path: Any) -> None:
    # the plan counted bf16 activations and flash attention; the file had no dtype key (only a comment), so train
    # ran fp32 and its GPT kept the s x s scores: 1425408 activation bytes measured for the 638976 predicted.
    # Now --emit plans train's own blocks in --dtype (default bf16) and writes that dtype (eighteenth session)
    from pipeoffload.cli import main
    from pipeoffload.train.config import load_toml

    path = tmp_path / "run.toml"
    assert main(["plan", "--layers", "4", "--hidden", "64", "--heads", "4", "--seq", "64", "--vocab", "256",
                 "--gpus", "2", "--global-batch", "8", "--memory", "0.01", "--no-pareto", "--emit", str(path)]) == 0
    assert not [line for line in path.read_text().splitlines() if line.startswith("# activation memory planned")]
    assert load_toml(path)["dtype"] == "bf16"


def test_plan_auto_memory_above_the_gpu_names_both_flags() -> None:
    from pipeoffload.cli import build_parser
    from pipeoffload.cli.train import resolve

    args = build_parser().parse_args(["train", "--plan", "auto", "--nproc", "2", "--memory", "100", "--gpu", "h100"])
    with pytest.raises(ConfigError, match=r"^--memory 100: above the 79\.65 GiB of --gpu h100; give at most that"):
        resolve(args)


def test_plan_auto_says_a_max_stall_its_plan_does_not_use() -> None:
    cfg, notes = _resolve("--nproc", "2", "--max-stall", "5")  # reset to 0 without a word before
    assert cfg.schedule.max_stall == 0.0
    assert notes[0].endswith("; --max-stall 5 is not used by the plan chosen (max_stall = 0)"), notes
