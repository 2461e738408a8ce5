"""A Hugging Face folder checked whole before any rank starts (probe J): tensors the config does not
describe, a tied config carrying its own head, malformed config.json / index / safetensors headers and
non-integer shape fields are each refused in one line (exit 2) naming the file, field or tensor."""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from pipeoffload.errors import ConfigError  # noqa: E402
from pipeoffload.hfdir import INDEX, SINGLE, open_hf_dir, read_header  # noqa: E402
from tests.conftest import refused  # noqa: E402
from tests.hf_fixtures import edit_config, make_hf_dir  # noqa: E402


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hf") / "llama"
    make_hf_dir(path, "llama", num_hidden_layers=2)  # one file, untied: its own lm_head.weight
    return path


@pytest.fixture(scope="module")
def sharded_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hf") / "qwen"
    make_hf_dir(path, "qwen2", num_hidden_layers=2, shard="60KB")
    return path


@pytest.fixture
def copy(llama_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(llama_dir, tmp_path / "m"))


def _tensors(path: Path) -> dict[str, Any]:
    return dict(safetensors_torch.load_file(str(path / SINGLE)))


def _save(path: Path, tensors: dict[str, Any]) -> None:
    safetensors_torch.save_file(tensors, str(path / SINGLE), metadata={"format": "pt"})


def _raw(path: Path) -> tuple[dict[str, Any], bytes]:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), data[8 + n:]


def _write_raw(path: Path, table: dict[str, Any], body: bytes) -> None:
    head = json.dumps(table).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + body)


# ---- item 2: tensors the config does not describe ---------------------------------------------

def test_an_extra_bias_is_refused(copy: Path) -> None:
    tensors = _tensors(copy)
    tensors["model.layers.0.self_attn.o_proj.bias"] = torch.zeros(64)
    _save(copy, tensors)
    with pytest.raises(ConfigError, match=r"1 tensor config\.json does not describe: "
                                          r"model\.layers\.0\.self_attn\.o_proj\.bias"):
        open_hf_dir(copy)


def test_an_extra_layer_is_refused_naming_the_first_few_and_the_count(copy: Path) -> None:
    tensors = _tensors(copy)
    for name, t in list(tensors.items()):
        if name.startswith("model.layers.1."):
            tensors[name.replace("layers.1.", "layers.2.")] = t.clone()
    _save(copy, tensors)
    err = refused(f"generate hf:{copy} --tokens 1", "9 tensors config.json does not describe",
                  "model.layers.2.", "num_hidden_layers=2")
    assert err.count("model.layers.2.") == 3 and "and 6 more" in err, err


def test_old_rotary_inv_freq_buffers_are_ignored_as_transformers_does(copy: Path) -> None:
    tensors = _tensors(copy)
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    _save(copy, tensors)
    open_hf_dir(copy)


def test_an_extra_name_in_the_index_is_refused(sharded_dir: Path, tmp_path: Path) -> None:
    path = Path(shutil.copytree(sharded_dir, tmp_path / "m"))
    index = json.loads((path / INDEX).read_text())
    index["weight_map"]["model.layers.0.mlp.up_proj.bias"] = next(iter(index["weight_map"].values()))
    (path / INDEX).write_text(json.dumps(index))
    with pytest.raises(ConfigError, match=r"model\.layers\.0\.mlp\.up_proj\.bias"):
        open_hf_dir(path)


def test_a_tied_config_with_a_different_head_is_refused(copy: Path) -> None:
    """transformers keeps the stored lm_head.weight as its own head; we would train the embedding as it."""
    edit_config(copy, tie_word_embeddings=True)
    ref = transformers.AutoModelForCausalLM.from_pretrained(copy)
    assert not torch.equal(ref.lm_head.weight, ref.model.embed_tokens.weight)  # why it is refused
    refused(f"generate hf:{copy} --tokens 1", "tie_word_embeddings=true", "lm_head.weight",
            "model.embed_tokens.weight", "set tie_word_embeddings to false")


def test_a_tied_config_with_an_equal_head_or_none_is_accepted(copy: Path) -> None:
    edit_config(copy, tie_word_embeddings=True)
    tensors = _tensors(copy)
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    _save(copy, tensors)
    assert open_hf_dir(copy).shape.tie_embeddings
    del tensors["lm_head.weight"]
    _save(copy, tensors)
    assert open_hf_dir(copy).shape.tie_embeddings


