"""A ``ModelSpec`` from a Hugging Face ``config.json`` (standard library only: no transformers, no torch).

A Llama-family architecture (``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``,
``MistralForCausalLM``, ``Phi3ForCausalLM``) is read by ``llama_config.LlamaShape.from_hf``, the reader the training side uses, so
the planner and the trained model see the same shape (and the same refusals). Any other config is read generically: the
Llama/Mistral/Qwen keys (``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``,
``num_key_value_heads``, ``intermediate_size``, ``vocab_size``, ``max_position_embeddings``,
``hidden_act``, ``tie_word_embeddings``) and GPT-2's (``n_layer``, ``n_embd``, ``n_head``,
``n_positions``), and ``head_dim`` where it is not ``hidden_size / num_attention_heads`` (Mistral-Nemo).
A SiLU/SwiGLU activation (and any Gemma) means a gated MLP without biases or dropout, as in Llama; Falcon
and Gemma have their own readings (`_falcon`, `_GEMMA_NORMS`); KV heads are also read from `num_kv_heads`,
`n_head_kv`, `multi_query_group_num` and `multi_query`. A mixture of experts
is refused (``llama_config.moe_field``): the planner models dense layers only.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeoffload.errors import ConfigError
from pipeoffload.fileio import read_input_text
from pipeoffload.llama_config import (
    ARCHITECTURES,
    LlamaShape,
    check_object,
    json_bool,
    json_int,
    moe_field,
    set_apart_head_dim,
)
from pipeoffload.planner.model import ModelSpec

_KEYS = {  # ModelSpec field -> config.json keys, first found wins
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "heads": ("num_attention_heads", "n_head"),
    "ffn": ("intermediate_size", "n_inner", "ffn_hidden_size"),
    "vocab": ("vocab_size",),
    "seq": ("max_position_embeddings", "n_positions", "seq_length"),
}


def model_from_hf_config(directory: str | Path) -> ModelSpec:
    """The model described by ``directory/config.json`` (or the file itself)."""
    path = Path(directory)
    if path.is_dir():
        path = path / "config.json"
    try:
        data: dict[str, Any] = json.loads(read_input_text(path))
    except (OSError, ValueError) as err:
        raise ConfigError(f"hf:{directory}: cannot read {path} ({err}); give a directory holding config.json") from None
    check_object(data, str(path))
    source = f"hf:{(path.parent if path.name == 'config.json' else path).resolve()}"
    moe = moe_field(data)
    if moe is not None:  # read as dense it would pass for a model of its active experts' size
        raise ConfigError(f"hf:{directory}: {moe}={data[moe]!r}: mixtures of experts are not modelled "
                          "by the planner (dense layers only)")
    if _is_llama_family(data):
        shape = LlamaShape.from_hf(data, where=str(path))
        # at the declared positions, and at most a sliding window (Mistral's; a longer --seq is refused)
        return shape.model_spec(_name(data, path), shape.context).with_(source=source)
    values: dict[str, Any] = {}
    for name, keys in _KEYS.items():
        key = next((k for k in keys if data.get(k) is not None), None)
        if key is not None:
            values[name] = json_int(data[key], key, str(path))
    missing = [k for k in ("layers", "hidden", "heads") if k not in values]
    if missing:
        raise ConfigError(f"hf:{directory}: config.json has no {', '.join(missing)} "
                          f"(looked for {', '.join(_KEYS[missing[0]])}); drop --model hf: and give the shape with "
                          "--layers/--hidden/--heads (decoder-only transformers; encoder-decoders are not modelled)")
    values.setdefault("seq", 2048)
    window = _window(data, str(path))
    if window:  # read at most at the window: a longer --seq is refused (ModelSpec.attention_window)
        values["seq"] = min(values["seq"], window)
    if data.get("head_dim"):
        json_int(data["head_dim"], "head_dim", str(path))
    arch = _architecture(data, values["heads"])
    positions = _learned_positions(data, str(path))
    return ModelSpec(name=_name(data, path), head_size=set_apart_head_dim(data.get("head_dim"), values["heads"],
                                                                          values["hidden"]),
                     positions=positions, attention_window=window, params_note=_params_note(data, arch["gated_mlp"]),
                     rotary_positions=_rotary_positions(data, str(path)), **{**values, **arch})


# Gemma's MLP is GeGLU (gate, up and down projections) whatever its activation; RMSNorm, no biases, tied
_GEMMA_NORMS = {"gemma": 2, "gemma2": 4, "gemma3_text": 4}  # Gemma 2/3 add post-attention/feed-forward norms


def _window(data: dict[str, Any], where: str) -> int:
    """The sliding-window width where the config uses one (Starcoder2, Gemma 2), else 0."""
    if data.get("sliding_window") is None or not json_bool(data, "use_sliding_window", True, where):
        return 0
    return json_int(data["sliding_window"], "sliding_window", where)


def _activation(data: dict[str, Any]) -> str:
    """The MLP's activation (Gemma 2/3 write ``hidden_activation`` and leave ``hidden_act`` null)."""
    for key in ("hidden_activation", "hidden_act", "activation_function", "activation"):
        if data.get(key) is not None:
            return str(data[key]).lower()
    return "gelu"


