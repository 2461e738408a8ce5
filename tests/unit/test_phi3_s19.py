"""Phi3ForCausalLM (Phi-3-mini/medium, Phi-4) from a Hugging Face folder, against transformers (session 19): its
fused ``qkv_proj`` (q, k, v rows) and ``gate_up_proj`` (gate, up rows) split onto Llama's projections on load and
fused again on export; Phi3Config's defaults for absent fields; its sliding window (every layer, whenever set)
kept as Mistral's; LongRoPE, a partial rotary factor, dropout refused in one line; one process trains as
transformers does, resumes bitwise, exports a folder transformers reloads as Phi3 with equal logits, generates as
transformers does, and plans with transformers' parameter count."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from pipeoffload.cli import main  # noqa: E402
from pipeoffload.errors import ConfigError  # noqa: E402
from pipeoffload.hfdir import open_hf_dir  # noqa: E402
from pipeoffload.llama_config import LlamaShape  # noqa: E402
from pipeoffload.models.hf import hf_model  # noqa: E402
from pipeoffload.planner.hfconfig import model_from_hf_config  # noqa: E402
from tests.conftest import refused  # noqa: E402
from tests.hf_fixtures import (  # noqa: E402
    assert_generates_as_transformers,
    assert_plan_emits_and_auto_trains,
    assert_trains_as_transformers_and_resumes,
    edit_config,
    make_hf_dir,
    train_and_resume,
)

PHI3 = "Phi3ForCausalLM"


@pytest.mark.parametrize("over", [{}, {"tie_word_embeddings": True, "num_key_value_heads": 1},
                                  {"head_dim": 32, "num_key_value_heads": 4, "pad_token_id": 5},
                                  {"sliding_window": 40, "rope_theta": 2e5}])
def test_folder_loads_split_with_transformers_logits(tmp_path: Path, over: dict[str, Any]) -> None:
    """The fused tensors split on load: logits equal transformers' Phi3 (multi-query, multi-head, grouped; a head
    width set apart; a padding id; a window as long as the sequence), and the shape survives an export's
    config.json."""
    ref = make_hf_dir(tmp_path, "phi3", num_hidden_layers=2, **over)
    hf = open_hf_dir(tmp_path)
    assert hf.shape.fused and hf.shape.architecture == PHI3 and not (hf.shape.qkv_bias or hf.shape.mlp_bias)
    assert LlamaShape.from_hf(hf.shape.to_hf()) == hf.shape
    tokens = torch.randint(0, ref.config.vocab_size, (2, 40))
    with torch.no_grad():
        assert (hf_model(hf).eval().layers(tokens, None, 0) - ref(tokens).logits).abs().max().item() < 1e-5


def _bare(**fields: Any) -> dict[str, Any]:
    """A config.json holding only the fields no config class defaults sensibly, plus ``fields``."""
    return {"architectures": [PHI3], "vocab_size": 32064, "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 2, "num_attention_heads": 4, **fields}


def test_absent_fields_read_as_phi3config_reads_them() -> None:
    """Phi3Config: key/value heads = heads, eps 1e-5, 4096 positions, theta 10000, head width hidden / heads, no
    window, untied, bos 1, eos and padding 32000 (the embedding row left untrained), no biases."""
    raw = _bare()
    ref = transformers.Phi3Config(**{k: v for k, v in raw.items() if k != "architectures"})
    shape = LlamaShape.from_hf(raw)
    assert (shape.n_kv_heads, shape.rms_eps, shape.max_positions, shape.rope_theta, shape.dim_head) == \
        (ref.num_key_value_heads, ref.rms_norm_eps, ref.max_position_embeddings, ref.rope_parameters["rope_theta"],
         ref.hidden_size // ref.num_attention_heads) == (4, 1e-5, 4096, 10000.0, 16)
    assert (shape.bos_token_id, shape.eos_token_id, shape.pad_token_id) == \
        (ref.bos_token_id, ref.eos_token_id, ref.pad_token_id) == (1, 32000, 32000)
    assert shape.sliding_window == (ref.sliding_window or 0) == 0 and not shape.tie_embeddings
    exported = shape.to_hf()  # written out, so a reload does not fall back on a default
    assert exported["model_type"] == "phi3" and LlamaShape.from_hf(exported).to_hf() == exported
    nulls = LlamaShape.from_hf(_bare(bos_token_id=None, eos_token_id=None, pad_token_id=None))
    assert (nulls.bos_token_id, nulls.eos_token_id, nulls.pad_token_id) == (None, None, None)
    assert LlamaShape.from_hf(nulls.to_hf()).to_hf() == nulls.to_hf()


@pytest.mark.parametrize(("fields", "window", "context"), [
    ({"sliding_window": 2047}, 2047, 2047),  # Phi-3-mini-4k: every layer slides
    ({"sliding_window": 16, "use_sliding_window": False}, 16, 16),  # a Qwen2 field: Phi3 slides anyway
    ({"sliding_window": None, "max_position_embeddings": 16384}, 0, 16384),  # Phi-4
])
def test_a_window_is_kept_as_phi3_applies_it(fields: dict[str, Any], window: int, context: int) -> None:
    ref = transformers.Phi3Config(**_bare(**fields))
    assert (ref.sliding_window or 0) == window
    shape = LlamaShape.from_hf(_bare(**fields))
    assert (shape.sliding_window, shape.context) == (window, context)


def test_full_causal_attention_is_the_window_s_own_up_to_its_length() -> None:
    """transformers' Phi3 masks keys more than ``sliding_window - 1`` tokens back in every layer: on sequences of
    at most that many tokens its logits are those without a window (what this model computes), on longer ones
    they are not (why train refuses a longer --seq-len)."""
    torch.manual_seed(0)
    full, windowed = (transformers.AutoModelForCausalLM.from_config(transformers.Phi3Config(
        vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
        pad_token_id=None, eos_token_id=1, sliding_window=window), attn_implementation="sdpa").eval()
        for window in (None, 8))
    windowed.load_state_dict(full.state_dict())
    tokens = torch.randint(0, 50, (1, 9))
    with torch.no_grad():
        assert torch.equal(full(tokens[:, :8]).logits, windowed(tokens[:, :8]).logits)
        assert not torch.allclose(full(tokens).logits[:, 8], windowed(tokens).logits[:, 8])


@pytest.mark.parametrize(("fields", "words"), [
    ({"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [1.0] * 8}},
     ["rope_scaling has rope_type='longrope'", "LongRoPE", "use a checkpoint whose rope_scaling is null"]),
    ({"rope_scaling": {"type": "su", "short_factor": [1.0] * 8, "long_factor": [1.0] * 8}}, ["rope_type='su'"]),
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 64}}, ["rope_type='llama3'", PHI3]),
    ({"partial_rotary_factor": 0.75}, ["partial_rotary_factor=0.75 is not supported for Phi3ForCausalLM",
                                       "Phi-4-mini", "use a checkpoint with 1.0"]),
    ({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}}, ["partial_rotary_factor=0.5"]),
    ({"resid_pdrop": 0.1}, ["resid_pdrop=0.1 is not supported", "set it to 0"]),
    ({"embd_pdrop": 0.1}, ["embd_pdrop=0.1 is not supported", "set it to 0"]),
    ({"attention_dropout": 0.1}, ["attention_dropout=0.1 is not supported", "set it to 0"]),
    ({"head_dim": None}, ["head_dim=None", "write it"]),
    ({"mlp_bias": True}, ["mlp_bias=true is not supported for Phi3ForCausalLM", "set it to false"]),
    ({"vocab_size": 300, "eos_token_id": 1}, ["leaves out bos_token_id, pad_token_id: the config class's default",
                                             "pad_token_id=32000 is not a token id of vocab_size=300"]),
    ({"sliding_window": 0}, ["sliding_window=0", "or null for none"]),
])
def test_what_phi3_has_and_this_model_not_is_refused_in_one_line(fields: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        LlamaShape.from_hf(_bare(**fields))
    text = str(err.value)
    assert "\n" not in text and all(w in text for w in words), text


# the published config.json files' fields (Phi-3-mini-4k-instruct, Phi-3-medium-4k-instruct; transformers 4.39's)
_PUBLISHED = {"architectures": [PHI3], "model_type": "phi3", "attention_dropout": 0.0, "bos_token_id": 1,
              "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu", "max_position_embeddings": 4096,
              "original_max_position_embeddings": 4096, "pad_token_id": 32000, "resid_pdrop": 0.0,
              "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000.0, "sliding_window": 2047,
              "tie_word_embeddings": False, "attention_bias": False, "vocab_size": 32064}
_MINI = {"hidden_size": 3072, "intermediate_size": 8192, "num_attention_heads": 32, "num_hidden_layers": 32,
         "num_key_value_heads": 32}
_MEDIUM = {"hidden_size": 5120, "intermediate_size": 17920, "num_attention_heads": 40, "num_hidden_layers": 40,
           "num_key_value_heads": 10}


@pytest.mark.parametrize(("shape_fields", "billions"), [(_MINI, 3.821), (_MEDIUM, 13.96)])
def test_published_4k_configs_read_with_transformers_parameter_count(shape_fields: dict[str, Any],
                                                                     billions: float) -> None:
    """Phi-3-mini-4k and -medium-4k as published: their 2047-token window bounds the context, and the planner
    counts transformers' parameters (its fused tensors hold what the split ones do)."""
    raw = {**_PUBLISHED, **shape_fields}
    shape = LlamaShape.from_hf(raw)
    assert shape.fused and shape.context == 2047 and (shape.eos_token_id, shape.pad_token_id) == (32000, 32000)
    with torch.device("meta"):
        ref = transformers.AutoModelForCausalLM.from_config(transformers.Phi3Config(**raw))
    assert shape.model_spec("phi3", shape.context).total_params() == ref.num_parameters()
    assert round(ref.num_parameters() / 1e9, 3) == pytest.approx(billions, abs=0.005)
    long = {**raw, "max_position_embeddings": 131072, "sliding_window": 262144,  # Phi-3-mini-128k-instruct's
            "rope_scaling": {"type": "su", "short_factor": [1.0] * 48, "long_factor": [1.0] * 48}}
    with pytest.raises(ConfigError, match="rope_scaling has rope_type='su'"):
        LlamaShape.from_hf(long)


