"""Planner CLI: warnings about the model itself, estimate's parameter count and optimizer flag."""
from __future__ import annotations

import json

from tests.conftest import run_cli

EST = ("--gpu", "h100", "--tp", "1", "--pp", "2", "--dp", "4", "--microbatch-size", "1", "--global-batch", "64",
       "--schedule", "1f1b")


def test_a_seq_past_a_rotary_models_positions_is_planned_with_a_warning() -> None:
    code, out, err = run_cli("estimate", "--model", "llama3-8b", *EST, "--seq", "16384", "--json")
    assert code == 0, err
    warnings = json.loads(out)["warnings"]
    assert any("seq 16384 is past the 8192 positions" in w for w in warnings), warnings
    assert "warning: model llama3-8b: seq 16384 is past the 8192" in err
    code, out, err = run_cli("estimate", "--model", "llama3-8b", *EST, "--seq", "8192")
    assert code == 0 and "past the" not in err, err
    code, out, err = run_cli("plan", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--global-batch", "32",
                             "--seq", "16384", "--top", "1", "--no-pareto")
    assert code == 0 and "seq 16384 is past the 8192 positions" in err, err
    # Llama 3.1 405B was trained to 131072 positions (RoPE scaling): no warning at 16384
    code, out, err = run_cli("estimate", "--model", "llama3-405b", "--gpu", "h100", "--tp", "8", "--pp", "16",
                             "--dp", "1", "--global-batch", "16", "--schedule", "1f1b", "--seq", "16384")
    assert code == 0 and "past the" not in err, err


def test_a_rotary_hf_config_warns_past_its_positions_and_a_learned_one_is_not_read_as_rotary(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "gpt_neox", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 1024, "vocab_size": 1000, "max_position_embeddings": 2048, "rotary_pct": 0.25}))
    code, out, err = run_cli("estimate", "--model", f"hf:{tmp_path}", "--global-batch", "8", "--seq", "4096")
    assert code == 0 and "seq 4096 is past the 2048 positions" in err, err
    code, out, err = run_cli("estimate", "--model", f"hf:{tmp_path}", "--global-batch", "8", "--seq", "2048")
    assert code == 0 and "past the" not in err, err


def test_estimate_prints_the_parameter_count_and_takes_both_optimizer_flags() -> None:
    code, out, err = run_cli("estimate", "--model", "llama3-8b", *EST, "--json")
    assert code == 0, err
    plain = json.loads(out)
    assert plain["params"] == 8_030_261_248 and plain["params_exact"]  # Llama-3-8B's published count
    assert plain["distributed_optimizer"] is False
    code, out, err = run_cli("estimate", "--model", "llama3-8b", *EST)
    assert out.startswith("llama3-8b (8.0B params) on 8 x h100"), out
    off = json.loads(run_cli("estimate", "--model", "llama3-8b", *EST, "--no-distributed-optimizer", "--json")[1])
    on = json.loads(run_cli("estimate", "--model", "llama3-8b", *EST, "--distributed-optimizer", "--json")[1])
    assert off["memory_gib"]["worst"] == plain["memory_gib"]["worst"] > on["memory_gib"]["worst"]
    assert on["distributed_optimizer"] is True
