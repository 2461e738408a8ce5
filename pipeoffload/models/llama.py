"""Llama-family decoder as pipeline layers: RMSNorm, RoPE, SwiGLU, grouped-query attention.

``llama_layers(shape)`` returns ``[Embed, Block x layers, Head]``; like the reference GPT every layer
but the head takes and returns ``(hidden, pad_mask, offset)`` (``offset``: the position of the first
token, for RoPE), so the same runner, batches and splitting serve both. Submodules carry the names of
Hugging Face's ``LlamaForCausalLM`` (``self_attn.q_proj``, ``mlp.gate_proj``, ...), so a checkpoint
maps name for name (``models.hf``). The arithmetic follows transformers' (RMSNorm in float32, RoPE
tables in float32, ``repeat_kv`` head order) so logits agree to float32 rounding. Qwen3 adds ``q_norm`` and
``k_norm`` (RMSNorm over head_dim on each query and key head, before RoPE); Llama's ``attention_bias`` and
``mlp_bias`` put biases on o_proj and on the MLP's linears.

Attention is ``scaled_dot_product_attention`` with ``is_causal=True``: on CPU that is the blocked
flash kernel (``_scaled_dot_product_flash_attention_for_cpu``: deterministic, no s x s matrix), on
CUDA flash or memory-efficient attention. Only a padding mask (never passed by ``train``) builds an
explicit s x s mask.

``parallelize_llama_stage`` shards the blocks of a stage as torchtitan does for Llama 3: q/k/v and
gate/up column-parallel, o/down row-parallel, the norms and the residual stream sequence-parallel, Qwen3's
q/k norms replicated over the ranks' heads. Phi-3's fused ``qkv_proj`` and ``gate_up_proj`` are split onto
these projections as a checkpoint loads (``models.hf``), so the same plan shards them.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from pipeoffload.errors import ConfigError
from pipeoffload.llama_config import LlamaShape

Values = tuple[torch.Tensor, torch.Tensor | None, int]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rope_inv_freq(shape: LlamaShape, device: torch.device | None = None) -> torch.Tensor:
    """Inverse frequencies of the rotary embedding (float32), with Llama 3's scaling when configured."""
    dim = shape.dim_head
    inv = 1.0 / (shape.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim))
    s = shape.rope_scaling
    if s is None:
        return inv
    low_wavelen = s.original_max_positions / s.low_freq_factor
    high_wavelen = s.original_max_positions / s.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / s.factor, inv)
    smooth = (s.original_max_positions / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(q: torch.Tensor, k: torch.Tensor, inv_freq: torch.Tensor, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``q`` and ``k`` (batch, heads, seq, head_dim) for positions ``offset ..``."""
    t = q.shape[-2]
    with torch.autocast(q.device.type, enabled=False):
        pos = torch.arange(offset, offset + t, device=q.device, dtype=torch.float32)
        freqs = pos[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(q.dtype), emb.sin().to(q.dtype)
    return q * cos + _rotate_half(q) * sin, k * cos.to(k.dtype) + _rotate_half(k) * sin.to(k.dtype)


class Attention(nn.Module):
    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        h, d = shape.hidden, shape.dim_head
        self.head_dim = d
        self.shape = shape
        self.q_proj = nn.Linear(h, shape.heads * d, bias=shape.qkv_bias)
        self.k_proj = nn.Linear(h, shape.n_kv_heads * d, bias=shape.qkv_bias)
        self.v_proj = nn.Linear(h, shape.n_kv_heads * d, bias=shape.qkv_bias)
        self.o_proj = nn.Linear(shape.heads * d, h, bias=shape.o_bias)
        if shape.qk_norm:  # Qwen3: every query and key head normalised over its width, before RoPE
            self.q_norm = RMSNorm(d, shape.rms_eps)
            self.k_norm = RMSNorm(d, shape.rms_eps)

    def forward(self, x: torch.Tensor, pad_mask: torch.Tensor | None, offset: int) -> torch.Tensor:
        b, t = x.shape[0], x.shape[1]
        # under tensor parallelism the projections hold this rank's heads: read the counts off the outputs
        q = self.q_proj(x).view(b, t, -1, self.head_dim)
        k = self.k_proj(x).view(b, t, -1, self.head_dim)
        if self.shape.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, k, rope_inv_freq(self.shape, x.device), offset)
        groups = q.shape[1] // k.shape[1]
        if groups > 1:  # transformers' repeat_kv: query head i reads key/value head i // groups
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        if pad_mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            keep = torch.ones(t, t, dtype=torch.bool, device=x.device).tril() & pad_mask[:, None, None, :]
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(shape.hidden, shape.ffn, bias=shape.mlp_bias)
        self.up_proj = nn.Linear(shape.hidden, shape.ffn, bias=shape.mlp_bias)
        self.down_proj = nn.Linear(shape.ffn, shape.hidden, bias=shape.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Embed(nn.Module):
    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        # padding_idx as transformers sets it (config.json's pad_token_id): its row gets no gradient
        self.embed_tokens = nn.Embedding(shape.vocab, shape.hidden, padding_idx=shape.pad_token_id)

    def forward(self, tokens: torch.Tensor, pad_mask: torch.Tensor | None = None, offset: int = 0) -> Values:
        return self.embed_tokens(tokens), pad_mask, offset


class Block(nn.Module):
    """Pre-norm decoder layer: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(shape.hidden, shape.rms_eps)
        self.self_attn = Attention(shape)
        self.post_attention_layernorm = RMSNorm(shape.hidden, shape.rms_eps)
        self.mlp = MLP(shape)

    def forward(self, x: torch.Tensor, pad_mask: torch.Tensor | None, offset: int) -> Values:
        x = x + self.self_attn(self.input_layernorm(x), pad_mask, offset)
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, pad_mask, offset


class Head(nn.Module):
    """Final norm and vocabulary projection; returns logits only."""

    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        self.norm = RMSNorm(shape.hidden, shape.rms_eps)
        self.lm_head = nn.Linear(shape.hidden, shape.vocab, bias=False)

    def forward(self, x: torch.Tensor, pad_mask: torch.Tensor | None = None, offset: int = 0) -> torch.Tensor:
        return self.lm_head(self.norm(x))


def _init(module: nn.Module, std: float) -> None:
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=std)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)


