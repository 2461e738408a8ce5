"""Which model a run trains, and its shape: the reference GPT, a Llama-family model built from the
config keys (``--model llama``), or a Hugging Face directory (``--model hf:DIR``). Torch-free.

An ``hf:DIR`` run reads its shape from ``DIR/config.json``: ``validate`` writes those shape keys
into the config (so ``config.toml`` records them), the tokenizer becomes ``hf`` (``DIR/tokenizer.json``)
and the launcher copies ``config.json`` and ``tokenizer.json`` into the run directory
(``hf_config.json``, ``tokenizer.json``): ``generate`` and ``export`` read the run alone.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeoffload.errors import ConfigError
from pipeoffload.llama_config import LlamaShape

HF_CONFIG = "hf_config.json"  # the run's copy of DIR/config.json
SHAPE_KEYS = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "rope_theta", "tie_embeddings")


def kind(source: str) -> str:
    """``gpt``, ``llama``, ``hf`` or ``own`` (a run of ``train_model``)."""
    return "hf" if source.startswith("hf:") else source


def hf_path(source: str) -> Path | None:
    from pipeoffload.hfdir import parse_source

    return parse_source(source)


def hf_keys(shape: LlamaShape) -> dict[str, Any]:
    """The config keys of a Hugging Face shape (what ``config.toml`` records for an ``hf:DIR`` run)."""
    return {"layers": shape.layers, "hidden": shape.hidden, "heads": shape.heads, "kv_heads": shape.n_kv_heads,
            "ffn_hidden": shape.ffn, "vocab": shape.vocab, "rope_theta": shape.rope_theta,
            "tie_embeddings": shape.tie_embeddings}


def shape_from_keys(m: Any, vocab: int) -> LlamaShape:
    """The Llama shape of ``--model llama``'s keys (``m``: the config's model section); ``vocab``: the
    tokenizer's, used when ``m.vocab`` is 0."""
    return LlamaShape(vocab=m.vocab or vocab, hidden=m.hidden, layers=m.layers, heads=m.heads, kv_heads=m.kv_heads,
                      ffn_hidden=m.ffn_hidden, rope_theta=m.rope_theta, tie_embeddings=m.tie_embeddings,
                      max_positions=max(m.seq_len, 1))


def run_shape(m: Any, vocab: int, run_dir: Path | None) -> LlamaShape:
    """The shape a llama-family run trains: ``config.json`` (the run's copy, else DIR's) or the keys."""
    if kind(m.source) != "hf":
        return shape_from_keys(m, vocab)
    path = hf_path(m.source)
    assert path is not None
    copy = run_dir / HF_CONFIG if run_dir is not None else None
    where = copy if copy is not None and copy.is_file() else path / "config.json"
    try:
        raw = json.loads(where.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"{where}: cannot read the model's config.json ({err})") from None
    return LlamaShape.from_hf(raw, str(where))


def llama_parameters(shape: LlamaShape) -> int:
    """Parameters of the Llama model of ``shape`` (``models.llama``; a tied head counted once)."""
    h, d, f, v = shape.hidden, shape.dim_head, shape.ffn, shape.vocab
    q, kv = shape.heads * d, shape.n_kv_heads * d
    block = 2 * h + h * q + 2 * h * kv + q * h + 3 * h * f + ((q + 2 * kv) if shape.qkv_bias else 0)
    block += (h if shape.o_bias else 0) + ((2 * f + h) if shape.mlp_bias else 0) + (2 * d if shape.qk_norm else 0)
    return v * h + shape.layers * block + h + (0 if shape.tie_embeddings else v * h)
