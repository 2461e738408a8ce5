"""Probe P: what one rank holds is the model's exact parameter count (a tied embedding once where one
rank holds the embedding and the head), and Gemma / Falcon / multi-query configs are counted as
transformers builds them."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipeoffload.placement import Placement
from pipeoffload.planner.hardware import hardware_preset
from pipeoffload.planner.hfconfig import model_from_hf_config
from pipeoffload.planner.model import ModelSpec
from pipeoffload.planner.presets import model_preset
from pipeoffload.planner.stagecosts import Layout, layer_costs, stage_costs

LLAMA_3_2_1B = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                    num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
                    tie_word_embeddings=True)


def _held(spec: ModelSpec, placement: Placement) -> float:
    """Parameters summed over the ranks of one pipeline (TP 1, DP 1)."""
    layout = Layout(pp=placement.num_ranks, tp=1, dp=1)
    lc = layer_costs(spec, hardware_preset("h100"))
    return sum(stage_costs(lc, hardware_preset("h100"), layout, placement.num_stages // placement.num_ranks,
                           spec.layers, placement).params_per_rank)


def _transformers_count(config: Any) -> int:
    import transformers

    torch = pytest.importorskip("torch")
    with torch.device("meta"):
        return int(transformers.AutoModelForCausalLM.from_config(config).num_parameters())


def _saved(config: Any, path: Path) -> Path:
    config.save_pretrained(path)
    return path


@pytest.mark.parametrize("placement", [Placement.loop(1), Placement.v(2), Placement.v(4)],
                         ids=["pp1", "zb-v-pp2", "zb-v-pp4"])
@pytest.mark.parametrize("tied", [True, False])
def test_one_rank_holding_embedding_and_head_holds_the_exact_count(tied: bool, placement: Placement,
                                                                    tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(**{**LLAMA_3_2_1B, "tie_word_embeddings": tied})
    spec = model_from_hf_config(_saved(config, tmp_path))
    expected = 1_235_814_400 if tied else 1_235_814_400 + 128256 * 2048  # transformers' count, meta device
    assert spec.total_params() == expected == _transformers_count(config)
    assert _held(spec, placement) == expected


def test_a_loop_pipeline_keeps_a_tied_copy_on_each_end() -> None:
    """PP 2 on a loop: the first and the last rank each hold the word embedding (Megatron all-reduces it)."""
    spec = model_preset("qwen2.5-0.5b")
    assert spec.tied_embeddings
    assert _held(spec, Placement.loop(2)) == spec.total_params() + spec.word_embedding_params()


# hub-style config.json texts (probe P): Gemma's "gelu" is GeGLU; Gemma 2 writes hidden_activation; Falcon
# names its K/V heads multi_query (7B) or num_kv_heads (40B)
HUB = {
    "gemma-7b": {"architectures": ["GemmaForCausalLM"], "attention_bias": False, "head_dim": 256, "hidden_act": "gelu",
                 "hidden_size": 3072, "intermediate_size": 24576, "max_position_embeddings": 8192,
                 "model_type": "gemma", "num_attention_heads": 16, "num_hidden_layers": 28,
                 "num_key_value_heads": 16, "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "vocab_size": 256000},
    "gemma2-9b": {"architectures": ["Gemma2ForCausalLM"], "head_dim": 256, "hidden_act": None,
                  "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 3584, "intermediate_size": 14336,
                  "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 16,
                  "num_hidden_layers": 42, "num_key_value_heads": 8, "sliding_window": 4096, "vocab_size": 256000},
    "falcon-7b": {"alibi": False, "architectures": ["FalconForCausalLM"], "bias": False, "hidden_size": 4544,
                  "model_type": "falcon", "multi_query": True, "new_decoder_architecture": False,
                  "num_attention_heads": 71, "num_hidden_layers": 32, "parallel_attn": True, "vocab_size": 65024},
    "falcon-40b": {"architectures": ["FalconForCausalLM"], "bias": False, "hidden_size": 8192, "model_type": "falcon",
                   "num_attention_heads": 128, "num_kv_heads": 8, "num_hidden_layers": 60,
                   "new_decoder_architecture": True, "parallel_attn": True, "vocab_size": 65024},
}
KV_HEADS = {"gemma-7b": 16, "gemma2-9b": 8, "falcon-7b": 1, "falcon-40b": 8}


def _hub(name: str, path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(HUB[name]))
    return path


@pytest.mark.parametrize("name", sorted(HUB))
def test_hub_configs_count_as_transformers_builds_them(name: str, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    path = _hub(name, tmp_path / name)
    spec = model_from_hf_config(path)
    assert spec.num_kv_heads == KV_HEADS[name]
    assert spec.total_params() == _transformers_count(transformers.AutoConfig.from_pretrained(path))


@pytest.mark.parametrize("name", ["gemma-7b", "gemma2-9b"])
def test_gemma_is_a_gated_mlp_without_biases_and_its_count_is_exact(name: str, tmp_path: Path) -> None:
    spec = model_from_hf_config(_hub(name, tmp_path / name))
    assert spec.gated_mlp and not spec.bias and not spec.dropout and spec.tied_embeddings
    assert spec.head_dim == 256 and not spec.params_note
    # FLOPs follow the three MLP matrices: the forward GEMMs of a layer are 2 x tokens x its matrix weights
    assert spec.matrix_params_per_layer() == spec.hidden * (spec.attention_width * 2 + 2 * spec.kv_width) \
        + 3 * spec.hidden * spec.ffn_size


def test_falcon_keeps_an_honest_note_for_its_parallel_block(tmp_path: Path) -> None:
    spec = model_from_hf_config(_hub("falcon-7b", tmp_path / "f"))
    assert "parallel" in spec.params_note and "approximate" in spec.params_note


def test_gpt_bigcode_multi_query_is_one_kv_head(tmp_path: Path) -> None:
    """A hub-style GPT-BigCode config says multi_query and no num_key_value_heads."""
    transformers = pytest.importorskip("transformers")
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["GPTBigCodeForCausalLM"], "model_type": "gpt_bigcode", "n_embd": 64, "n_layer": 2,
        "n_head": 4, "vocab_size": 400, "n_positions": 128, "multi_query": True}))
    spec = model_from_hf_config(tmp_path)
    assert spec.num_kv_heads == 1
    assert spec.total_params() == _transformers_count(transformers.AutoConfig.from_pretrained(tmp_path))
