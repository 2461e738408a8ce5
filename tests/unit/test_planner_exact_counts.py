"""Probe P: what one rank holds is the model's exact parameter count (a tied embedding once where one
rank holds the embedding and the head), and Gemma / Falcon / multi-query configs are counted as
transformers builds them."""
from __future__ import annotations

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
