"""What one block of the models ``pipeoffload train`` builds saves for backward (per microbatch, one TP rank).

The Megatron formulas of ``planner.model`` (Korthikanti et al.) describe Megatron-LM's fused layers in
2-byte elements; ``train``'s blocks (``models.gpt.Block``, ``models.llama.Block``) are plain PyTorch and
keep other tensors. These are the bytes autograd saves in them, tensor by tensor, with the reason each
one is kept (read off the blocks' forward; ``tests/unit/test_train_block_bytes.py`` checks the sums
against the storages a real block's forward saves). ``e`` is an activation element (4 bytes in fp32, 2
under bf16 autocast), ``T = s*b`` the tokens of a microbatch, ``h`` the hidden size, ``A = heads *
head_dim``, ``K = kv_heads * head_dim``, ``f`` the MLP width, ``a`` the heads:

- residual stream: each of the two norms' input (``x`` and ``x + attention``), ``4*T*h`` even under
  bf16 autocast: the parameters and the embedding are fp32 and ``x + bf16`` promotes to fp32.
- norm statistics: LayerNorm keeps its mean and rstd (``2 * 4*T`` per norm), RMSNorm its rsqrt
  (``4*T``), always fp32. RMSNorm also keeps ``x32 * rsqrt`` (fp32, ``4*T*h``) for its weight's
  gradient.
- norm outputs as linear inputs: a linear keeps its input, ``e*T*h``. Autocast casts a non-parameter
  input anew for every linear that reads it (its cache holds parameters' casts only), so under bf16
  Llama keeps the attention norm's output three times (q, k, v) and the MLP norm's twice (gate, up);
  in fp32 the linears share the one tensor.
- Qwen3's q/k norms (RMSNorm over head_dim on each query and key head, before RoPE): the q and k
  projections' outputs as fp32 (``4*T*(A+K)``), one rsqrt per head and token (``4*T*(a+kv)``) and the
  normalised products in the projections' dtype (``e*T*(A+K)``, what the norm weights' gradients read).
  Their output is fp32 (fp32 weights), so RoPE runs and keeps its tables in fp32 and SDPA keeps q and k
  as autocast casts them.
- GPT attention written out (``train``'s GPT, ``flash=False``): ``q @ k^T`` and ``p @ v`` are batched
  matmuls of permuted views, which copy q, k and v contiguous (``3*e*T*h``); the softmax output
  (``a*s^2*b`` elements: fp32 under CUDA autocast, which runs softmax in fp32, and then also its
  bf16 cast for ``p @ v``; bf16 under CPU autocast); the bool causal mask ``~keep`` (``s^2`` bytes, one
  per forward, not per sequence); the projection's input, a copy (``e*T*h``).
- SDPA attention (Llama, and GPT with ``flash=True``): q, k, v as passed, the output (which the output
  projection reads as a view of it), and the fp32 log-sum-exp (``4*a*s*b``). Llama passes RoPE'd q and
  k (new tensors) and, with grouped-query attention, k and v repeated to every query head (``e*T*A``
  each); without groups v is a view of ``v_proj``'s output (``e*T*K``). GPT passes views of the qkv
  output (one ``3*e*T*h`` storage).
- RoPE tables: ``cos`` and ``sin`` (``s * head_dim`` elements each, per forward) kept by the products.
- MLP: GPT keeps fc1's output (GeLU's input) and GeLU's output (fc2's input), ``e*T*f`` each; SwiGLU
  keeps gate's and up's outputs, SiLU's output and the product (down's input): ``4*e*T*f``.

Under tensor parallelism (``models.tensor_parallel``, torchtitan's plan for Llama) a rank keeps its
heads' and its MLP slice's tensors (``/tp``); the residual side (inputs, statistics, RMSNorm's product)
is split over the sequence with sequence parallelism and whole without; the norms' outputs are
all-gathered before the column-parallel linears, which keep the gathered whole (``/1`` either way).
The rope tables and GPT's mask are built whole on every rank. The one-rank blocks are checked exactly
(``tests/unit/test_train_block_bytes.py``); tp = 2 end to end, through a run's measured peak
(``tests/dist/test_plan_auto_peak.py``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeoffload.planner.model import ModelSpec

FAMILIES = ("gpt", "llama")  # ModelSpec.blocks of the models train builds ("" = Megatron-LM's layer)
FP32 = 4  # bytes of what stays fp32 under autocast: residual stream, norm statistics, log-sum-exp


def block_bytes(m: ModelSpec, tp: int = 1, sequence_parallel: bool = True) -> float:
    """Bytes one block of ``m`` (``m.blocks`` names train's family) saves for one microbatch on one of
    ``tp`` ranks: the sum of the terms of the module docstring."""
    seq_split = tp if sequence_parallel else 1
    residual, whole, heads = _terms(m)
    return residual / seq_split + whole + heads / tp


def _terms(m: ModelSpec) -> tuple[float, float, float]:
    """(residual side, whole on every TP rank, split by heads/MLP slice) bytes of one block at tp = 1."""
    e, tokens, h = m.dtype_bytes, m.tokens, m.hidden
    autocast = e < FP32
    if m.blocks == "gpt":
        residual = 2 * (FP32 * tokens * h + 2 * FP32 * tokens)  # two LayerNorms: input, mean and rstd
        whole = 2 * e * tokens * h  # LN outputs: the qkv and fc1 inputs
        attention = _gpt_attention(m, e, autocast)
        mlp = 2 * e * tokens * m.ffn_size  # GeLU's input and output
        return residual, whole + _gpt_mask(m), attention + mlp
    residual = 2 * (FP32 * tokens * h + FP32 * tokens + FP32 * tokens * h)  # two RMSNorms: input, rsqrt, x*rsqrt
    casts = 5 if autocast else 2  # q, k, v and gate, up cast each; in fp32 two shared tensors
    rope = FP32 if m.qk_norm else e  # the tables take q's dtype: fp32 after Qwen3's norms (fp32 weights)
    whole = casts * e * tokens * h + 2 * rope * m.seq * m.head_dim  # + rope cos and sin
    return residual, whole, _llama_attention(m, e) + _qk_norms(m, e) + 4 * e * tokens * m.ffn_size


def _gpt_attention(m: ModelSpec, e: int, autocast: bool) -> float:
    tokens, h = m.tokens, m.hidden
    if m.flash_attention:  # SDPA: the qkv output (views of it passed), its output, the log-sum-exp
        return 3 * e * tokens * h + e * tokens * h + FP32 * m.heads * tokens
    scores = m.heads * m.seq * m.seq * m.microbatch
    if not autocast:
        softmax = FP32 * scores
    elif m.cpu_autocast:  # CPU autocast leaves softmax in bf16
        softmax = e * scores
    else:  # CUDA autocast runs softmax in fp32; p @ v then keeps its bf16 cast too
        softmax = (FP32 + e) * scores
    return 3 * e * tokens * h + softmax + e * tokens * h  # q, k, v copies; probabilities; projection input


def _gpt_mask(m: ModelSpec) -> float:
    """The bool causal mask of written-out attention: s x s bytes, one per forward."""
    return 0.0 if m.flash_attention else float(m.seq * m.seq)


def _llama_attention(m: ModelSpec, e: int) -> float:
    tokens, q, kv = m.tokens, m.attention_width, m.kv_width
    grouped = m.num_kv_heads < m.heads
    k = e * tokens * (q if grouped else kv)  # RoPE'd k, repeated to every query head with groups
    v = e * tokens * (q if grouped else kv)  # repeated v, else a view of v_proj's output
    return e * tokens * q + k + v + e * tokens * q + FP32 * m.heads * tokens  # q, k, v, output, log-sum-exp


def _qk_norms(m: ModelSpec, e: int) -> float:
    """Qwen3's q_norm and k_norm over every head (0 without them): each keeps its input as fp32 (``4*T*A`` and
    ``4*T*K``), its rsqrt per head (``4*T*a``, ``4*T*kv_heads``) and the normalised product in the input's
    dtype (``e*T*A``, ``e*T*K``), which its weight's gradient reads."""
    if not m.qk_norm:
        return 0.0
    width, rows = m.attention_width + m.kv_width, m.heads + m.num_kv_heads
    return FP32 * m.tokens * (width + rows) + e * m.tokens * width


