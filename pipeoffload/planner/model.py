"""Decoder-only transformer description and its cost formulas (FLOPs, activation and state bytes).

Everything here is per microbatch and per *layer* unless the name says otherwise, for a tensor-parallel
size ``tp``: FLOPs of a layer divide by ``tp``; its activations do with sequence parallelism (Megatron-LM's
``--sequence-parallel``, the default), and without it the norms' inputs and outputs and the dropout masks
are replicated on every TP rank (marked "repl." below). Units: FLOPs and bytes.

Activation bytes follow Korthikanti et al. ("Reducing Activation Recomputation in Large Transformer
Models"), generalised to grouped-query attention, any FFN width, gated (SwiGLU) MLPs and models without
dropout and an attention width ``A = heads * head_dim`` other than ``h`` (Mistral-Nemo). In units of
``s*b*h`` bytes (2-byte elements), one layer saves:

==========================  ==================  =============================
tensor                      GPT (ffn=4h, MHA)   general
==========================  ==================  =============================
LN1 input (residual)        2 (repl.)           2                (repl.)
LN1 output = QKV input      2 (repl.)           2                (repl.; LGD: recomputed)
Q / K / V                   2 / 2 / 2           2*A/h / 2*kv*d/h / 2*kv*d/h
attention output = proj in  2                   2*A/h
attention dropout mask      1 (repl.)           1 if dropout     (repl.; LGD: regenerated)
LN2 input (residual)        2 (repl.)           2                (repl.)
LN2 output = fc1 input      2 (repl.)           2                (repl.; LGD: recomputed)
activation input            8                   2*f/h (x2 if gated)
activation output = fc2 in  8                   2*f/h            (LGD: recomputed)
MLP dropout mask            1 (repl.)           1 if dropout     (repl.; LGD: regenerated)
==========================  ==================  =============================

That is 34*sbh/t for GPT with sequence parallelism and ``(10 + 24/t)*sbh`` without (Korthikanti et al.,
Table 2), plus ``5*a*s^2*b/t`` (softmax output, its dropout mask and dropout output; ``2*a*s^2*b/t``
without dropout) when attention is not a fused flash kernel. "LGD" is the reference's partial
recomputation of LayerNorm, GeLU and dropout: 20*sbh for GPT, the constant behind Formula 1.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from pipeoffload.errors import ConfigError
from pipeoffload.planner.trainblocks import (
    FAMILIES,
    block_bytes,
    block_cast_cache_bytes,
    block_weight_input_bytes,
    embedding_bytes,
    head_bytes,
    head_cast_cache_bytes,
    head_weight_bytes,
)


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Shape of a decoder-only transformer and how it is run (sequence, microbatch, dtype, kernels)."""

    name: str = "custom"
    layers: int
    hidden: int
    heads: int
    kv_heads: int | None = None  # None: multi-head attention (= heads)
    head_size: int | None = None  # per-head width (config.json's head_dim); None: hidden // heads
    ffn: int | None = None  # None: 4 * hidden
    seq: int
    vocab: int = 50257
    microbatch: int = 1
    dtype_bytes: int = 2
    flash_attention: bool = True
    gated_mlp: bool = False  # SwiGLU-style MLP: three weight matrices, two saved activation inputs
    dropout: bool = True
    bias: bool = True  # every bias of a GPT layer: both norms' and every linear's (QKV, projection, MLP)
    qkv_bias: bool = False  # biases on Q, K and V only (Qwen2); implied by ``bias``
    o_bias: bool = False  # a bias on the attention's output projection too (Llama's, Qwen3's attention_bias)
    mlp_bias: bool = False  # biases on a gated MLP's three linears (Llama's mlp_bias); implied by ``bias``
    qk_norm: bool = False  # an RMSNorm over head_dim on every query and key head (Qwen3's q_norm, k_norm)
    positions: int = 0  # rows of a learned position embedding on the first stage (GPT-2's n_positions); 0: none
    tied_embeddings: bool = False
    layer_norms: int = 2  # norms per layer: 1 in Falcon-7B's parallel block, 4 in Gemma 2
    # sliding-window attention's width (config.json's sliding_window); 0: none. Planned only where it is not
    # below seq: there a window is full causal attention, which is what the formulas model
    attention_window: int = 0
    norm_bias: bool | None = None  # whether norms have biases (LayerNorm); None: as ``bias`` (Falcon: True)
    source: str = ""  # "hf:DIR" when read from a local Hugging Face directory (plan --emit passes it to train)
    params_note: str = ""  # why total_params() is only approximate for this architecture; "": exact
    # positions a rotary model was trained to (config.json's max_position_embeddings); 0: unknown. A longer
    # seq costs what the formulas say but the model was never trained there: planned, with a warning
    rotary_positions: int = 0
    # whose layer the activation formulas describe: "" Megatron-LM's (Korthikanti et al.'s accounting, the
    # paper models), "gpt" or "llama" the blocks ``pipeoffload train`` builds (``planner.trainblocks``,
    # where dtype_bytes 2 is bf16 autocast: the residual stream and the norms' statistics stay fp32)
    blocks: str = ""
    cpu_autocast: bool = False  # train blocks under CPU autocast, which leaves softmax in bf16 (CUDA: fp32)

    def __post_init__(self) -> None:
        for key in ("layers", "hidden", "heads", "seq", "vocab", "microbatch", "dtype_bytes"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"model {key}={value!r}: must be an integer >= 1")
        if not isinstance(self.positions, int) or self.positions < 0:
            raise ConfigError(f"model positions={self.positions!r}: must be an integer >= 0")
        self._check_seq()
        if self.blocks not in ("", *FAMILIES):
            raise ConfigError(f"model blocks={self.blocks!r}: must be '' (Megatron-LM's layer) or one of "
                              f"{', '.join(FAMILIES)} (train's)")
        if self.head_size is not None and (not isinstance(self.head_size, int) or self.head_size < 1):
            raise ConfigError(f"model head_size={self.head_size!r}: must be an integer >= 1")
        if self.head_size is None and self.hidden % self.heads:
            raise ConfigError(f"model hidden={self.hidden} is not divisible by heads={self.heads}; "
                              "pick heads that divide the hidden size")
        if self.heads % self.num_kv_heads:
            raise ConfigError(f"model heads={self.heads} is not a multiple of kv_heads={self.num_kv_heads}; "
                              "kv_heads must divide heads")

    def _check_seq(self) -> None:
        """A learned position table has no row past its end; a sliding window below seq is not full attention."""
        if self.positions and self.seq > self.positions:
            raise ConfigError.named(lambda n: f"model {self.name}: seq {self.seq} is beyond its learned position "
                                    f"table ({self.positions} rows), which it cannot run past; use "
                                    f"{n.given('seq', self.positions)} or less")
        if self.attention_window and self.seq > self.attention_window:
            raise ConfigError.named(lambda n: f"model {self.name}: sliding_window={self.attention_window} is below seq "
                                    f"{self.seq} and the planner models full causal attention only; use "
                                    f"{n.given('seq', self.attention_window)} or less")

    # ---- derived shape -----------------------------------------------------------------------
    @property
    def num_kv_heads(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def ffn_size(self) -> int:
        return 4 * self.hidden if self.ffn is None else self.ffn

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads if self.head_size is None else self.head_size

    @property
    def attention_width(self) -> int:
        """Width of Q and of the attention output (heads x head_dim): hidden unless head_dim is set apart."""
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Width of K (and of V): kv_heads x head_dim."""
        return self.num_kv_heads * self.head_dim

    @property
    def tokens(self) -> int:
        """Tokens in one microbatch (s * b)."""
        return self.seq * self.microbatch

    def tp_sizes(self, limit: int, *others: int) -> str:
        """The tensor-parallel sizes up to ``limit`` (GPUs per node) that divide the heads, KV heads, FFN width
        and ``others`` (e.g. the GPU count), as an error's fix names them: "1, 2 or 4"."""
        sizes = [t for t in range(1, limit + 1)
                 if not any(x % t for x in (self.heads, self.num_kv_heads, self.ffn_size, *others))]
        return ", ".join(map(str, sizes[:-1])) + " or " + str(sizes[-1]) if len(sizes) > 1 else str(sizes[0])

    def notes(self) -> list[str]:
        """Warnings about the model itself that every answer (plan, estimate, comparison) prints: an
        approximate parameter count, a sequence past the positions a rotary model was trained to."""
        notes = [self.params_note] if self.params_note else []
        if self.rotary_positions and self.seq > self.rotary_positions:
            notes.append(f"model {self.name}: seq {self.seq} is past the {self.rotary_positions} positions its rotary "
                         "embedding was trained to (max_position_embeddings); the cost is planned, but the model "
                         "needs long-context training or RoPE scaling to be useful there")
        return notes

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
        h, q, kv = self.hidden, self.attention_width, self.kv_width
        attention = h * (q + 2 * kv) + q * h  # QKV, then the projection back from q to h
        mlp = h * self.ffn_size * (3 if self.gated_mlp else 2)
        return attention + mlp

    def params_per_layer(self) -> int:
        """Weights, norms and biases of one layer: GPT's (``bias``: LayerNorm biases and a bias on every
        linear) or Llama's (RMSNorm weights only), with Qwen2's Q/K/V biases (``qkv_bias``), Llama's or
        Qwen3's output projection bias (``o_bias``) and MLP biases (``mlp_bias``), Qwen3's q/k norms."""
        h, q, kv = self.hidden, self.attention_width, self.kv_width
        norms = self.layer_norms * self.norm_params() + self.qk_norm_params()
        if self.bias:
            biases = (q + 2 * kv) + h + self.ffn_size * (2 if self.gated_mlp else 1) + h
        else:
            biases = ((q + 2 * kv) if self.qkv_bias else 0) + (h if self.o_bias else 0)
            biases += (2 * self.ffn_size + h) if self.mlp_bias else 0
        return self.matrix_params_per_layer() + norms + biases

    def qk_norm_params(self) -> int:
        """Weights of Qwen3's q_norm and k_norm (one head width each, shared by every head); 0 without them."""
        return 2 * self.head_dim if self.qk_norm else 0

    def norm_params(self) -> int:
        """Weights (and biases) of one norm over the hidden size."""
        biased = self.bias if self.norm_bias is None else self.norm_bias
        return self.hidden * (2 if biased else 1)

    def embedding_params(self) -> int:
        """The first stage's embeddings: the word embedding and a learned position table, if any."""
        return (self.vocab + self.positions) * self.hidden

    def word_embedding_params(self) -> int:
        """The word embedding alone (what a tied head shares)."""
        return self.vocab * self.hidden

    def head_params(self) -> int:
        """Output projection plus the final norm (a tied head still has its own copy on the last stage);
        train's GPT head (``blocks="gpt"``, an ``nn.Linear``) also has a bias over the vocabulary."""
        bias = self.vocab if self.blocks == "gpt" else 0
        return self.vocab * self.hidden + bias + self.norm_params()

    def outside_blocks_tp(self, tp: int) -> int:
        """How many ways the embeddings and the head are split over ``tp`` ranks: Megatron-LM splits them
        by the vocabulary (``tp``); train's tensor parallelism shards the blocks only and keeps the
        embeddings and head whole on every TP rank (``models.tensor_parallel``)."""
        return 1 if self.blocks else tp

    def total_params(self) -> int:
        head = self.head_params() - (self.word_embedding_params() if self.tied_embeddings else 0)
        return self.layers * self.params_per_layer() + self.embedding_params() + head

    def params_size(self) -> str:
        """The parameter count as the reports print it: "70.6B", "124M" or "228K" (a small or test model
        read "0.0B"); "~" before it where the count is approximate (``params_note``)."""
        n = self.total_params()
        size = (f"{n / 1e9:.1f}B" if n >= 0.95e9 else f"{n / 1e6:.3g}M" if n >= 0.95e6 else f"{n / 1e3:.3g}K")
        return f"{'~' if self.params_note else ''}{size}"

    # ---- FLOPs (per microbatch) --------------------------------------------------------------
    def attention_flops(self) -> int:
        """Score (Q K^T) and context (P V) GEMMs of one layer: 4*b*s^2*A (A = heads x head_dim, h unless
        head_dim is set apart), not halved for causality."""
        return 4 * self.microbatch * self.seq * self.seq * self.attention_width

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
    def activation_terms(self, partial_recompute: bool = False) -> tuple[float, float]:
        """Saved bytes of one layer per token per hidden unit, no s^2 term, as (replicated, split): the
        first are on every TP rank without sequence parallelism (norm inputs and outputs, dropout
        masks: 10 for GPT, 4 with LGD), the second always split over TP (24 for GPT, 16 with LGD)."""
        h = self.hidden
        q, kv, f = self.attention_width / h, self.kv_width / h, self.ffn_size / h
        norm_in, norm_out = 2 + 2, 2 + 2  # LN1/LN2 inputs; outputs = QKV and fc1 inputs
        masks = 2.0 if self.dropout else 0.0
        attention = 2 * q + 4 * kv + 2 * q  # Q, K + V, projection input
        act_in, act_out = 2 * f * (2 if self.gated_mlp else 1), 2 * f
        if partial_recompute:  # LGD recomputes norm and activation outputs, regenerates the masks
            norm_out, masks, act_out = 0, 0.0, 0.0
        scale = self.dtype_bytes / 2
        return (norm_in + norm_out + masks) * scale, (attention + act_in + act_out) * scale

    def activation_coefficient(self, partial_recompute: bool = False) -> float:
        """Saved bytes of one layer per token per hidden unit (34 for GPT, 20 with LGD), no s^2 term."""
        return sum(self.activation_terms(partial_recompute))

    def attention_score_bytes(self, partial_recompute: bool = False) -> float:
        """The s^2 term of an unfused attention: 5*a*s^2*b bytes with dropout, 2*a*s^2*b without."""
        if self.flash_attention:
            return 0.0
        per = 5.0 if self.dropout else 2.0
        if partial_recompute and self.dropout:
            per -= 1.0  # the probability-dropout mask is regenerated
        return per * self.heads * self.seq * self.seq * self.microbatch * self.dtype_bytes / 2

    def layer_weight_input_bytes(self, tp: int = 1, sequence_parallel: bool = True) -> float:
        """What the weight-gradient pass (W) of one layer needs after I: the inputs of its linear layers,
        QKV input (LN1 output, 2*sbh), attention projection input (2*A/h*sbh), fc1 input (LN2 output,
        2*sbh) and fc2 input (the activation output, 2*f/h*sbh): 14*sbh for GPT. W computes each
        weight gradient as input^T x output gradient, so nothing else it saved is needed. Without
        sequence parallelism the QKV and fc1 inputs (norm outputs) are whole on every TP rank. Train's
        blocks: ``trainblocks.block_weight_input_bytes``."""
        if self.blocks:
            return block_weight_input_bytes(self, tp, sequence_parallel)
        h = self.hidden
        replicated = 2 + 2
        split = 2 * self.attention_width / h + 2 * self.ffn_size / h
        return self._per_rank(replicated, split, tp, sequence_parallel) * self.tokens * h

    def layer_w_fraction(self, tp: int = 1, partial_recompute: bool = False,
                         sequence_parallel: bool = True) -> float:
        """w_fraction of one layer: ``layer_weight_input_bytes / layer_activation_bytes`` (at most 1):
        14/34 = 0.41 for GPT without the s^2 scores, 14/20 = 0.7 with LGD (the backward recomputes the
        LayerNorm and activation outputs, which W then uses)."""
        need = self.layer_weight_input_bytes(tp, sequence_parallel)
        return min(1.0, need / self.layer_activation_bytes(tp, partial_recompute, sequence_parallel))

    def head_weight_input_bytes(self, tp: int = 1, sequence_parallel: bool = True) -> float:
        """The output projection's input (the final norm's output, 2*sbh): what the head's W needs (train's
        head: ``trainblocks.head_weight_bytes``)."""
        if self.blocks:
            return head_weight_bytes(self)
        return self._per_rank(2, 0, tp, sequence_parallel) * self.tokens * self.hidden

    def layer_activation_bytes(self, tp: int = 1, partial_recompute: bool = False,
                               sequence_parallel: bool = True) -> float:
        """Saved activations of one layer for one microbatch on one of ``tp`` ranks (train's blocks:
        ``trainblocks.block_bytes``, which performs no partial recomputation)."""
        if self.blocks:
            return block_bytes(self, tp, sequence_parallel)
        replicated, split = self.activation_terms(partial_recompute)
        per_rank = (replicated / (tp if sequence_parallel else 1) + split / tp) * self.tokens * self.hidden
        return per_rank + self.attention_score_bytes(partial_recompute) / tp

    def head_activation_bytes(self, tp: int = 1, sequence_parallel: bool = True) -> float:
        """Last stage extra: final-norm input and output (4*sbh, whole on every TP rank without sequence
        parallelism) and the fp32 softmax of the loss (4*s*b*V, always split over the vocabulary). Train's
        head: ``trainblocks.head_bytes``."""
        if self.blocks:
            return head_bytes(self)
        norm = self._per_rank(4, 0, tp, sequence_parallel) * self.tokens * self.hidden
        return norm + 4 * self.tokens * self.vocab / tp

    def embedding_activation_bytes(self) -> float:
        """First stage extra of train's blocks: the embedding's saved token ids (``trainblocks.embedding_bytes``);
        0 for Megatron-LM's layer (Korthikanti et al. count none)."""
        return embedding_bytes(self) if self.blocks else 0.0

    def layer_cast_cache_bytes(self, tp: int = 1) -> float:
        """Bytes bf16 autocast's weight-cast cache holds for one layer of train's blocks on one of ``tp``
        ranks for the whole step (``trainblocks.block_cast_cache_bytes``); 0 for Megatron-LM's layer,
        whose bf16 weights are its ``TrainingSetup.weight_bytes``."""
        return block_cast_cache_bytes(self, tp) if self.blocks else 0.0

    def head_cast_cache_bytes(self) -> float:
        """The same for train's head (``trainblocks.head_cast_cache_bytes``); 0 for Megatron-LM's."""
        return head_cast_cache_bytes(self) if self.blocks else 0.0

    def _per_rank(self, replicated: float, split: float, tp: int, sequence_parallel: bool) -> float:
        """Bytes per token per hidden unit on one TP rank of terms given in 2-byte elements: ``split``
        divides by ``tp``, ``replicated`` only with sequence parallelism."""
        return (replicated / (tp if sequence_parallel else 1) + split / tp) * self.dtype_bytes / 2

    def boundary_bytes(self, tp: int = 1) -> float:
        """Bytes sent between pipeline stages per microbatch (hidden states, scattered over TP ranks)."""
        return self.tokens * self.hidden * self.dtype_bytes / tp

    def recompute_elementwise_bytes(self, tp: int = 1, sequence_parallel: bool = True) -> float:
        """HBM traffic on one of ``tp`` ranks of redoing LayerNorm, the MLP activation and dropout in
        backward (LGD): read their inputs and write their outputs; memory-bound, so its time is bytes /
        HBM bandwidth. Without sequence parallelism every rank redoes the norms on all tokens."""
        f_ratio = self.ffn_size / self.hidden
        act_in = 2 * f_ratio * (2 if self.gated_mlp else 1)
        norms = 2 * (2 + 2)  # two LayerNorms, read + write
        return self._per_rank(norms, act_in + 2 * f_ratio, tp, sequence_parallel) * self.tokens * self.hidden


def check_model_shape(model: ModelSpec) -> None:
    """The sizes a ``ModelSpec`` derives (FFN width, KV heads) are whole and positive: a zero would divide by
    zero deep in the cost formulas, a negative one would give a silently wrong k or plan."""
    for name, value in (("ffn", model.ffn_size), ("kv_heads", model.num_kv_heads)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"model {name}={value!r}: must be an integer >= 1")


def check_model(value: object, field: str = "model") -> None:
    """A request's model is a ``ModelSpec`` of a sound shape: a preset's name (what the CLI's ``--model``
    takes) is refused in one line with the call that gives its ``ModelSpec``."""
    if not isinstance(value, ModelSpec):
        fix = (f"pipeoffload.planner.model_preset({value!r})" if isinstance(value, str)
               else "a pipeoffload.planner.ModelSpec, e.g. pipeoffload.planner.model_preset('llama3-8b')")
        raise ConfigError(f"{field}={value!r} is a {type(value).__name__}, not a ModelSpec; use {fix}")
    check_model_shape(value)
