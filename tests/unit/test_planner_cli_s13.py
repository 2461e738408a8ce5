"""Planner CLI: warnings about the model itself, estimate's parameter count and optimizer flag."""
from __future__ import annotations

import json

import pytest

from tests.conftest import refused, run_cli

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


def _llama_config(tmp_path, **extra) -> str:  # type: ignore[no-untyped-def]
    data = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
            "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 1000, "max_position_embeddings": 2048, **extra}
    (tmp_path / "config.json").write_text(json.dumps(data))
    return f"hf:{tmp_path}"


@pytest.mark.parametrize("text", ["false", "no", "true", "0"])
def test_a_true_false_field_written_as_text_is_refused_not_read_as_true(tmp_path, text: str) -> None:  # type: ignore[no-untyped-def]
    refused(f"estimate --model {_llama_config(tmp_path, tie_word_embeddings=text)} --global-batch 8",
            f"tie_word_embeddings='{text}' is not true or false", "no quotes")
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4,
                                                  "vocab_size": 400, "n_positions": 128, "tie_word_embeddings": text}))
    refused(f"estimate --model hf:{gpt2} --global-batch 8 --seq 128", "tie_word_embeddings=")


def test_real_true_false_fields_are_read_as_written(tmp_path) -> None:  # type: ignore[no-untyped-def]
    tied = json.loads(run_cli("estimate", "--model", _llama_config(tmp_path, tie_word_embeddings=True),
                              "--global-batch", "8", "--json")[1])["params"]
    untied = json.loads(run_cli("estimate", "--model", _llama_config(tmp_path, tie_word_embeddings=False),
                                "--global-batch", "8", "--json")[1])["params"]
    absent = json.loads(run_cli("estimate", "--model", _llama_config(tmp_path), "--global-batch", "8", "--json")[1])
    assert untied - tied == 1000 * 256 and absent["params"] == untied


@pytest.mark.parametrize(("command", "fix"), [
    ("estimate --model qwen2.5-0.5b --tp 4 --global-batch 8", "use --tp 1 or 2"),
    ("estimate --model qwen2.5-7b --tp 8 --global-batch 8", "use --tp 1, 2 or 4"),
    ("plan --model gpt3-1.3b --gpus 4 --tp 8 --global-batch 16", "use --tp 1, 2 or 4"),
    ("plan --model gpt3-13b --gpus 6 --tp 4 --global-batch 16", "use --tp 1 or 2"),
    ("k --model qwen2.5-0.5b --tp 4", "use --tp 1 or 2"),
])
def test_a_tensor_parallel_size_that_does_not_divide_names_the_sizes_that_do(command: str, fix: str) -> None:
    line = refused(command, fix)
    assert line.rstrip().endswith(fix), line


def test_plan_json_carries_the_capped_memory_warning_it_prints() -> None:
    code, out, err = run_cli("plan", "--model", "gpt3-1.3b", "--gpus", "2", "--global-batch", "8", "--memory", "100",
                             "--top", "1", "--no-pareto", "--json")
    assert code == 0, err
    warning = "--memory 100 GiB is above the a100's 80.00 GiB; plans are checked against 80.00 GiB"
    assert any(w.startswith(warning) for w in json.loads(out)["warnings"]), out
    assert err.count(warning) == 1, err  # printed once
    code, out, err = run_cli("plan", "--model", "gpt3-1.3b", "--gpus", "2", "--global-batch", "8", "--memory", "60",
                             "--top", "1", "--no-pareto", "--json")
    assert code == 0 and json.loads(out)["warnings"] == [] and "above the" not in err


@pytest.mark.parametrize(("flags", "piece"), [
    ("--hidden 4096 --seq 2048 --head-dim 100", "--hidden 4096 is not a multiple of --head-dim 100"),
    ("--hidden 4096 --seq 2048 --head-dim 8192", "--hidden 4096 is not a multiple of --head-dim 8192"),
    ("--hidden 4095 --seq 2048", "--hidden 4095 is not a multiple of the default head width 128"),
])
def test_a_head_width_that_does_not_divide_hidden_is_refused_not_rounded(flags: str, piece: str) -> None:
    refused(f"plan {flags} --gpus 1 --global-batch 8", piece, "--heads N")
    refused(f"k {flags}", piece)
    code, out, err = run_cli("k", "--hidden", "4096", "--seq", "2048", "--head-dim", "64", "--json")
    assert code == 0, err


def test_an_h100_prediction_above_megatrons_published_mfu_warns_and_a_default_one_does_not() -> None:
    job = ("estimate", "--model", "llama3-70b", "--gpu", "h100", "--tp", "8", "--pp", "4", "--global-batch", "64")
    code, out, err = run_cli(*job, "--flops", "989", "--json")  # every FLOP at the peak: 66.8 % MFU
    assert code == 0, err
    assert any("above the best published 47.0%" in w for w in json.loads(out)["warnings"]), out
    for gpu in ("h200", "gh200"):  # the same chip
        code, out, err = run_cli(*job[:4], gpu, *job[5:], "--flops", "989")
        assert code == 0 and "best published 47.0%" in err, (gpu, err)
    code, out, err = run_cli(*job)  # the calibrated rate: 34 %
    assert code == 0 and "best published" not in err, err
