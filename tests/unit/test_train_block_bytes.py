"""The planner's per-layer activation bytes of train's blocks (``planner.trainblocks``) equal what a real
block's forward saves, as the runtime's activation store counts it (unique storages, parameters and
autocast's cached parameter casts excluded), and what it still keeps for W after I, exactly: every
term is a whole tensor the formula names."""
from __future__ import annotations

import contextlib

import pytest
import torch

from pipeoffload.llama_config import LlamaShape
from pipeoffload.models.gpt import Block as GPTBlock
from pipeoffload.models.gpt import Embed as GPTEmbed
from pipeoffload.models.gpt import GPTConfig, lm_loss
from pipeoffload.models.gpt import Head as GPTHead
from pipeoffload.models.llama import Block as LlamaBlock
from pipeoffload.models.llama import Embed as LlamaEmbed
from pipeoffload.models.llama import Head as LlamaHead
from pipeoffload.planner.emit import train_blocks
from pipeoffload.planner.model import ModelSpec
from pipeoffload.runtime.backward import backward_input, backward_weight
from pipeoffload.runtime.offload import ActivationStore

DTYPES = {"fp32": 4, "bf16": 2}


def _saved(block: torch.nn.Module, hidden: int, seq: int, batch: int, dtype: str, device: str,
           vocab: int = 0) -> tuple[int, int]:
    """Bytes the store keeps for one forward of ``block`` (min_bytes=1: every storage counted), and after
    its I (input gradients), trimmed as the runtime trims to what W needs; ``vocab``: ``block`` is a head,
    and the forward ends in the loss, as the last stage's does."""
    block = block.to(device).train()
    store = ActivationStore(device, exclude=list(block.parameters()), min_bytes=1)
    x = torch.randn(batch, seq, hidden, device=device, requires_grad=True)  # a stage input: fp32, a leaf
    autocast = torch.autocast(device, dtype=torch.bfloat16) if dtype == "bf16" else contextlib.nullcontext()
    with autocast, store.saving(0, 0):
        if vocab:
            out = lm_loss(block(x, None, 0), torch.randint(0, vocab, (batch, seq), device=device))
        else:
            out = block(x, None, 0)[0]
    saved = store.slot_bytes(0, 0)
    params = list(block.parameters())
    _, job = backward_input([out], [torch.ones_like(out)], [x], params)
    store.trim(0, 0, job.saved_by_needed_nodes({}))
    kept = store.slot_bytes(0, 0)
    backward_weight(job)  # W runs on what was kept
    assert all(p.grad is not None for p in params)
    return saved, kept


def _devices() -> list[str]:
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("flash", [False, True])
@pytest.mark.parametrize(("hidden", "heads", "seq", "batch"), [(64, 4, 32, 2), (96, 3, 48, 1), (128, 8, 16, 3)])
def test_gpt_block_saves_what_the_planner_counts(device: str, dtype: str, flash: bool, hidden: int, heads: int,
                                                 seq: int, batch: int) -> None:
    torch.manual_seed(0)
    block = GPTBlock(GPTConfig(hidden=hidden, heads=heads, seq=seq, flash=flash))
    spec = train_blocks(ModelSpec(layers=1, hidden=hidden, heads=heads, seq=seq, microbatch=batch), DTYPES[dtype])
    spec = spec.with_(flash_attention=flash, cpu_autocast=device == "cpu")
    saved = (spec.layer_activation_bytes(), spec.layer_weight_input_bytes())
    assert saved == _saved(block, hidden, seq, batch, dtype, device)