def test_fused_and_split_layouts_are_told_apart(tmp_path: Path) -> None:
    """A Phi3 folder read as Llama lacks q_proj (and holds tensors Llama does not describe), and a Llama folder
    read as Phi3 lacks qkv_proj; a fused tensor of the wrong rows is refused by its shape."""
    path = tmp_path / "phi"
    make_hf_dir(path, "phi3", num_hidden_layers=1)
    edit_config(path, architectures=["LlamaForCausalLM"], model_type="llama")
    with pytest.raises(ConfigError, match=r"model.layers.0.self_attn.q_proj.weight is missing"):
        open_hf_dir(path)
    llama = tmp_path / "llama"
    make_hf_dir(llama, "llama", num_hidden_layers=1)
    edit_config(llama, architectures=[PHI3], model_type="phi3", pad_token_id=None, rope_theta=10000.0)
    with pytest.raises(ConfigError, match=r"self_attn.qkv_proj.weight is missing"):
        open_hf_dir(llama)
    edit_config(path, architectures=[PHI3], model_type="phi3", num_key_value_heads=4)
    with pytest.raises(ConfigError, match=r"qkv_proj.weight has shape \(128, 64\), config.json implies \(192, 64\)"):
        open_hf_dir(path)


# ---- one process: train, resume, export, generate, plan ------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A Phi3 folder (untied, 4 heads over 2 key/value heads, 2 layers, a window of 16 tokens as long as the
    sequence) trained 5 steps in one process (run "run"), and 2 steps then --resume to 5 (run "b")."""
    tmp = tmp_path_factory.mktemp("phi3")
    source = tmp / "phi3"
    make_hf_dir(source, "phi3", num_hidden_layers=2, sliding_window=16)
    return train_and_resume(tmp, source)


def test_one_rank_trains_as_transformers_and_resumes_bitwise(runs: dict[str, Any]) -> None:
    assert_trains_as_transformers_and_resumes(runs)


def test_a_longer_sequence_than_the_window_is_refused(runs: dict[str, Any]) -> None:
    refused(f"train --model hf:{runs['source']} --seq-len 32 --steps 1", "seq_len=32: above the sliding_window=16",
            "use --seq-len 16 or less")


def test_export_fuses_again_reloads_as_phi3_with_equal_logits_and_generates(runs: dict[str, Any],
                                                                           capsys: pytest.CaptureFixture) -> None:
    from pipeoffload.train.generate import load_run

    run, out = Path(runs["cfg"].run.out), runs["tmp"] / "export"
    assert main(["export", str(run), "--hf", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [PHI3] and config["model_type"] == "phi3" and config["sliding_window"] == 16
    assert config["pad_token_id"] is None  # written: Phi3Config would read an absent one as 32000
    ref = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="sdpa").eval()
    assert type(ref).__name__ == PHI3 and ref.config.pad_token_id is None
    model, _, _ = load_run(run)
    for i, block in enumerate(model.layers[1:-1]):  # the trained rows, stacked as transformers slices them
        attn, mlp = block.self_attn, block.mlp
        theirs = ref.model.layers[i]
        assert torch.equal(theirs.self_attn.qkv_proj.weight,
                           torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
        assert torch.equal(theirs.mlp.gate_up_proj.weight, torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
    tokens = torch.randint(0, ref.config.vocab_size, (2, 16))
    with torch.no_grad():
        assert torch.equal(model.layers(tokens, None, 0), ref(tokens).logits)
    assert_generates_as_transformers(run, out, ref, capsys)


def test_plan_reads_the_folder_as_train_does(runs: dict[str, Any], tmp_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    """The planner's parameter count is transformers' (fused or split, the same weights), its sequence at most the
    window, `plan --emit` writes a config train accepts, and `--plan auto` trains it."""
    source = runs["source"]
    spec = model_from_hf_config(source)
    ref = transformers.AutoModelForCausalLM.from_pretrained(source)
    assert spec.total_params() == ref.num_parameters() and spec.seq == 16 and spec.attention_window == 16
    assert_plan_emits_and_auto_trains(source, tmp_path, capsys)