def block_weight_input_bytes(m: ModelSpec, tp: int = 1, sequence_parallel: bool = True) -> float:
    """What W of one block needs after I (the runtime keeps only that, ``runtime.backward``): every linear's
    input (a weight gradient is input^T x output gradient) and what the norms' weight gradients read.
    GPT: the two LN outputs and the projection's and fc2's inputs, and each LayerNorm's input, mean and
    rstd; Llama: the norm outputs as the linears keep them (five casts under autocast, two tensors in
    fp32), o_proj's and down's inputs, and each RMSNorm's ``x32 * rsqrt``."""
    e, tokens, h = m.dtype_bytes, m.tokens, m.hidden
    if m.blocks == "gpt":
        norms, casts = 2 * (FP32 * tokens * h + 2 * FP32 * tokens), 2
    else:
        norms, casts = 2 * FP32 * tokens * h, 5 if e < FP32 else 2
    split = e * tokens * (m.attention_width + m.ffn_size)
    if m.qk_norm:  # Qwen3's q/k norms: their weights' gradients read the normalised products
        split += e * tokens * (m.attention_width + m.kv_width)
    return norms / (tp if sequence_parallel else 1) + casts * e * tokens * h + split / tp


def head_weight_bytes(m: ModelSpec) -> float:
    """What the head's W needs after I: the vocabulary projection's input (the final norm's output, ``e*T*h``)
    and the final norm's weight gradient's reads (LayerNorm: input, mean, rstd; RMSNorm: ``x32 * rsqrt``)."""
    e, tokens, h = m.dtype_bytes, m.tokens, m.hidden
    norm = FP32 * tokens * h + (2 * FP32 * tokens if m.blocks == "gpt" else 0)
    return norm + e * tokens * h


