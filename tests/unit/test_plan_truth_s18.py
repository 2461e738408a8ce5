"""``plan --dtype`` and ``plan --emit`` plan the run the file starts, as ``train --plan auto`` plans the same
request (eighteenth session)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pipeoffload.train.plan import PLANNED
from tests.conftest import run_cli

GPT = ("--layers", "4", "--hidden", "64", "--heads", "4", "--vocab", "256")
LLAMA = ("--layers", "4", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--vocab", "256")
FFN = {"gpt": (), "llama": ("--ffn", "160")}  # plan's flag; train's --ffn-hidden
PRESET = {"gpt": (), "llama": ("--model", "llama3-8b")}  # plan's Llama shape: a preset's, its sizes overridden


def _emit(tmp_path: Path, family: str, model: tuple[str, ...], dtype: str, memory: str) -> tuple[Any, dict[str, Any]]:
    """``plan --emit``'s request and the train config it wrote (flat keys)."""
    from pipeoffload.cli import build_parser
    from pipeoffload.cli.plan import request_from_args
    from pipeoffload.train.config import load_toml

    path = tmp_path / "run.toml"
    flags = [*PRESET[family], *model, *FFN[family], "--seq", "64", "--gpus", "2", "--global-batch", "8", "--memory", memory, "--gpu", "a100",
             "--dtype", dtype, "--no-pareto", "--emit", str(path)]
    code, _, err = run_cli("plan", *flags)
    assert code == 0, err
    return request_from_args(build_parser().parse_args(["plan", *flags])), load_toml(path)


def _train_plan(family: str, model: tuple[str, ...], dtype: str, memory: str) -> tuple[Any, Any]:
    """``train --plan auto``'s config and its planner request for the same model, GPUs, batch and budget."""
    import pipeoffload.planner as planner
    from pipeoffload.cli import build_parser
    from pipeoffload.cli.train import resolve

    seen: list[Any] = []
    real = planner.find_plans
    planner.find_plans = lambda req: seen.append(req) or real(req)  # type: ignore[assignment,func-returns-value]
    try:
        cfg, _ = resolve(build_parser().parse_args(
            ["train", "--plan", "auto", "--memory", memory, "--gpu", "a100", "--nproc", "2", "--global-batch", "8",
             "--model", family, *model, *(("--ffn-hidden", "160") if FFN[family] else ()), "--seq-len", "64", "--dtype", dtype, "--steps", "2"]))
    finally:
        planner.find_plans = real  # type: ignore[assignment]
    return cfg, seen[-1]


@pytest.mark.parametrize(("family", "model", "dtype", "memory"), [
    ("gpt", GPT, "fp32", "0.01"), ("gpt", GPT, "bf16", "0.01"), ("gpt", GPT, "fp32", "0.0035"),
    ("llama", LLAMA, "bf16", "0.01"), ("llama", LLAMA, "fp32", "0.004")])
def test_plan_emit_plans_what_train_plan_auto_plans(tmp_path: Path, family: str, model: tuple[str, ...], dtype: str,
                                                    memory: str) -> None:
    # plan --emit planned bf16 activations, flash attention and Megatron's optimizer state, and wrote no dtype:
    # train then ran fp32 and kept more than the plan said
    emitted, written = _emit(tmp_path, family, model, dtype, memory)
    assert written["dtype"] == dtype
    cfg, trained = _train_plan(family, model, dtype, memory)
    assert replace(emitted.model, name="x") == replace(trained.model, name="x", vocab=emitted.model.vocab)
    assert emitted.setup == trained.setup
    for key in PLANNED:
        assert str(cfg.get(key)) == str(written.get(key, cfg.get(key))), key


def test_plan_dtype_fp32_doubles_the_activations_planned() -> None:
    from pipeoffload.cli import build_parser
    from pipeoffload.cli.plan import request_from_args

    def model(dtype: str) -> Any:
        args = build_parser().parse_args(["plan", *GPT, "--seq", "64", "--gpus", "2", "--global-batch", "8",
                                          "--dtype", dtype])
        return request_from_args(args).model

    assert model("bf16").dtype_bytes == 2 and model("fp32").dtype_bytes == 4  # bf16: as before the flag
    assert model("fp32").layer_activation_bytes() == 2 * model("bf16").layer_activation_bytes()


@pytest.mark.parametrize(("memory", "budget"), [("40", "budget 40.0 GiB/GPU"), ("0.0035", "budget 3.6 MiB/GPU")])
def test_a_small_plan_says_its_memory_in_a_unit_that_shows_it(memory: str, budget: str) -> None:
    # every figure read 0.0 GiB (and --plan auto's line "0.00 GiB per GPU") for a small model's plans
    from pipeoffload.cli import build_parser
    from pipeoffload.cli.train import resolve

    code, out, err = run_cli("plan", *GPT, "--seq", "64", "--gpus", "2", "--global-batch", "8", "--memory", memory,
                             "--no-pareto", "--top", "1")
    assert code == 0, err
    lines = out.splitlines()
    assert budget in lines[0]
    header, row = lines[lines.index(next(x for x in lines if "total = par" in x)):][:2]
    assert "MiB total = par + opt + act" in header
    assert float(row.split("=")[0].split()[-1]) > 1  # the total, in MiB
    _, notes = resolve(build_parser().parse_args(["train", "--plan", "auto", "--memory", memory, "--nproc", "2"]))
    assert " MiB per GPU, model gpt)" in notes[0] and "0.00 GiB" not in notes[0], notes


SMALL_K = ("--layers", "8", "--hidden", "64", "--heads", "4", "--vocab", "256", "--global-batch", "8", "--dtype", "fp32")


def test_plan_auto_does_not_count_on_copies_the_run_does_not_make() -> None:
    # k = 31.9 forwards a copy for this 4 x 64 GPT on an a100: the planner's timeline (95 % p2p bubble) hid the
    # copies of offload=auto, the run's copy lane (one forward a stage) makes none of them; the plan chose it
    # for 3.7 MiB (1.9 of activations, 1.3 on the host) and the run kept 2.53 MiB of activations, no host memory
    from pipeoffload.cli import build_parser
    from pipeoffload.cli.train import resolve

    cfg, _ = resolve(build_parser().parse_args(
        ["train", "--plan", "auto", "--memory", "0.0039", "--nproc", "4", "--pp", "4", "--schedule",
         "group-interleaved", *SMALL_K, "--seq-len", "64", "--steps", "1"]))
    assert cfg.schedule.offload == "none", cfg.schedule


def test_plan_emit_writes_the_plan_whose_copies_the_run_makes_or_says_it_does_not(tmp_path: Path) -> None:
    common = ["plan", *SMALL_K, "--seq", "64", "--gpus", "4", "--pp", "4", "--schedules", "group-interleaved",
              "--memory", "0.0039", "--no-pareto"]
    path = tmp_path / "run.toml"
    code, out, err = run_cli(*common, "--emit", str(path))
    assert code == 0, err
    assert "(plan #2 of the 2 that fit, PP4xTP1xDP1 group-interleaved" in out and "offload = \"none\"" in path.read_text()
    code, out, err = run_cli(*common, "--offload", "auto", "--group-sizes", "4", "--emit", str(path))
    assert code == 0, err
    note = "offload=auto: the run's copy lane makes none of the 56 copies this plan counts on (k = 31.89 forwards"
    assert f"# {note}" in path.read_text() and note in out