QWEN3, LLAMA, PHI3 = "Qwen3ForCausalLM", "LlamaForCausalLM", "Phi3ForCausalLM"
LLAMA_SHAPES = [  # hidden, heads, kv_heads, ffn, head_dim (0: hidden // heads), qkv_bias, seq, batch, architecture
    (64, 4, 4, 96, 0, False, 32, 2, LLAMA),  # multi-head attention
    (64, 4, 2, 160, 0, False, 24, 3, LLAMA),  # grouped-query attention
    (96, 6, 1, 128, 0, False, 16, 1, LLAMA),  # multi-query attention
    (64, 4, 2, 96, 8, True, 20, 2, LLAMA),  # Qwen2's q/k/v biases, a head width set apart (A = 32 != hidden)
    (64, 4, 2, 96, 32, False, 24, 2, QWEN3),  # Qwen3's q/k norms, grouped, A = 128 != hidden
    (64, 4, 4, 96, 0, True, 16, 3, QWEN3),  # Qwen3 multi-head with attention_bias (q, k, v and o)
    (64, 4, 2, 96, 0, False, 24, 2, PHI3),  # Phi-3: its fused qkv_proj and gate_up_proj split, Llama's block
    (64, 4, 1, 128, 32, False, 16, 3, PHI3),  # Phi-3 multi-query, a head width set apart
]


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize(("hidden", "heads", "kv", "ffn", "head_dim", "bias", "seq", "batch", "arch"), LLAMA_SHAPES)
def test_llama_block_saves_what_the_planner_counts(device: str, dtype: str, hidden: int, heads: int, kv: int,
                                                   ffn: int, head_dim: int, bias: bool, seq: int, batch: int,
                                                   arch: str) -> None:
    torch.manual_seed(0)
    shape = LlamaShape(vocab=100, hidden=hidden, layers=1, heads=heads, kv_heads=kv, ffn_hidden=ffn,
                       head_dim=head_dim, qkv_bias=bias, o_bias=bias and arch == QWEN3, max_positions=seq,
                       architecture=arch)
    spec = train_blocks(shape.model_spec("llama", seq).with_(microbatch=batch), DTYPES[dtype])
    saved = (spec.layer_activation_bytes(), spec.layer_weight_input_bytes())
    assert saved == _saved(LlamaBlock(shape), hidden, seq, batch, dtype, device)


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("family", ["gpt", "llama"])
@pytest.mark.parametrize(("hidden", "vocab", "seq", "batch"), [(64, 256, 32, 2), (96, 100, 16, 3)])
def test_head_saves_what_the_planner_counts(device: str, dtype: str, family: str, hidden: int, vocab: int, seq: int,
                                            batch: int) -> None:
    torch.manual_seed(0)
    if family == "gpt":
        head: torch.nn.Module = GPTHead(GPTConfig(hidden=hidden, heads=4, seq=seq, vocab=vocab))
        spec = ModelSpec(layers=1, hidden=hidden, heads=4, seq=seq, vocab=vocab, microbatch=batch)
    else:
        shape = LlamaShape(vocab=vocab, hidden=hidden, layers=1, heads=4, max_positions=seq)
        head = LlamaHead(shape)
        spec = shape.model_spec("llama", seq).with_(microbatch=batch)
    spec = train_blocks(spec, DTYPES[dtype])
    saved = (spec.head_activation_bytes(), spec.head_weight_input_bytes())
    assert saved == _saved(head, hidden, seq, batch, dtype, device, vocab)


def test_paper_models_keep_megatron_formulas() -> None:
    """A spec without train's blocks keeps Korthikanti et al.'s 34*sbh (GPT, bf16, flash, dropout)."""
    spec = ModelSpec(layers=1, hidden=64, heads=4, seq=32)
    assert spec.layer_activation_bytes() == 34 * 32 * 64


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("family", ["gpt", "llama"])
@pytest.mark.parametrize(("seq", "batch"), [(32, 2), (48, 3)])
def test_embedding_saves_what_the_planner_counts(device: str, dtype: str, family: str, seq: int, batch: int) -> None:
    """The first stage's embedding keeps its int64 token ids (and GPT its positions' index) for its
    backward, all of it W's; the lookups' fp32 output is the first block's input, counted there."""
    torch.manual_seed(0)
    if family == "gpt":
        embed: torch.nn.Module = GPTEmbed(GPTConfig(hidden=64, heads=4, seq=seq, vocab=100))
        spec = ModelSpec(layers=1, hidden=64, heads=4, seq=seq, vocab=100, microbatch=batch)
    else:
        shape = LlamaShape(vocab=100, hidden=64, layers=1, heads=4, max_positions=seq)
        embed, spec = LlamaEmbed(shape), shape.model_spec("llama", seq).with_(microbatch=batch)
    embed = embed.to(device).train()
    store = ActivationStore(device, exclude=list(embed.parameters()), min_bytes=1)
    autocast = torch.autocast(device, dtype=torch.bfloat16) if dtype == "bf16" else contextlib.nullcontext()
    with autocast, store.saving(0, 0):
        out = embed(torch.randint(0, 100, (batch, seq), device=device), None, 0)[0]
    assert out.dtype == torch.float32  # the residual stream the first block's norm keeps
    spec = train_blocks(spec, DTYPES[dtype])
    assert spec.embedding_activation_bytes() == store.slot_bytes(0, 0)
    _, job = backward_input([out], [torch.ones_like(out)], [], list(embed.parameters()))
    assert job.saved_by_needed_nodes({}) is None  # W runs the embedding's whole backward: it keeps it all
