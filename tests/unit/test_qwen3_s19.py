"""Qwen3ForCausalLM (and Llama's attention_bias/mlp_bias) from a Hugging Face folder, against transformers
(session 19): per-head RMSNorm on q and k before RoPE, a head width set apart (head_dim 32 x 4 heads != 64),
tied or untied, q/k/v/o biases; Qwen3Config's defaults for absent fields; one-line refusals; one process
trains as transformers does, resumes bitwise, exports a folder transformers reloads as Qwen3 with the
same logits, generates as transformers does, and plans with its q/k norms counted."""
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
from pipeoffload.planner.hfconfig import model_from_hf_config  # noqa: E402
from tests.conftest import refused  # noqa: E402
from tests.hf_fixtures import (  # noqa: E402
    assert_generates_as_transformers,
    assert_plan_emits_and_auto_trains,
    assert_trains_as_transformers_and_resumes,
    edit_config,
    hf_config,
    make_hf_dir,
    train_and_resume,
)
from tests.unit.test_llama_model import _ours_from  # noqa: E402

QWEN3 = "Qwen3ForCausalLM"


@pytest.mark.parametrize(("kind", "over"), [("qwen3", {}), ("qwen3", {"tie_word_embeddings": True,
                                                                     "attention_bias": True}),
                                            ("qwen3", {"head_dim": 16, "num_key_value_heads": 4}),
                                            ("llama-bias", {})])
def test_logits_equal_transformers(kind: str, over: dict[str, Any]) -> None:
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(hf_config(kind, 97, **over), attn_implementation="sdpa").eval()
    with torch.no_grad():  # norms start at one and biases at zero: make them count
        for name, p in ref.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    shape = LlamaShape.from_hf(ref.config.to_dict())
    assert shape.qk_norm == (kind == "qwen3") and shape.mlp_bias == (kind == "llama-bias")
    assert shape.o_bias == shape.qkv_bias == (kind == "llama-bias" or bool(over.get("attention_bias")))
    assert LlamaShape.from_hf(shape.to_hf()) == shape
    ours = _ours_from(ref, shape).eval()
    tokens = torch.randint(0, 97, (2, 40))
    with torch.no_grad():
        assert (ours(tokens, None, 0) - ref(tokens).logits).abs().max().item() < 1e-5


