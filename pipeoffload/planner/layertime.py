"""Seconds of one transformer layer on one tensor-parallel rank: F, I, W and the full backward B.

Built from the per-GPU shapes (``gemm.py``), the memory-bound element-wise kernels and the
tensor-parallel collectives as Megatron-LM issues them. Per layer and microbatch, on one of ``tp``
ranks, with ``T = s*b`` tokens, hidden ``h``, FFN width ``f``:

GEMMs (each runs forward, input-gradient (I) and weight-gradient (W) at the same rate):
  QKV ``[T, h] x [h, (A + 2 kv)/tp]``, projection ``[T, A/tp] x [A/tp, h]`` (``A`` = heads x head_dim,
  ``h`` unless the config sets head_dim apart; ``kv`` = kv_heads x head_dim),
  FC1 ``[T, h] x [h, f/tp]`` (2f/tp gated), FC2 ``[T, f/tp] x [f/tp, h]``;
  attention core: ``b*a/tp`` score GEMMs ``[s, d] x [d, s]`` and as many ``[s, s] x [s, d]``; its
  backward is twice its forward; flash attention recomputes the scores in backward (+1/2 forward
  core, FlashAttention-2's 2.5x), Megatron's selective recomputation the whole core (+1 forward; with
  flash attention Megatron-core checkpoints the fused kernel, which then runs its forward again too).
Element-wise kernels (bytes moved per token, 2-byte elements, forward; backward moves twice as much):
  LayerNorm 2 x 4h, bias-dropout-residual 2 x 7h (6h without dropout), Q/K/V and context permutes 4A,
  GeLU 4f (SwiGLU 6f), unfused softmax + dropout 9 bytes per score (forward) and 11 (backward);
  LayerNorm and dropout-residual run on ``T/tp`` tokens with sequence parallelism, on all ``T`` without.
Collectives (``HardwareSpec.collective_time`` of the full ``T*h`` tensor, ``c`` each):
  sequence parallel: forward all-gather before QKV and FC1, reduce-scatter after the projection and
  FC2 (4c, not overlapped). Full backward (1F1B-style B): the two all-gathers of the row-parallel
  layers' output gradients are exposed (2c); the re-gathers of the QKV/FC1 inputs overlap with their
  input-gradient GEMMs and the reduce-scatters of their input gradients with their weight-gradient
  GEMMs (Megatron's async communication; only the excess over the GEMM is exposed). Split backward
  (I, W apart, as zero-bubble schedules run it): I pays 4c (nothing left to overlap with), W the two
  re-gathers (2c). Without sequence parallelism: two all-reduces (= 2c each) in F, and in B the
  input-gradient all-reduces of QKV/FC1, overlapped with their weight-gradient GEMMs; I pays both.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pipeoffload.planner.gemm import elementwise_time, gemm_time, rate_at_intensity
from pipeoffload.planner.hardware import HardwareSpec
from pipeoffload.planner.model import ModelSpec


@dataclass(frozen=True)
class LayerTimes:
    f: float
    i: float
    w: float
    b: float  # full backward (input and weight gradients together, with Megatron's overlap)
    detail: dict[str, float] = field(default_factory=dict, compare=False)


def _linears(model: ModelSpec, tp: int) -> dict[str, tuple[float, float, float]]:
    """(M, N, K) of each linear layer's forward GEMM on one of ``tp`` ranks."""
    t, h, q, kv = model.tokens, model.hidden, model.attention_width, model.kv_width
    f = model.ffn_size
    return {
        "qkv": (t, (q + 2 * kv) / tp, h),
        "proj": (t, h, q / tp),
        "fc1": (t, f * (2 if model.gated_mlp else 1) / tp, h),
        "fc2": (t, h, f / tp),
    }


def attention_core_time(model: ModelSpec, hw: HardwareSpec, tp: int) -> float:
    """Forward time of the score and context GEMMs of one layer (4*b*s^2*h/tp FLOPs)."""
    s, d = model.seq, model.head_dim
    flops = model.attention_flops() / tp
    if model.flash_attention:  # fused: the s x s scores never reach HBM
        if hw.flash_fraction is not None and hw.compute_model != "flat":
            return flops / (hw.peak_flops * hw.flash_fraction)
        return flops / rate_at_intensity(hw, s * s * d / (2 * s * d))
    batches = model.microbatch * model.heads / tp
    return gemm_time(hw, s, s, d, 2 * batches)


