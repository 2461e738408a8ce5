"""How fast one GPU runs a GEMM of a given shape, and an element-wise kernel of a given size.

The rate of a ``[M, K] x [K, N]`` GEMM is modelled from its arithmetic intensity
``I = M*N*K / (M*K + K*N + M*N)`` (FLOPs per byte moved, bf16 operands read once, output written once):

    rate = peak * gemm_max_fraction * I / (I + gemm_half_intensity)

a saturating curve: large GEMMs approach ``gemm_max_fraction`` of the datasheet peak, narrow ones
(small tensor-parallel shards, short attention heads) run slower. ``I`` grows with each of M, N and K,
so a smaller shard is never faster per FLOP; it is symmetric in M, N, K, so the forward GEMM and its
two backward GEMMs (input gradient, weight gradient) of one linear layer run at the same rate. The two
constants are fitted on published measurements (``benchmarks/planner_accuracy.py``); with
``compute_model = "flat"`` every FLOP runs at the hardware's ``flops`` (the paper's B_c) instead.
"""
from __future__ import annotations

from pipeoffload.planner.hardware import HardwareSpec


def gemm_intensity(m: float, n: float, k: float) -> float:
    """FLOPs per byte of a ``[m, k] x [k, n]`` GEMM with 2-byte elements: 2mnk / (2(mk + kn + mn))."""
    return m * n * k / (m * k + k * n + m * n)


def gemm_rate(hw: HardwareSpec, m: float, n: float, k: float) -> float:
    """Sustained FLOP/s of one ``[m, k] x [k, n]`` GEMM on ``hw``."""
    if hw.compute_model == "flat":
        return hw.flops
    intensity = gemm_intensity(m, n, k)
    return hw.peak_flops * hw.gemm_max_fraction * intensity / (intensity + hw.gemm_half_intensity)


def gemm_time(hw: HardwareSpec, m: float, n: float, k: float, count: float = 1.0) -> float:
    """Seconds for ``count`` GEMMs of that shape (2mnk FLOPs each)."""
    return count * 2.0 * m * n * k / gemm_rate(hw, m, n, k)


def elementwise_time(hw: HardwareSpec, nbytes: float) -> float:
    """Seconds to stream ``nbytes`` through HBM (LayerNorm, GeLU, softmax, dropout: memory-bound);
    zero under the flat compute model, which counts FLOPs only."""
    if hw.compute_model == "flat":
        return 0.0
    return nbytes / (hw.hbm_bandwidth * hw.hbm_efficiency)


def rate_at_intensity(hw: HardwareSpec, intensity: float) -> float:
    """The curve itself, for kernels whose traffic is not that of a plain GEMM (flash attention)."""
    if hw.compute_model == "flat":
        return hw.flops
    return hw.peak_flops * hw.gemm_max_fraction * intensity / (intensity + hw.gemm_half_intensity)