def llama_layers(shape: LlamaShape, seed: int = 0, *, tie: bool = True, device: torch.device | str | None = None,
                 init: bool = True) -> list[nn.Module]:
    """``[Embed, Block x shape.layers, Head]``, weights drawn from N(0, 0.02) with ``seed`` (``init=False``:
    left as constructed, to be overwritten by a checkpoint). With tied embeddings and ``tie``, the head
    uses the embedding's parameter (one process); pipelines pass ``tie=False`` and keep the copies equal
    (``models.llama.tied_pairs``)."""
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        layers: list[nn.Module] = [Embed(shape), *(Block(shape) for _ in range(shape.layers)), Head(shape)]
        if init:
            for layer in layers:
                _init(layer, 0.02)
    finally:
        torch.random.set_rng_state(gen_state)
    embed, head = layers[0], layers[-1]
    if shape.tie_embeddings:
        if tie:
            head.lm_head.weight = embed.embed_tokens.weight  # type: ignore[union-attr,assignment]
        else:
            with torch.no_grad():
                head.lm_head.weight.copy_(embed.embed_tokens.weight)  # type: ignore[union-attr,operator,arg-type]
    if device is not None:
        layers = [layer.to(device) for layer in layers]
    return layers


# ---- tensor parallelism ------------------------------------------------------------------------------
def _block_plan(shape: LlamaShape) -> dict:
    seq = Shard(1)
    # Qwen3's q/k norms see this rank's heads (b, t, heads/tp, head_dim): their weights replicated, their input
    # read as sharded over the heads (dim 2), so each weight's gradient sums every rank's heads, as in one process
    norms = {f"self_attn.{name}": SequenceParallel(sequence_dim=2, use_local_output=True) for name in ("q_norm", "k_norm")}
    return {**(norms if shape.qk_norm else {}),
        "input_layernorm": SequenceParallel(use_local_output=False),
        "self_attn": PrepareModuleInput(input_layouts=(seq, None, None), desired_input_layouts=(Replicate(), None, None),
                                        use_local_output=True),
        "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(output_layouts=seq),
        "post_attention_layernorm": SequenceParallel(use_local_output=False),
        "mlp": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),), use_local_output=True),
        "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(output_layouts=seq),
    }


def _block_runs(stage: nn.Module) -> list[list[Block]]:
    """Maximal runs of consecutive blocks of a ``Sequential`` stage (each enters and leaves full tensors)."""
    children = list(stage) if isinstance(stage, nn.Sequential) else [m for m in stage.modules() if isinstance(m, Block)]
    runs: list[list[Block]] = []
    previous = False
    for child in children:
        if isinstance(child, Block):
            if previous and isinstance(stage, nn.Sequential):
                runs[-1].append(child)
            else:
                runs.append([child])
        previous = isinstance(child, Block)
    return runs


def parallelize_llama_stage(stage: nn.Module, tp_mesh: DeviceMesh, shape: LlamaShape, seq_len: int | None = None) -> None:
    """Shard every ``Block`` of ``stage`` in place over the 1-D ``tp_mesh`` (sequence parallel).

    Every rank of the mesh calls this with identical weights; each keeps its shard. Embedding and head
    stay replicated."""
    tp = tp_mesh.size()
    if shape.n_kv_heads % tp or shape.ffn % tp:
        raise ConfigError(f"tensor parallel size {tp} must divide kv_heads={shape.n_kv_heads} and the MLP width "
                          f"{shape.ffn}; pick tp among the divisors of kv_heads")
    if seq_len is not None and seq_len % tp:
        raise ConfigError(f"sequence parallelism splits the sequence: seq_len={seq_len} must be a multiple of tp={tp}")
    for run in _block_runs(stage):
        for block in run:
            parallelize_module(block, tp_mesh, _block_plan(shape))  # type: ignore[arg-type]
        parallelize_module(run[0], tp_mesh, PrepareModuleInput(
            input_layouts=(Replicate(), None, None), desired_input_layouts=(Shard(1), None, None), use_local_output=True))
        parallelize_module(run[-1], tp_mesh, PrepareModuleOutput(
            output_layouts=(Shard(1), None, None),  # type: ignore[arg-type]
            desired_output_layouts=(Replicate(), None, None), use_local_output=True))  # type: ignore[arg-type]