def _bare(arch: str, **fields: Any) -> dict[str, Any]:
    """A config.json holding only the fields no config class defaults sensibly, plus ``fields``."""
    return {"architectures": [arch], "vocab_size": 300, "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 2, "num_attention_heads": 4, **fields}


def test_absent_fields_read_as_transformers_config_classes_read_them() -> None:
    """Qwen3Config: head_dim 128 (not hidden / heads), 32 key/value heads, eps 1e-6, 32768 positions, rope
    theta 10000, untied, no biases; Qwen2Config and MistralConfig default the key/value heads too (32, 8)."""
    raw = _bare(QWEN3, num_attention_heads=64)
    ref = transformers.Qwen3Config(**{k: v for k, v in raw.items() if k != "architectures"})
    shape = LlamaShape.from_hf(raw)
    assert (shape.dim_head, shape.n_kv_heads, shape.rms_eps, shape.max_positions, shape.rope_theta) == \
        (ref.head_dim, ref.num_key_value_heads, ref.rms_norm_eps, ref.max_position_embeddings,
         ref.rope_parameters["rope_theta"]) == (128, 32, 1e-6, 32768, 10000.0)
    assert not (shape.tie_embeddings or shape.qkv_bias or shape.o_bias) and shape.sliding_window == 0
    for arch, config, kv in (("Qwen2ForCausalLM", transformers.Qwen2Config, 32),
                             ("MistralForCausalLM", transformers.MistralConfig, 8)):
        raw = _bare(arch, num_attention_heads=64, hidden_size=256)
        assert LlamaShape.from_hf(raw).n_kv_heads == config(**raw).num_key_value_heads == kv
    assert LlamaShape.from_hf(_bare("LlamaForCausalLM")).n_kv_heads == 4  # LlamaConfig: the query heads
    with pytest.raises(ConfigError, match="heads=4 is not a multiple of kv_heads=32"):
        LlamaShape.from_hf(_bare(QWEN3))  # transformers' 4 // 32 groups would fail too


@pytest.mark.parametrize(("fields", "words"), [
    ({"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1},
     ["sliding_window=8 with use_sliding_window=true", QWEN3, "max_window_layers must be >= num_hidden_layers",
      "set use_sliding_window to false"]),
    ({"layer_types": ["full_attention", "sliding_attention"]}, ["layer_types has 'sliding_attention'"]),
    ({"head_dim": None}, ["head_dim=None", "write it"]),
    ({"head_dim": 0}, ["head_dim=0", "must be an integer >= 1"]),
    ({"head_dim": 15}, ["head_dim=15 is odd"]),
    ({"mlp_bias": True}, ["mlp_bias=true is not supported for Qwen3ForCausalLM", "set it to false"]),
    ({"attention_bias": "true"}, ["attention_bias='true' is not true or false"]),
])
def test_bad_qwen3_fields_are_refused_in_one_line(fields: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        LlamaShape.from_hf(_bare(QWEN3, num_key_value_heads=2, **fields))
    text = str(err.value)
    assert "\n" not in text and all(w in text for w in words), text


def test_windows_no_layer_uses_are_full_attention() -> None:
    """transformers slides only the layers layer_types marks (by default those from max_window_layers on, 28)."""
    for fields in ({"use_sliding_window": True, "sliding_window": 8},  # 2 layers < 28
                   {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 0,
                    "layer_types": ["full_attention", "full_attention"]}):
        raw = _bare(QWEN3, num_key_value_heads=2, **fields)
        assert set(transformers.Qwen3Config(**raw).layer_types) == {"full_attention"}
        assert LlamaShape.from_hf(raw).sliding_window == 0


def test_llama_export_refuses_qkv_biases_without_o_bias() -> None:
    shape = LlamaShape(vocab=50, hidden=32, layers=1, heads=4, qkv_bias=True)
    with pytest.raises(ConfigError, match="qkv_bias=True with o_bias=False"):
        shape.to_hf()


def test_a_folder_missing_or_adding_q_norm_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "q3"
    make_hf_dir(path, "qwen3", num_hidden_layers=1)
    assert open_hf_dir(path).shape.qk_norm
    edit_config(path, architectures=["Qwen2ForCausalLM"], model_type="qwen2")
    with pytest.raises(ConfigError, match="self_attn.q_proj.bias is missing"):
        open_hf_dir(path)  # Qwen2 has q/k/v biases this folder lacks
    edit_config(path, architectures=["LlamaForCausalLM"], model_type="llama", head_dim=32)
    with pytest.raises(ConfigError, match=r"holds 2 tensors config.json does not describe: .*q_norm.weight"):
        open_hf_dir(path)
    edit_config(path, architectures=[QWEN3], model_type="qwen3", use_sliding_window=True, sliding_window=8,
                max_window_layers=0, layer_types=None)  # saved layer_types would say no layer slides
    for command in (f"train --model hf:{path} --seq-len 16 --steps 1", f"plan --model hf:{path} --gpus 2 --global-batch 8"):
        refused(command, "sliding_window=8 with use_sliding_window=true", "set use_sliding_window to false")


# ---- one process: train, resume, export, generate, plan ------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A Qwen3 folder (untied, head_dim 32 x 4 heads, 2 key/value heads, 2 layers) trained 5 steps in one
    process (run "run"), and 2 steps then --resume to 5 (run "b")."""
    tmp = tmp_path_factory.mktemp("qwen3")
    source = tmp / "q3"
    make_hf_dir(source, "qwen3", num_hidden_layers=2)
    return train_and_resume(tmp, source)


def test_one_rank_trains_as_transformers_and_resumes_bitwise(runs: dict[str, Any]) -> None:
    assert_trains_as_transformers_and_resumes(runs)


def test_export_reloads_as_qwen3_with_equal_logits_and_generates(runs: dict[str, Any],
                                                                capsys: pytest.CaptureFixture) -> None:
    from pipeoffload.train.generate import load_run

    run, out = Path(runs["cfg"].run.out), runs["tmp"] / "export"
    assert main(["export", str(run), "--hf", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [QWEN3] and config["model_type"] == "qwen3" and config["head_dim"] == 32
    ref = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="sdpa").eval()
    assert type(ref).__name__ == QWEN3 and not ref.config.tie_word_embeddings
    model, _, _ = load_run(run)
    tokens = torch.randint(0, ref.config.vocab_size, (2, 24))
    with torch.no_grad():
        assert torch.equal(model.layers(tokens, None, 0), ref(tokens).logits)
    assert_generates_as_transformers(run, out, ref, capsys)


def test_plan_counts_the_q_k_norms(runs: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The planner reads the folder as train does: q/k norms and the set-apart head width in the parameter
    count (equal to transformers'), `plan --emit` writes a config train accepts, and `--plan auto` trains it."""
    source = runs["source"]
    spec = model_from_hf_config(source)
    ref = transformers.AutoModelForCausalLM.from_pretrained(source)
    assert spec.qk_norm and spec.attention_width == 128 and spec.total_params() == ref.num_parameters()
    assert_plan_emits_and_auto_trains(source, tmp_path, capsys)



@pytest.mark.parametrize(("preset", "billions"), [("qwen3-0.6b", 0.596), ("qwen3-8b", 8.19)])
def test_qwen3_presets_count_what_transformers_builds(preset: str, billions: float) -> None:
    """The planner's Qwen3 presets (published config.json shapes) hold transformers' parameter count."""
    from pipeoffload.llama_config import PRESETS
    from pipeoffload.planner.presets import model_preset

    with torch.device("meta"):
        ref = transformers.AutoModelForCausalLM.from_config(transformers.Qwen3Config(**PRESETS[preset].to_hf()))
    assert model_preset(preset).total_params() == ref.num_parameters() and round(ref.num_parameters() / 1e9, 3) == \
        pytest.approx(billions, abs=0.005)
