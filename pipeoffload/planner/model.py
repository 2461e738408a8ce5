"""Decoder-only transformer description and its cost formulas (FLOPs, activation and state bytes).

Everything here is per microbatch and per *layer* unless the name says otherwise, for a tensor-parallel
size ``tp`` with sequence parallelism (activations and FLOPs of a layer both divide by ``tp``, as in
Megatron-LM with ``--sequence-parallel``). Units: FLOPs and bytes.

Activation bytes follow Korthikanti et al. ("Reducing Activation Recomputation in Large Transformer
Models"), generalised to grouped-query attention, any FFN width, gated (SwiGLU) MLPs and models without
dropout. In units of ``s*b*h`` bytes (2-byte elements), one layer saves:

==========================  ==================  =============================
tensor                      GPT (ffn=4h, MHA)   general
==========================  ==================  =============================
LN1 input (residual)        2                   2
LN1 output = QKV input      2                   2                (LGD: recomputed)
Q / K / V                   2 / 2 / 2           2 / 2*kv/a / 2*kv/a
attention output = proj in  2                   2
attention dropout mask      1                   1 if dropout     (LGD: regenerated)
LN2 input (residual)        2                   2
LN2 output = fc1 input      2                   2                (LGD: recomputed)
activation input            8                   2*f/h (x2 if gated)
activation output = fc2 in  8                   2*f/h            (LGD: recomputed)
MLP dropout mask            1                   1 if dropout     (LGD: regenerated)
==========================  ==================  =============================

That is 34*sbh for GPT, plus ``5*a*s^2*b`` (softmax output, its dropout mask and dropout output;
``2*a*s^2*b`` without dropout) when attention is not a fused flash kernel. "LGD" is the reference's
partial recomputation of LayerNorm, GeLU and dropout: 20*sbh for GPT, the constant behind Formula 1.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from pipeoffload.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Shape of a decoder-only transformer and how it is run (sequence, microbatch, dtype, kernels)."""

    name: str = "custom"
    layers: int
    hidden: int
    heads: int
    kv_heads: int | None = None  # None: multi-head attention (= heads)
    ffn: int | None = None  # None: 4 * hidden
    seq: int
    vocab: int = 50257
    microbatch: int = 1
    dtype_bytes: int = 2
    flash_attention: bool = True
    gated_mlp: bool = False  # SwiGLU-style MLP: three weight matrices, two saved activation inputs
    dropout: bool = True
    bias: bool = True
    tied_embeddings: bool = False
    source: str = ""  # "hf:DIR" when read from a local Hugging Face directory (plan --emit passes it to train)

    def __post_init__(self) -> None:
        for key in ("layers", "hidden", "heads", "seq", "vocab", "microbatch", "dtype_bytes"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"model {key}={value!r}: must be an integer >= 1")
        if self.hidden % self.heads:
            raise ConfigError(f"model hidden={self.hidden} is not divisible by heads={self.heads}; "
                              "pick heads that divide the hidden size")
        if self.heads % self.num_kv_heads:
            raise ConfigError(f"model heads={self.heads} is not a multiple of kv_heads={self.num_kv_heads}; "
                              "kv_heads must divide heads")

    # ---- derived shape -----------------------------------------------------------------------
    @property
    def num_kv_heads(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def ffn_size(self) -> int:
        return 4 * self.hidden if self.ffn is None else self.ffn

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def tokens(self) -> int:
        """Tokens in one microbatch (s * b)."""
        return self.seq * self.microbatch

    def with_(self, **changes: object) -> ModelSpec:
        return replace(self, **changes)  # type: ignore[arg-type]

    def check_tp(self, tp: int) -> None:
        """Megatron's constraints for splitting attention heads and KV groups over ``tp`` ranks."""
        if self.heads % tp or self.num_kv_heads % tp or self.ffn_size % tp:
            raise ConfigError(f"tensor parallel size {tp} must divide heads={self.heads}, "
                              f"kv_heads={self.num_kv_heads} and ffn={self.ffn_size}; use a divisor")

    # ---- parameters --------------------------------------------------------------------------
    def matrix_params_per_layer(self) -> int:
        """Weights of the layer's GEMMs (what forward FLOPs and W FLOPs scale with)."""
        h, kv = self.hidden, self.num_kv_heads * self.head_dim
        attention = h * (h + 2 * kv) + h * h
        mlp = h * self.ffn_size * (3 if self.gated_mlp else 2)
        return attention + mlp

    def params_per_layer(self) -> int:
        h, kv = self.hidden, self.num_kv_heads * self.head_dim
        norms = 2 * h * (2 if self.bias else 1)
        biases = (h + 2 * kv) + h + self.ffn_size * (2 if self.gated_mlp else 1) + h if self.bias else 0
        return self.matrix_params_per_layer() + norms + biases

    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def head_params(self) -> int:
        """Output projection plus the final norm (a tied head still has its own copy on the last stage)."""
        return self.vocab * self.hidden + self.hidden * (2 if self.bias else 1)

    def total_params(self) -> int:
        head = self.head_params() - (self.vocab * self.hidden if self.tied_embeddings else 0)
        return self.layers * self.params_per_layer() + self.embedding_params() + head

    # ---- FLOPs (per microbatch) --------------------------------------------------------------
    def attention_flops(self) -> int:
        """Score (Q K^T) and context (P V) GEMMs of one layer: 4*b*s^2*h, not halved for causality."""
        return 4 * self.microbatch * self.seq * self.seq * self.hidden

    def layer_forward_flops(self, tp: int = 1) -> float:
        """Forward FLOPs of one layer on one of ``tp`` ranks; 24bsh^2 + 4bs^2h for GPT shapes."""
        return (2 * self.tokens * self.matrix_params_per_layer() + self.attention_flops()) / tp

    def layer_fiw_flops(self, tp: int = 1) -> tuple[float, float, float]:
        """(F, I, W) FLOPs of one layer: I needs both GEMM input-grads and 2x the attention GEMMs,
        W only the weight-grad GEMMs; F + I + W = 3 F as in the usual 6*N*tokens accounting."""
        gemm = 2 * self.tokens * self.matrix_params_per_layer() / tp
        attention = self.attention_flops() / tp
        return gemm + attention, gemm + 2 * attention, gemm

    def head_fiw_flops(self, tp: int = 1) -> tuple[float, float, float]:
        """Output projection (logits) on the last stage: 2*b*s*h*V each for F, I and W."""
        gemm = 2 * self.tokens * self.hidden * self.vocab / tp
        return gemm, gemm, gemm

    def model_flops_per_microbatch(self) -> float:
        """Training FLOPs of one microbatch through the whole model (no recomputation counted), for MFU."""
        return 3 * (self.layers * self.layer_forward_flops() + self.head_fiw_flops()[0])

    # ---- activation bytes (per microbatch) ---------------------------------------------------
    def activation_coefficient(self, partial_recompute: bool = False) -> float:
        """Saved bytes of one layer per token per hidden unit (34 for GPT, 20 with LGD), no s^2 term."""
        h, a = self.hidden, self.heads
        f_ratio = self.ffn_size / h
        kv_ratio = self.num_kv_heads / a
        masks = 2.0 if self.dropout else 0.0
        attention = 2 + 2 + 2 + 4 * kv_ratio + 2  # LN1 in, QKV in, Q, K+V, proj in
        mlp = 2 + 2 + 2 * f_ratio * (2 if self.gated_mlp else 1) + 2 * f_ratio  # LN2 in, fc1 in, act in, act out
        total = attention + mlp + masks
        if partial_recompute:
            total -= 2 + 2 + 2 * f_ratio + masks  # LN outputs, activation output, dropout masks
        return total * self.dtype_bytes / 2

    def attention_score_bytes(self, partial_recompute: bool = False) -> float:
        """The s^2 term of an unfused attention: 5*a*s^2*b bytes with dropout, 2*a*s^2*b without."""
        if self.flash_attention:
            return 0.0
        per = 5.0 if self.dropout else 2.0
        if partial_recompute and self.dropout:
            per -= 1.0  # the probability-dropout mask is regenerated
        return per * self.heads * self.seq * self.seq * self.microbatch * self.dtype_bytes / 2

    def layer_weight_input_bytes(self, tp: int = 1) -> float:
        """What the weight-gradient pass (W) of one layer needs after I: the inputs of its linear layers,
        QKV input (LN1 output, 2*sbh), attention projection input (2*sbh), fc1 input (LN2 output,
        2*sbh) and fc2 input (the activation output, 2*f/h*sbh): 14*sbh for GPT. W computes each
        weight gradient as input^T x output gradient, so nothing else it saved is needed."""
        per_sbh = 2 + 2 + 2 + 2 * self.ffn_size / self.hidden
        return per_sbh * self.tokens * self.hidden * self.dtype_bytes / 2 / tp

    def layer_w_fraction(self, tp: int = 1, partial_recompute: bool = False) -> float:
        """w_fraction of one layer: ``layer_weight_input_bytes / layer_activation_bytes`` (at most 1):
        14/34 = 0.41 for GPT without the s^2 scores, 14/20 = 0.7 with LGD (the backward recomputes the
        LayerNorm and activation outputs, which W then uses)."""
        return min(1.0, self.layer_weight_input_bytes(tp) / self.layer_activation_bytes(tp, partial_recompute))

    def head_weight_input_bytes(self, tp: int = 1) -> float:
        """The output projection's input (the final norm's output, 2*sbh): what the head's W needs."""
        return 2 * self.tokens * self.hidden * self.dtype_bytes / 2 / tp

    def layer_activation_bytes(self, tp: int = 1, partial_recompute: bool = False) -> float:
        """Saved activations of one layer for one microbatch on one of ``tp`` ranks."""
        sbh = self.tokens * self.hidden
        return (self.activation_coefficient(partial_recompute) * sbh
                + self.attention_score_bytes(partial_recompute)) / tp

    def head_activation_bytes(self, tp: int = 1) -> float:
        """Last stage extra: final-norm input and output (4*sbh) and the fp32 softmax of the loss (4*s*b*V)."""
        return (4 * self.tokens * self.hidden * self.dtype_bytes / 2 + 4 * self.tokens * self.vocab) / tp

    def boundary_bytes(self, tp: int = 1) -> float:
        """Bytes sent between pipeline stages per microbatch (hidden states, scattered over TP ranks)."""
        return self.tokens * self.hidden * self.dtype_bytes / tp

    def recompute_elementwise_bytes(self) -> float:
        """HBM traffic of redoing LayerNorm, the MLP activation and dropout in backward (LGD): read their
        inputs and write their outputs; memory-bound, so its time is bytes / HBM bandwidth."""
        f_ratio = self.ffn_size / self.hidden
        act_in = 2 * f_ratio * (2 if self.gated_mlp else 1)
        per_sbh = 2 * (2 + 2) + act_in + 2 * f_ratio  # two LayerNorms (read+write) + activation in/out
        return per_sbh * self.tokens * self.hidden * self.dtype_bytes / 2
