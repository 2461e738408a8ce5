"""The Llama-family model against transformers' implementation (one process, fp32, random weights)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from pipeoffload.llama_config import LlamaShape  # noqa: E402
from pipeoffload.models import StageModule  # noqa: E402
from pipeoffload.models.llama import llama_layers  # noqa: E402
from tests.hf_fixtures import hf_config  # noqa: E402


def _ours_from(ref, shape: LlamaShape) -> StageModule:
    """Our layers holding ``ref``'s weights (copied by the Hugging Face names)."""
    layers = llama_layers(shape, init=False)
    sd = ref.state_dict()
    with torch.no_grad():
        layers[0].embed_tokens.weight.copy_(sd["model.embed_tokens.weight"])
        for i, block in enumerate(layers[1:-1]):
            for name, p in block.named_parameters():
                p.copy_(sd[f"model.layers.{i}.{name}"])
        layers[-1].norm.weight.copy_(sd["model.norm.weight"])
        if not shape.tie_embeddings:
            layers[-1].lm_head.weight.copy_(sd["lm_head.weight"])
    return StageModule(*layers)


@pytest.mark.parametrize("kind", ["llama", "llama3", "qwen2", "mistral"])
def test_logits_equal_transformers(kind: str) -> None:
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(hf_config(kind, 97), attn_implementation="sdpa").eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    shape = LlamaShape.from_hf(ref.config.to_dict())
    assert shape.tie_embeddings == (kind == "qwen2") and shape.qkv_bias == (kind == "qwen2")
    assert shape.n_kv_heads == 2 and (shape.rope_scaling is not None) == (kind == "llama3")
    ours = _ours_from(ref, shape).eval()
    tokens = torch.randint(0, 97, (2, 80))  # longer than llama3's original context (64): scaling matters
    with torch.no_grad():
        want = ref(tokens).logits
        got = ours(tokens, None, 0)
    assert (got - want).abs().max().item() < 1e-5


def test_rope_offset_continues_positions() -> None:
    """Positions start at ``offset`` for queries and keys alike: RoPE scores depend on relative positions
    only, so a shift changes nothing (beyond rounding), and a different relative order does."""
    shape = LlamaShape(vocab=50, hidden=32, layers=2, heads=4, kv_heads=2)
    model = StageModule(*llama_layers(shape, seed=1)).eval()
    tokens = torch.randint(0, 50, (1, 12))
    with torch.no_grad():
        full = model(tokens, None, 0)
        shifted = model(tokens, None, 3)
        swapped = model(tokens[:, [1, 0, *range(2, 12)]], None, 0)
    assert (full - shifted).abs().max().item() < 1e-5
    assert (full[0, 2:] - swapped[0, 2:]).abs().max().item() > 1e-4  # positions matter


def test_attention_uses_the_flash_kernel_on_cpu() -> None:
    """Causal attention on CPU takes the blocked kernel (no s x s matrix), forward and backward."""
    from torch.profiler import profile

    shape = LlamaShape(vocab=50, hidden=32, layers=1, heads=4, kv_heads=2)
    model = StageModule(*llama_layers(shape))
    with profile() as prof:
        model(torch.randint(0, 50, (1, 256)), None, 0).sum().backward()
    names = {e.name for e in prof.events()}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in names
    assert "aten::_scaled_dot_product_flash_attention_for_cpu_backward" in names


def test_config_round_trip() -> None:
    for kind in ("llama", "llama3", "qwen2", "mistral"):
        shape = LlamaShape.from_hf(hf_config(kind, 97).to_dict())
        assert LlamaShape.from_hf(shape.to_hf()) == shape