def test_train_refuses_an_extra_tensor_before_any_rank(copy: Path, tmp_path: Path) -> None:
    tensors = _tensors(copy)
    tensors["model.norm.bias"] = torch.zeros(64)
    _save(copy, tensors)
    out = tmp_path / "run"
    refused(f"train --model hf:{copy} --out {out} --steps 1", "model.norm.bias")
    assert not out.exists()


# ---- item 3: malformed files and fields -------------------------------------------------------

@pytest.mark.parametrize("command", ["generate hf:{p} --tokens 1", "estimate --model hf:{p} --global-batch 8",
                                     "plan --model hf:{p} --gpus 2 --global-batch 8",
                                     "train --model hf:{p} --out {p}/run --steps 1"])
def test_a_config_json_that_is_not_an_object_is_refused(copy: Path, command: str) -> None:
    (copy / "config.json").write_text("[1, 2, 3]")
    refused(command.format(p=copy), "config.json", "a JSON list", "not an object")


def test_an_index_whose_weight_map_is_not_an_object_is_refused(sharded_dir: Path, tmp_path: Path) -> None:
    path = Path(shutil.copytree(sharded_dir, tmp_path / "m"))
    (path / INDEX).write_text(json.dumps({"weight_map": 5}))
    refused(f"generate hf:{path} --tokens 1", INDEX, "weight_map", "5")
    (path / INDEX).write_text(json.dumps({"weight_map": {"model.norm.weight": 7}}))
    refused(f"generate hf:{path} --tokens 1", INDEX, "model.norm.weight", "7")


def test_a_header_entry_without_data_offsets_is_refused(copy: Path) -> None:
    table, body = _raw(copy / SINGLE)
    del table["model.norm.weight"]["data_offsets"]
    _write_raw(copy / SINGLE, table, body)
    refused(f"generate hf:{copy} --tokens 1", SINGLE, "model.norm.weight", "data_offsets")


def test_a_dtype_changed_in_the_header_is_refused(copy: Path) -> None:
    """F32 -> BF16 with the file length unchanged passed the file-end check and failed inside rank 0."""
    table, body = _raw(copy / SINGLE)
    table["model.norm.weight"]["dtype"] = "BF16"
    _write_raw(copy / SINGLE, table, body)
    with pytest.raises(ConfigError, match=r"model\.norm\.weight: data_offsets span 256 bytes; shape \[64\] of "
                                          r"BF16 needs 128"):
        read_header(copy / SINGLE)


@pytest.mark.parametrize("change, words", [
    (lambda t, a, b: t[a].update(data_offsets=list(t[b]["data_offsets"])), "overlaps or leaves a gap"),
    (lambda t, a, b: t[a].update(shape=[-1]), "shape [-1]"),
    (lambda t, a, b: t[a].update(data_offsets=[0, "x"]), "data_offsets [0, 'x']"),
    (lambda t, a, b: t.update({a: 5}), "not an object"),
])
def test_inconsistent_header_entries_are_refused(copy: Path, change: Any, words: str) -> None:
    table, body = _raw(copy / SINGLE)
    a, b = "model.norm.weight", "model.layers.0.input_layernorm.weight"
    change(table, a, b)
    _write_raw(copy / SINGLE, table, body)
    with pytest.raises(ConfigError) as err:
        read_header(copy / SINGLE)
    assert words in str(err.value) and SINGLE in str(err.value)


@pytest.mark.parametrize("field, value", [("num_hidden_layers", 4.7), ("hidden_size", "64"),
                                          ("num_attention_heads", True), ("intermediate_size", None),
                                          ("max_position_embeddings", 4096.5), ("num_key_value_heads", 1.5)])
def test_a_non_integer_shape_field_is_refused(copy: Path, field: str, value: object) -> None:
    edit_config(copy, **{field: value})
    refused(f"generate hf:{copy} --tokens 1", "config.json", f"{field}={value!r}", "integer")
    refused(f"estimate --model hf:{copy} --global-batch 8", f"{field}={value!r}", "integer")


def test_a_non_integer_field_of_an_unsupported_architecture_is_refused_by_the_planner(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "n_layer": 4.7,
                                                      "n_embd": 64, "n_head": 4, "vocab_size": 300}))
    refused(f"estimate --model hf:{tmp_path} --global-batch 8", "n_layer=4.7", "integer")


def test_a_rope_table_that_is_not_an_object_is_refused(copy: Path) -> None:
    edit_config(copy, rope_parameters=[1, 2], rope_scaling=None)
    refused(f"generate hf:{copy} --tokens 1", "rope_parameters", "not an object")