def head_bytes(m: ModelSpec) -> float:
    """What train's head stage keeps per microbatch beyond its blocks: the final norm as in a block (its
    input, statistics, RMSNorm's ``x32 * rsqrt``), its output as the vocabulary projection's input
    (``e*T*h``; in fp32 RMSNorm's output is a tensor apart from ``x32 * rsqrt``), the loss's fp32
    log-softmax (``4*T*V``: cross entropy runs in fp32 under autocast), its int64 targets (``8*T``) and its
    fp32 total weight (one scalar). The head is not tensor-parallel in
    train (every TP rank keeps it whole)."""
    e, tokens, h = m.dtype_bytes, m.tokens, m.hidden
    if m.blocks == "gpt":
        norm = FP32 * tokens * h + 2 * FP32 * tokens
    else:
        norm = 2 * FP32 * tokens * h + FP32 * tokens
    return norm + e * tokens * h + FP32 * tokens * m.vocab + 8 * tokens + FP32


def block_cast_cache_bytes(m: ModelSpec, tp: int = 1) -> float:
    """Bytes autocast's weight-cast cache holds for one block on one of ``tp`` ranks (0 outside bf16
    autocast): every linear's weight and bias cast to bf16 (2 bytes each), made at the block's first
    forward of the step and reused by every later microbatch until ``train_step`` leaves its autocast
    region. The norms' parameters are not cast (they run in fp32). Column-parallel linears (q/k/v or
    qkv, gate/up or fc1) and every weight are split over ``tp``; row-parallel biases (GPT's proj and
    fc2, Llama's o_proj and down_proj with attention_bias and mlp_bias) are whole on every rank."""
    if m.dtype_bytes >= FP32:
        return 0.0
    linears = m.params_per_layer() - m.layer_norms * m.norm_params() - m.qk_norm_params()
    row_biases = (2 * m.hidden if m.bias or m.mlp_bias else m.hidden if m.o_bias else 0)  # o_proj's, down's
    return m.dtype_bytes * ((linears - row_biases) / tp + row_biases)


def head_cast_cache_bytes(m: ModelSpec) -> float:
    """Bytes autocast's cache holds for the head's vocabulary projection (weight, and GPT's bias) under
    bf16 autocast, on every TP rank (train's head is not tensor-parallel); the embeddings are looked up,
    not cast."""
    if m.dtype_bytes >= FP32:
        return 0.0
    return m.dtype_bytes * (m.vocab * m.hidden + (m.vocab if m.blocks == "gpt" else 0))


def embedding_bytes(m: ModelSpec) -> float:
    """What train's first stage keeps per microbatch beyond its blocks: the int64 token ids the embedding's
    backward reads (``8*T``, the microbatch's own copy, made on the device by its forward and held only while it
    is in flight: ``runtime.spec.split_on_host``) and, for GPT,
    the learned positions' int64 index (``8*s``, one per forward). The lookups' fp32 output is the first
    block's input, counted there. Embeddings are not tensor-parallel in train: whole on every TP rank. All
    of it is W's (the embedding's gradient is all weight gradient)."""
    return 8 * m.tokens + (8 * m.seq if m.blocks == "gpt" else 0)
