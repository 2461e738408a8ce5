"""Probe P, plan/estimate CLI: a family named twice is one, refusals and warnings say what works."""
from __future__ import annotations

import json

import pytest

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


def _config(tmp_path, **data) -> str:  # type: ignore[no-untyped-def]
    (tmp_path / "config.json").write_text(json.dumps(data))
    return f"hf:{tmp_path}"


def test_a_seq_past_a_learned_position_table_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    gpt2 = _config(tmp_path, model_type="gpt2", n_embd=64, n_layer=2, n_head=4, vocab_size=400, n_positions=128)
    refused(f"estimate --model {gpt2} --global-batch 8 --seq 4096", "seq 4096", "learned position table (128 rows)",
            "--seq 128")
    assert run_cli("estimate", "--model", gpt2, "--global-batch", "8", "--seq", "128")[0] == 0


@pytest.mark.parametrize("kind", ["phi3", "starcoder2", "gemma2"])
def test_a_sliding_window_below_seq_is_refused_for_every_architecture(tmp_path, kind: str) -> None:  # type: ignore[no-untyped-def]
    model = _config(tmp_path, model_type=kind, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=512, vocab_size=1000, max_position_embeddings=8192, sliding_window=1024,
                    bos_token_id=1, eos_token_id=2, pad_token_id=None)  # Phi3Config's defaults are past 1000 tokens
    refused(f"estimate --model {model} --global-batch 8 --seq 4096", "sliding_window=1024", "--seq 1024")
    code, out, err = run_cli("estimate", "--model", model, "--global-batch", "8")
    assert code == 0 and "seq 1,024" in out, (out, err)  # read at the window
