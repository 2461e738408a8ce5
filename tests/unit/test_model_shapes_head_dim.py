"""An attention width other than the hidden size (config.json's head_dim, Mistral-Nemo) in every attention
term: parameters, FLOPs, GEMM shapes, activation bytes and what W needs."""
import json
from pathlib import Path

import pytest

from pipeoffload.cli import main
from pipeoffload.planner.hardware import hardware_preset
from pipeoffload.planner.hfconfig import model_from_hf_config
from pipeoffload.planner.layertime import layer_times
from pipeoffload.planner.model import ModelSpec
from pipeoffload.planner.presets import model_preset
from pipeoffload.planner.stagecosts import layer_costs

NEMO = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 5120,
        "num_attention_heads": 32, "head_dim": 128, "num_hidden_layers": 40, "intermediate_size": 14336,
        "num_key_value_heads": 8, "vocab_size": 131072, "max_position_embeddings": 131072,
        "hidden_act": "silu", "sliding_window": None, "tie_word_embeddings": False}
SMALL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
         "num_attention_heads": 8, "num_hidden_layers": 4, "intermediate_size": 1536, "num_key_value_heads": 8,
         "vocab_size": 32000, "max_position_embeddings": 2048, "hidden_act": "silu"}


def _hf(tmp_path: Path, name: str, cfg: dict) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.parametrize("generic", [False, True])
def test_mistral_nemo_has_12_25b_parameters(tmp_path: Path, generic: bool) -> None:
    """Llama-family reader and the generic one (no architectures) both honour head_dim."""
    cfg = {k: v for k, v in NEMO.items() if k not in ("architectures", "model_type")} if generic else NEMO
    spec = model_from_hf_config(_hf(tmp_path, "nemo", cfg))
    assert spec.total_params() / 1e9 == pytest.approx(12.25, abs=0.1)  # the probe saw 12.8
    assert (spec.head_dim, spec.attention_width, spec.kv_width) == (128, 4096, 1024)


def test_every_attention_term_uses_the_attention_width(tmp_path: Path) -> None:
    m = model_from_hf_config(_hf(tmp_path, "nemo", NEMO)).with_(seq=4096)
    h, q, kv, f, t = 5120, 4096, 1024, 14336, 4096
    assert m.matrix_params_per_layer() == h * (q + 2 * kv) + q * h + 3 * h * f
    assert m.attention_flops() == 4 * t * t * q
    assert m.layer_forward_flops() == 2 * t * m.matrix_params_per_layer() + 4 * t * t * q
    # norms 2+2+2+2, Q 2q/h, K+V 4kv/h, proj in 2q/h, gate+up 4f/h, act out 2f/h
    per_sbh = 8 + (2 * q + 4 * kv + 2 * q + 6 * f) / h
    assert m.layer_activation_bytes() == pytest.approx(per_sbh * t * h)
    assert m.layer_weight_input_bytes() == pytest.approx((4 + 2 * q / h + 2 * f / h) * t * h)
    hw = hardware_preset("a100")
    wide = m.with_(head_size=None)  # what the probe saw: attention as wide as hidden
    assert layer_times(m, hw, 8).f < layer_times(wide, hw, 8).f
    assert layer_costs(m, hw, 8).activation_bytes < layer_costs(wide, hw, 8).activation_bytes


def test_head_dim_changes_a_small_llama(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """The probe: hidden 512, 8 heads, head_dim 128 gave the same numbers as no head_dim at all."""
    plain, wide = _hf(tmp_path, "plain", SMALL), _hf(tmp_path, "wide", {**SMALL, "head_dim": 128})
    assert model_from_hf_config(wide).total_params() > model_from_hf_config(plain).total_params()
    argv = ["--seq", "1024", "--global-batch", "8", "--json"]
    outs = []
    for folder in (plain, wide):
        assert main(["estimate", "--model", f"hf:{folder}", *argv]) == 0
        outs.append(json.loads(capsys.readouterr().out))
    assert outs[1]["step_seconds"] > outs[0]["step_seconds"]
    assert outs[1]["memory_gib"]["worst"] > outs[0]["memory_gib"]["worst"]


def test_a_head_dim_of_hidden_over_heads_changes_nothing(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Default-shaped models keep their numbers: an explicit head_dim = hidden/heads is the same model."""
    same = model_from_hf_config(_hf(tmp_path, "same", {**SMALL, "head_dim": 64}))
    assert same.with_(source="") == model_from_hf_config(_hf(tmp_path, "plain", SMALL)).with_(source="")
    llama = model_preset("llama3-8b")
    assert llama.total_params() == 8_030_261_248
    explicit = llama.with_(head_size=128)
    hw = hardware_preset("h100")
    assert layer_costs(explicit, hw, 4) == layer_costs(llama, hw, 4)
    gpt = ModelSpec(layers=4, hidden=1024, heads=16, seq=2048)
    assert gpt.params_per_layer() == 12 * 1024**2 + 13 * 1024 and gpt.attention_width == 1024


def test_head_size_lifts_the_hidden_divisibility_rule() -> None:
    spec = ModelSpec(layers=1, hidden=100, heads=3, head_size=32, seq=8)
    assert spec.attention_width == 96
    with pytest.raises(Exception, match="head_size"):
        ModelSpec(layers=1, hidden=96, heads=3, head_size=0, seq=8)