def elementwise_bytes(model: ModelSpec, tp: int, sequence_parallel: bool = True) -> tuple[float, float]:
    """(forward, backward) bytes of the layer's element-wise kernels on one of ``tp`` ranks."""
    t, h, f = model.tokens, model.hidden, model.ffn_size
    scale = model.dtype_bytes / 2
    residual = 4 + (7 if model.dropout else 6)  # LayerNorm + bias-dropout-residual, twice per layer
    norm_part = 2 * residual * t * h / (tp if sequence_parallel else 1)
    sharded = (4 * t * model.attention_width + (6 if model.gated_mlp else 4) * f * t) / tp
    forward = (norm_part + sharded) * scale
    backward = 2 * forward
    if not model.flash_attention:
        scores = model.microbatch * model.heads / tp * model.seq ** 2
        forward += (9 if model.dropout else 4) * scores * scale
        backward += (11 if model.dropout else 6) * scores * scale
    return forward, backward


def layer_times(model: ModelSpec, hw: HardwareSpec, tp: int = 1, *, sequence_parallel: bool = True,
                partial_recompute: bool = False, selective_recompute: bool = False) -> LayerTimes:
    """F, I, W and B of one layer on one of ``tp`` ranks (see the module docstring).

    Under ``compute_model = "flat"`` this reduces to Formula 1's accounting: GEMM and attention FLOPs at
    B_c, no element-wise time, no attention recompute; collectives are charged in both models."""
    flat = hw.compute_model == "flat"
    lin = {name: gemm_time(hw, *shape) for name, shape in _linears(model, tp).items()}
    gemms = sum(lin.values())
    core = attention_core_time(model, hw, tp)
    ew_f, ew_b = elementwise_bytes(model, tp, sequence_parallel)
    t_ew_f, t_ew_b = elementwise_time(hw, ew_f), elementwise_time(hw, ew_b)
    recompute_core = 0.0
    if not flat and model.flash_attention:
        recompute_core = 0.5 * core  # the fused kernel's backward recomputes the scores
        if selective_recompute:  # Megatron checkpoints the fused kernel too: its forward runs again
            recompute_core += core
    elif not flat and selective_recompute:  # the score GEMMs, softmax and dropout again in backward
        scores = model.microbatch * model.heads / tp * model.seq ** 2
        recompute_core = core + elementwise_time(hw, (9 if model.dropout else 4) * scores * model.dtype_bytes / 2)
    comm_f, comm_i, comm_w, comm_b = _tp_comm(model, hw, tp, lin, sequence_parallel)
    lgd_bytes = model.recompute_elementwise_bytes(tp, sequence_parallel)
    lgd = (lgd_bytes / hw.hbm_bandwidth if flat else elementwise_time(hw, lgd_bytes)) if partial_recompute else 0.0
    f = gemms + core + t_ew_f + comm_f
    i = gemms + 2 * core + recompute_core + t_ew_b + comm_i + lgd
    w = gemms + comm_w
    b = 2 * gemms + 2 * core + recompute_core + t_ew_b + comm_b + lgd
    detail = {"gemm": gemms, "attention_core": core, "elementwise_f": t_ew_f, "elementwise_b": t_ew_b,
              "comm_f": comm_f, "comm_i": comm_i, "comm_w": comm_w, "comm_b": comm_b,
              "attention_recompute": recompute_core, "lgd": lgd}
    return LayerTimes(f, i, w, b, detail)


def _tp_comm(model: ModelSpec, hw: HardwareSpec, tp: int, lin: dict[str, float],
             sequence_parallel: bool) -> tuple[float, float, float, float]:
    """Exposed collective time of one layer in F, I (split), W (split) and B (full backward)."""
    if tp <= 1:
        return 0.0, 0.0, 0.0, 0.0
    c = hw.collective_time(model.boundary_bytes(1), tp, 1)
    column = (lin["qkv"], lin["fc1"])  # layers whose backward overlaps communication with a GEMM
    if sequence_parallel:
        overlapped = sum(2 * max(0.0, c - t) for t in column)  # re-gather vs dgrad, reduce-scatter vs wgrad
        return 4 * c, 4 * c, 2 * c, 2 * c + overlapped
    all_reduce = 2 * c
    return 2 * all_reduce, 2 * all_reduce, 0.0, sum(max(0.0, all_reduce - t) for t in column)


def head_times(model: ModelSpec, hw: HardwareSpec, tp: int = 1, *,
               sequence_parallel: bool = True) -> tuple[float, float, float, float]:
    """(F, I, W, B) of the output projection ``[T, h] x [h, V/tp]`` (vocabulary-parallel) and the loss.

    Its collectives are ``head_comm``'s. The loss is Megatron's vocabulary-parallel cross entropy on fp32
    logits (``loss_elementwise_bytes``), memory-bound, in F and in the backward's I."""
    t = gemm_time(hw, model.tokens, model.vocab / tp, model.hidden)
    comm_f, comm_b = head_comm(model, hw, tp, sequence_parallel=sequence_parallel)
    loss_f, loss_b = (elementwise_time(hw, x) for x in loss_elementwise_bytes(model, tp))
    return t + comm_f + loss_f, t + comm_b + loss_b, t, 2 * t + comm_b + loss_b


