"""Probe P, plan/estimate CLI: a family named twice is one, refusals and warnings say what works."""
from __future__ import annotations

import json

from tests.conftest import refused, run_cli

LLAMA8 = ("--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--global-batch", "32", "--seq", "4096",
          "--top", "5", "--no-pareto", "--json")


def _best(*extra: str) -> list:
    code, out, err = run_cli("plan", *LLAMA8, *extra)
    assert code == 0, err
    return json.loads(out)["best"]


def test_a_family_named_twice_in_any_case_is_searched_once() -> None:
    once = _best("--schedules", "zb-v")
    assert len(once) == 5
    assert _best("--schedules", "ZB-V,zb-v") == once
    assert _best("--schedules", "1f1b,1f1b") == _best("--schedules", "1f1b")


def _falcon(tmp_path) -> str:  # type: ignore[no-untyped-def]
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["FalconForCausalLM"], "model_type": "falcon", "bias": False, "hidden_size": 4544,
        "multi_query": True, "num_attention_heads": 71, "num_hidden_layers": 32, "parallel_attn": True,
        "vocab_size": 65024}))
    return f"hf:{tmp_path}"


def test_the_approximate_note_is_printed_when_no_plan_fits_too(tmp_path) -> None:  # type: ignore[no-untyped-def]
    code, out, err = run_cli("plan", "--model", _falcon(tmp_path), "--gpu", "h100", "--gpus", "1",
                             "--global-batch", "8", "--seq", "2048")
    assert code == 2 and out == ""
    assert "warning: FalconForCausalLM" in err and "approximate" in err and "error: no plan fits" in err, err


def test_a_need_above_the_gpu_advises_gpus_or_parallelism_not_memory() -> None:
    code, out, err = run_cli("plan", "--model", "llama3-70b", "--gpu", "h100", "--gpus", "2", "--global-batch", "8")
    assert code == 2 and "no plan fits" in err and "raise --memory" not in err
    assert "above a h100's 79.6 GiB" in err and "--gpus" in err and "--tp/--pp" in err, err


def test_a_tiny_memory_is_refused_in_cli_words() -> None:
    line = refused("plan --model llama3-8b --gpus 8 --global-batch 8 --memory 1e-8", "--memory 1e-08", "GiB")
    assert "memory_budget" not in line and "2**30" not in line


def test_a_config_without_heads_says_what_works(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5", "d_model": 768, "num_layers": 12,
                                                      "vocab_size": 32128}))
    line = refused(f"estimate --model hf:{tmp_path} --global-batch 8 --heads 12", "no heads", "drop --model hf:")
    code, out, err = run_cli("estimate", "--layers", "12", "--hidden", "768", "--heads", "12", "--vocab", "32128", "--seq", "512",
                             "--global-batch", "8")
    assert code == 0, err  # what the message advises works
    assert line
