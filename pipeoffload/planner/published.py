"""Best published training efficiency per GPU and model class: a sanity bound on predictions.

A prediction above every published system on the same GPU and model class is more likely a modelling
gap than a discovery, so ``plan`` and ``estimate`` warn when they predict it. Figures are model FLOPs
utilisation (no recomputation counted) as each paper reports it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from pipeoffload.planner.hardware import HARDWARE_PRESETS, HardwareSpec
from pipeoffload.planner.model import ModelSpec


@dataclass(frozen=True)
class Published:
    gpu: str  # hardware preset name: the figure holds for any GPU with that preset's peak FLOP/s
    min_params: float  # model class: dense decoder-only transformers of at least this many parameters
    mfu: float
    source: str


BEST_PUBLISHED = (
    Published("a100", 100e9, 0.552, "MegaScale (Jiang et al. 2024): 175B on A100s, 55.2% MFU"),
    Published("a100", 10e9, 0.552, "MegaScale (Jiang et al. 2024): 175B on A100s, 55.2% MFU; Korthikanti "
                                   "et al. 2022 Table 5: 22B 41.5%, 175B 51.4%"),
    Published("a100", 0.0, 0.72, "FlashAttention-2 (Dao 2023): GPT-style 1.3B/2.7B on 8 A100s, 72% MFU"),
    # the H100 chip's peak: H200 and GH200 share it (same_gpu)
    Published("h100", 2e9, 0.47, "Megatron-LM's README (NVIDIA): models of 2B to 462B on H100 clusters, up to "
                                 "47% MFU (seq 4096); Llama 3 405B (Dubey et al. 2024): 38-43%"),
)


def same_gpu(hw: HardwareSpec, preset: str) -> bool:
    """Whether ``hw`` is the GPU of ``preset``: the same datasheet peak FLOP/s (what MFU is a share of),
    whatever its display name (``--hw name=my-a100``, a hardware file built on the preset or giving its
    ``peak_tflops``; an A100 40 GB too, as the same chip)."""
    return math.isclose(hw.peak_flops, HARDWARE_PRESETS[preset].peak_flops, rel_tol=1e-3)


def best_published(hw: HardwareSpec, model: ModelSpec) -> Published | None:
    """The best published figure for this GPU and model size class, if we know one."""
    params = model.total_params()
    found = [p for p in BEST_PUBLISHED if same_gpu(hw, p.gpu) and params >= p.min_params]
    return max(found, key=lambda p: p.min_params) if found else None


def mfu_warning(hw: HardwareSpec, model: ModelSpec, mfu: float) -> str | None:
    """One line when ``mfu`` is above the best published figure for the GPU and model class."""
    best = best_published(hw, model)
    if best is None or mfu <= best.mfu:
        return None
    return (f"predicted MFU {mfu:.1%} is above the best published {best.mfu:.1%} for this GPU and model class "
            f"({best.source}); treat it as an upper bound (docs/planner.md, 'Flash attention')")
