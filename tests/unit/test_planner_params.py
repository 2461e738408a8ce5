"""The planner's parameter count equals the model's (probe J): Qwen2's q/k/v-only biases, GPT-2's learned
position table; an architecture read generically whose count is not exact says so in plan and estimate."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipeoffload.llama_config import PRESETS
from pipeoffload.planner.hfconfig import model_from_hf_config
from pipeoffload.planner.presets import model_preset
from pipeoffload.train.family import llama_parameters
from tests.conftest import run_cli


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_llama_family_presets_count_what_the_model_holds(name: str) -> None:
    assert model_preset(name).total_params() == llama_parameters(PRESETS[name])


def test_qwen2_5_0_5b_count_is_the_published_one() -> None:
    assert model_preset("qwen2.5-0.5b").total_params() == 494_032_768


def _saved(config: Any, path: Path) -> Path:
    config.save_pretrained(path)
    return path


def _transformers_count(config: Any) -> int:
    import transformers

    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    return int(transformers.AutoModelForCausalLM.from_config(config).num_parameters())


TINY = dict(vocab_size=400, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2)


def _configs() -> dict[str, Any]:
    transformers = pytest.importorskip("transformers")
    return {
        "qwen2-tied": transformers.Qwen2Config(tie_word_embeddings=True, **TINY),
        "qwen2-untied": transformers.Qwen2Config(tie_word_embeddings=False, **TINY),
        "llama": transformers.LlamaConfig(tie_word_embeddings=False, **TINY),
        "mistral-tied": transformers.MistralConfig(tie_word_embeddings=True, sliding_window=None, **TINY),
        "gpt2": transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=400, n_positions=128),
        "gpt2-inner": transformers.GPT2Config(n_embd=64, n_layer=3, n_head=4, vocab_size=300, n_positions=96,
                                              n_inner=160, tie_word_embeddings=False),
    }


@pytest.mark.parametrize("kind", ["qwen2-tied", "qwen2-untied", "llama", "mistral-tied", "gpt2", "gpt2-inner"])
def test_count_equals_transformers(kind: str, tmp_path: Path) -> None:
    config = _configs()[kind]
    spec = model_from_hf_config(_saved(config, tmp_path))
    assert spec.total_params() == _transformers_count(config)
    assert not spec.params_note


def test_an_architecture_read_generically_says_its_count_is_approximate(tmp_path: Path) -> None:
    """Phi: one LayerNorm per (parallel) block and a biased head, which the generic reader does not model:
    118,272 against transformers' 118,416 (+ 400 head bias, - 2 x 64 x 2 norm weights and biases)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.PhiConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                    num_attention_heads=4, vocab_size=400, architectures=["PhiForCausalLM"])
    path = _saved(config, tmp_path)
    spec = model_from_hf_config(path)
    assert spec.total_params() != _transformers_count(config)
    assert "PhiForCausalLM" in spec.params_note and "approximate" in spec.params_note
    code, out, err = run_cli("estimate", "--model", f"hf:{path}", "--global-batch", "8")
    assert code == 0 and "approximate" in err and "PhiForCausalLM" in err, err
    code, out, err = run_cli("plan", "--model", f"hf:{path}", "--gpus", "2", "--global-batch", "8", "--json")
    assert code == 0 and "approximate" in err, err
    assert any("approximate" in w for w in json.loads(out)["warnings"])
    code, out, err = run_cli("plan", "--model", f"hf:{path}", "--gpus", "2", "--global-batch", "8")
    assert code == 0 and "~" in out.splitlines()[0] and "approximate" in err, (out, err)


def test_an_exact_count_gets_no_note(tmp_path: Path) -> None:
    config = _configs()["qwen2-tied"]
    path = _saved(config, tmp_path)
    code, out, err = run_cli("estimate", "--model", f"hf:{path}", "--global-batch", "8")
    assert code == 0 and "approximate" not in err, err


def test_qwen2_biases_keep_the_planner_s_flops_and_activations() -> None:
    """Only the parameter count moves: q/k/v biases add no GEMM FLOPs and no saved activations."""
    qwen = model_preset("qwen2.5-7b")
    plain = qwen.with_(qkv_bias=False)
    assert qwen.layer_forward_flops() == plain.layer_forward_flops()
    assert qwen.activation_coefficient() == plain.activation_coefficient()
    assert qwen.params_per_layer() - plain.params_per_layer() == qwen.attention_width + 2 * qwen.kv_width