def _architecture(data: dict[str, Any], heads: int) -> dict[str, Any]:
    """ModelSpec fields the generic reader takes from the architecture: the MLP, biases, norms, tying, KV heads."""
    kind = str(data.get("model_type"))
    if kind == "falcon":
        return _falcon(data, heads)
    gated = _activation(data) in ("silu", "swiglu", "swish") or kind in _GEMMA_NORMS
    out: dict[str, Any] = dict(gated_mlp=gated, dropout=not gated, bias=not gated,
                               layer_norms=_GEMMA_NORMS.get(kind, 2),
                               tied_embeddings=json_bool(data, "tie_word_embeddings", not gated or kind in _GEMMA_NORMS,
                                                         "config.json"))
    kv = _kv_heads(data)
    if kv is not None:
        out["kv_heads"] = kv
    return out


def _kv_heads(data: dict[str, Any]) -> int | None:
    """KV heads under any of the names configs use; ``multi_query`` (GPT-BigCode) means one."""
    for key in ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num"):
        if data.get(key) is not None:
            return json_int(data[key], key, "config.json")
    return 1 if json_bool(data, "multi_query", False, "config.json") else None


def _falcon(data: dict[str, Any], heads: int) -> dict[str, Any]:
    """transformers' FalconForCausalLM: LayerNorms with biases, linears biased only with ``bias``, one norm in
    the old parallel block (Falcon-7B), two otherwise; K/V heads: ``num_kv_heads`` with the new decoder
    architecture (Falcon-40B) or without ``multi_query``, else one."""
    new = json_bool(data, "new_decoder_architecture", False, "config.json")
    if new or not json_bool(data, "multi_query", True, "config.json"):
        kv = next((json_int(data[k], k, "config.json") for k in ("num_kv_heads", "num_key_value_heads")
                   if data.get(k) is not None), heads)
    else:
        kv = 1
    parallel = json_bool(data, "parallel_attn", True, "config.json")
    norms = 2 if not parallel else (data.get("num_ln_in_parallel_attn") or (2 if new else 1))
    dropout = any(float(data.get(k) or 0.0) > 0 for k in ("hidden_dropout", "attention_dropout"))
    return dict(gated_mlp=False, dropout=dropout, bias=json_bool(data, "bias", False, "config.json"), norm_bias=True,
                layer_norms=int(norms), kv_heads=kv,
                tied_embeddings=json_bool(data, "tie_word_embeddings", True, "config.json"))


# keys saying positions are rotary (GPT-J, CodeGen, GPT-NeoX, Phi), not a learned table
_ROTARY_KEYS = ("rotary_dim", "rotary_pct", "partial_rotary_factor", "rope_theta", "rope_parameters", "rope_scaling")


def _learned_positions(data: dict[str, Any], where: str) -> int:
    """Rows of the learned position table GPT-2's ``n_positions`` declares (0 where positions are rotary)."""
    if data.get("n_positions") is None or any(data.get(k) is not None for k in _ROTARY_KEYS):
        return 0
    return json_int(data["n_positions"], "n_positions", where)


_ROTARY_TYPES = {"gemma", "gemma2", "gemma3_text", "falcon", "gpt_neox", "phi", "phi3", "stablelm", "starcoder2"}


def _rotary_positions(data: dict[str, Any], where: str) -> int:
    """The positions a rotary model was trained to (its ``max_position_embeddings``); 0 where positions are
    not rotary or the config does not say."""
    rotary = data.get("model_type") in _ROTARY_TYPES or any(data.get(k) is not None for k in _ROTARY_KEYS)
    if not rotary or data.get("max_position_embeddings") is None:
        return 0
    return json_int(data["max_position_embeddings"], "max_position_embeddings", where)


# read exactly (checked against transformers by tests): no note
_EXACT = {"gpt2", "gemma", "gemma2"}


def _params_note(data: dict[str, Any], gated: bool) -> str:
    """Empty where the generic reading is exact (GPT-2 without cross-attention, Gemma, Gemma 2); what is only
    approximate otherwise."""
    kind = data.get("model_type")
    archs = "/".join(map(str, data.get("architectures") or [kind or "this model"]))
    if kind in _EXACT and not data.get("add_cross_attention"):
        return ""
    if kind == "falcon":
        return (f"{archs}: parameters counted exactly, but its parallel attention/MLP block is planned as "
                "sequential layers, so saved activations and step time are approximate")
    style = "Llama-style (gated MLP, RMSNorm, no biases)" if gated else "GPT-style (two LayerNorms, biases everywhere)"
    return (f"{archs} is read generically as {style} layers: its own layout may differ, so "
            "the parameter count and the memory that follows from it are approximate")


def _name(data: dict[str, Any], path: Path) -> str:
    return str(data.get("_name_or_path") or data.get("model_type") or path.parent.name)


def _is_llama_family(data: dict[str, Any]) -> bool:
    archs = data.get("architectures") or []
    return any(a in ARCHITECTURES for a in archs) or data.get("model_type") in ARCHITECTURES.values()
