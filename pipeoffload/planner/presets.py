"""Shapes of well-known open models (public configs), as ``ModelSpec`` presets.

GPT-3 sizes follow Table 2.1 of Brown et al. 2020 (2048 context, 50257 vocabulary, learned positions
ignored); 13B uses hidden 5120 (Megatron's usual rounding of the paper's 5140). The Llama family
(Llama 2/3, Qwen2.5, Qwen3, Mistral, Phi-3) comes from ``llama_config.PRESETS``, the table the trainable model reads
too (SwiGLU, grouped-query attention, no dropout; q/k/v biases for Qwen2). ``pipeoffload-example`` is
the reference repository's quick-start model.
"""
from __future__ import annotations

from pipeoffload.errors import ConfigError
from pipeoffload.llama_config import preset_specs
from pipeoffload.planner.model import ModelSpec


def _gpt3(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(name=name, layers=layers, hidden=hidden, heads=heads, seq=2048, vocab=50257,
                     tied_embeddings=True)


MODEL_PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        _gpt3("gpt3-1.3b", 24, 2048, 16),
        _gpt3("gpt3-2.7b", 32, 2560, 32),
        _gpt3("gpt3-6.7b", 32, 4096, 32),
        _gpt3("gpt3-13b", 40, 5120, 40),
        _gpt3("gpt3-175b", 96, 12288, 96),
        *preset_specs().values(),
        ModelSpec(name="pipeoffload-example", layers=24, hidden=4096, heads=32, kv_heads=8, ffn=16384,
                  seq=8192, vocab=50257),
    )
}


def model_preset(name: str) -> ModelSpec:
    """Look a preset up by case-insensitive name; unknown names list the valid ones."""
    spec = MODEL_PRESETS.get(name.lower())
    if spec is None:
        raise ConfigError(f"unknown model {name!r}; presets: {', '.join(MODEL_PRESETS)}")
    return spec