def head_comm(model: ModelSpec, hw: HardwareSpec, tp: int = 1, *,
              sequence_parallel: bool = True) -> tuple[float, float]:
    """(F, backward) tensor-parallel collectives of the head, as Megatron-LM issues them: with sequence
    parallelism the final hidden states are all-gathered in F and their gradient reduce-scattered in the
    backward; without it the input is copied to every rank (nothing in F) and its gradient all-reduced
    in the backward. ``vocab_parallel_cross_entropy`` adds three all-reduces in F of one fp32 value per
    token (the logits' max, the target's logit, the sum of the exponentials); none in the backward."""
    if tp <= 1:
        return 0.0, 0.0
    c = hw.collective_time(model.boundary_bytes(1), tp, 1)
    loss = 3 * 2 * hw.collective_time(4.0 * model.tokens, tp, 1)  # an all-reduce is two collectives
    return (c + loss, c) if sequence_parallel else (loss, 2 * c)


def loss_elementwise_bytes(model: ModelSpec, tp: int) -> tuple[float, float]:
    """(forward, backward) HBM bytes of the loss on one rank's ``T x V/tp`` logits, as Megatron-LM's
    ``vocab_parallel_cross_entropy(output.float(), labels)`` runs it, per logit: cast to fp32 (read the
    2-byte logit, write 4), max (read 4), subtract the max in place (8), exp in place (8), sum (4),
    divide by the sum in place (8): the softmax kept for the backward; backward: multiply by the
    incoming gradient in place (8) and cast back (read 4, write 2). The per-token gathers are small."""
    logits = model.tokens * model.vocab / tp
    return logits * (model.dtype_bytes + 36), logits * (12 + model.dtype_bytes)


def embedding_times(model: ModelSpec, hw: HardwareSpec, tp: int = 1, *,
                    sequence_parallel: bool = True) -> tuple[float, float]:
    """(F, B) of the first stage's embedding, as Megatron-LM's GPT runs it (``embedding_bytes``) plus its
    collectives (``embedding_comm``). All of B is weight-gradient work (the token input has no gradient)."""
    ew_f, ew_b = embedding_bytes(model, tp, sequence_parallel)
    comm_f, comm_b = embedding_comm(model, hw, tp, sequence_parallel=sequence_parallel)
    return elementwise_time(hw, ew_f) + comm_f, elementwise_time(hw, ew_b) + comm_b


def embedding_comm(model: ModelSpec, hw: HardwareSpec, tp: int = 1, *,
                   sequence_parallel: bool = True) -> tuple[float, float]:
    """(F, B) tensor-parallel collectives of the embedding: the vocabulary-parallel lookup's all-reduce
    in F (with or without sequence parallelism) and, with it, the all-gather in B that is the backward
    of the scatter to the sequence shards."""
    if tp <= 1:
        return 0.0, 0.0
    c = hw.collective_time(model.boundary_bytes(1), tp, 1)
    return 2 * c, (c if sequence_parallel else 0.0)


def embedding_bytes(model: ModelSpec, tp: int, sequence_parallel: bool = True) -> tuple[float, float]:
    """(forward, backward) HBM bytes of the word + position embedding on one of ``tp`` ranks, per element
    of the ``T x h`` output (2-byte elements): word lookup (read 2, write 2), zeroing the rows of tokens
    outside the rank's vocabulary shard (2), position lookup (4), their sum (6), the [b, s] -> [s, b]
    transpose (4), dropout (5; on the sequence shard with sequence parallelism, after a 4-byte copy
    into it). Backward: dropout (5, sharded as in F), transpose (4), the zeroed rows (2), the two dense
    embedding-gradient kernels reading the output gradient (2 each), plus writing the word embedding's
    dense ``V/tp x h`` gradient (2 per weight)."""
    n = model.tokens * model.hidden
    scale = model.dtype_bytes / 2
    shard = tp if sequence_parallel else 1
    dropout = (5 if model.dropout else 0) / shard + (4 / tp if sequence_parallel and tp > 1 else 0.0)
    forward = n * (4 + 2 + 4 + 6 + 4 + dropout) * scale
    backward = (n * ((5 if model.dropout else 0) / shard + 4 + 2 + 4)
                + 2 * model.vocab * model.hidden / tp) * scale
    return forward, backward
