"""A small GPT-like reference model whose layers take *mixed* inputs.

Every layer takes and returns ``(hidden, pad_mask, offset)``: a float tensor that needs gradients, a
bool tensor that needs none (or ``None``), and a plain int. Splitting the layer list into pipeline
stages therefore makes every stage boundary carry all three kinds of value, which is what the runtime
must handle (and what its tests exercise). The first layer embeds token ids; the last returns logits.

Attention is written out (no fused kernel) by default so that CPU results are deterministic and meta
shape inference works; ``flash=True`` uses ``scaled_dot_product_attention`` (causal, no padding mask)
for large GPU runs where the s x s score matrix would dominate memory.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pipeoffload.errors import ConfigError

Values = tuple[torch.Tensor, torch.Tensor | None, int]


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 64
    seq: int = 16
    hidden: int = 32
    heads: int = 4
    layers: int = 4
    mlp_ratio: int = 4
    dropout: float = 0.0
    max_offset: int = 8
    flash: bool = False


class Embed(nn.Module):
    """Token + position embedding; positions start at ``offset`` (a non-tensor input)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.positions = nn.Embedding(cfg.seq + cfg.max_offset, cfg.hidden)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, tokens: torch.Tensor, pad_mask: torch.Tensor | None, offset: int) -> Values:
        pos = torch.arange(tokens.shape[1], device=tokens.device) + offset
        return self.drop(self.tokens(tokens) + self.positions(pos)), pad_mask, offset


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention (keys masked by ``pad_mask``) and an MLP."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        h = cfg.hidden
        if h % cfg.heads:
            raise ConfigError(f"hidden={h} is not a multiple of heads={cfg.heads}; pick heads dividing hidden")
        self.head_dim = h // cfg.heads
        self.flash = cfg.flash
        self.ln1 = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, cfg.mlp_ratio * h)
        self.fc2 = nn.Linear(cfg.mlp_ratio * h, h)
        self.drop = nn.Dropout(cfg.dropout)
        self.p = cfg.dropout

    def attention(self, x: torch.Tensor, pad_mask: torch.Tensor | None) -> torch.Tensor:
        qkv = self.qkv(x)
        b, t = qkv.shape[0], qkv.shape[1]  # sequence parallelism: x holds a slice of the sequence, qkv all of it
        # Head-major layout (heads, q/k/v, head_dim): a column shard of qkv holds whole heads, so tensor
        # parallelism (models.tensor_parallel) runs this same code on its local heads.
        heads = qkv.shape[-1] // (3 * self.head_dim)
        q, k, v = qkv.view(b, t, heads, 3, self.head_dim).permute(3, 0, 2, 1, 4)
        if self.flash and pad_mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.p if self.training else 0.0)
        else:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
            keep = torch.ones(t, t, dtype=torch.bool, device=qkv.device).tril()
            if pad_mask is not None:
                keep = keep & pad_mask[:, None, None, :]
            scores = scores.masked_fill(~keep, -1e4)
            y = self.drop(scores.softmax(dim=-1)) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, heads * self.head_dim))

    def forward(self, x: torch.Tensor, pad_mask: torch.Tensor | None, offset: int) -> Values:
        x = x + self.drop(self.attention(self.ln1(x), pad_mask))
        x = x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))
        return x, pad_mask, offset


class Head(nn.Module):
    """Final norm and vocabulary projection; returns logits only (the loss consumes them)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(cfg.hidden)
        self.out = nn.Linear(cfg.hidden, cfg.vocab)

    def forward(self, x: torch.Tensor, pad_mask: torch.Tensor | None, offset: int) -> torch.Tensor:
        return self.out(self.ln(x))


def gpt_layers(cfg: GPTConfig, seed: int = 0) -> list[nn.Module]:
    """``[Embed, Block x cfg.layers, Head]`` with deterministic initial weights for ``seed``."""
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return [Embed(cfg), *(Block(cfg) for _ in range(cfg.layers)), Head(cfg)]
    finally:
        torch.random.set_rng_state(gen_state)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def sample_batch(cfg: GPTConfig, batch: int, seed: int = 0, padded: bool = True) -> tuple[tuple, torch.Tensor]:
    """Random ``((tokens, pad_mask, offset), targets)``; the first token of every row is never padded."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg.vocab, (batch, cfg.seq), generator=gen)
    targets = torch.randint(0, cfg.vocab, (batch, cfg.seq), generator=gen)
    pad_mask = None
    if padded:
        pad_mask = torch.rand(batch, cfg.seq, generator=gen) > 0.2
        pad_mask[:, 0] = True
    return (tokens, pad_mask, 1), targets
