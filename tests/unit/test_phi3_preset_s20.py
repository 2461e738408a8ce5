"""The planner's ``phi3-mini`` preset is microsoft/Phi-3-mini-4k-instruct's published config.json: transformers'
Phi3ForCausalLM built from it holds the parameters the planner counts (3.821B), it is planned at its 2047-token
sliding window (the planner's full causal attention is the window's up to that length; a longer --seq is
refused), it is listed where the presets are, and ``plan --emit`` writes a Llama of its shape that train builds
parameter for parameter."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeoffload.errors import ConfigError
from pipeoffload.llama_config import PRESETS, LlamaShape
from pipeoffload.planner.presets import model_preset
from tests.conftest import run_cli

# Phi-3-mini-4k-instruct's config.json (the fields the shape reads; test_phi3_s19's published ones)
PUBLISHED = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "attention_dropout": 0.0, "bos_token_id": 1,
             "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu", "hidden_size": 3072,
             "intermediate_size": 8192, "max_position_embeddings": 4096, "num_attention_heads": 32,
             "num_hidden_layers": 32, "num_key_value_heads": 32, "original_max_position_embeddings": 4096,
             "pad_token_id": 32000, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": None,
             "rope_theta": 10000.0, "sliding_window": 2047, "tie_word_embeddings": False, "attention_bias": False,
             "vocab_size": 32064}


def test_the_preset_is_the_published_config() -> None:
    assert PRESETS["phi3-mini"] == LlamaShape.from_hf(PUBLISHED)


def test_the_preset_counts_what_transformers_builds() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        ref = transformers.AutoModelForCausalLM.from_config(transformers.Phi3Config(**PRESETS["phi3-mini"].to_hf()))
    assert type(ref).__name__ == "Phi3ForCausalLM"
    assert model_preset("phi3-mini").total_params() == ref.num_parameters()
    assert round(ref.num_parameters() / 1e9, 3) == pytest.approx(3.821, abs=0.0005)


def test_it_is_planned_within_its_window() -> None:
    spec = model_preset("phi3-mini")
    assert (spec.seq, spec.attention_window, spec.layers, spec.hidden, spec.ffn_size) == (2047, 2047, 32, 3072, 8192)
    with pytest.raises(ConfigError, match="sliding_window=2047 is below seq 4096"):
        spec.with_(seq=4096)
    code, out, err = run_cli("plan", "--model", "phi3-mini", "--seq", "4096", "--gpus", "8", "--global-batch", "16")
    assert code == 2 and not out and err.splitlines() == [
        "pipeoffload plan: error: model phi3-mini: sliding_window=2047 is below seq 4096 and the planner models full "
        "causal attention only; use --seq 2047 or less"], err


def test_it_is_listed_with_the_presets() -> None:
    code, out, _ = run_cli("plan", "--help")
    assert code == 0 and "phi3-mini" in " ".join(out.split())
    docs = (Path(__file__).resolve().parents[2] / "docs" / "planner.md").read_text()
    listed = re.search(r"Presets: (.*?) \(the\n?reference", docs, re.S).group(1)  # type: ignore[union-attr]
    assert "`phi3-mini`" in listed, listed


def test_emit_writes_a_llama_of_its_shape_that_train_builds_as_planned(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from pipeoffload.train.config import build_config, load_toml, validate
    from pipeoffload.train.family import llama_parameters, shape_from_keys

    path = tmp_path / "run.toml"
    code, _, err = run_cli("plan", "--model", "phi3-mini", "--gpus", "8", "--global-batch", "16", "--no-pareto",
                           "--emit", str(path))
    assert code == 0, err
    cfg = validate(build_config(load_toml(path)), data_exists=False)
    assert cfg.model.source == "llama" and cfg.model.seq_len == 2047
    assert llama_parameters(shape_from_keys(cfg.model, 256)) == model_preset("phi3-mini").total_params()
