"""Is a loss difference on CUDA ours or the GPU's? The same Llama training (bf16 autocast, one rank,
interleaved 1F1B over 2 stages, ``gpu_check.train_once``) twice with offload none, then once with
offload all; first with torch's defaults, then with ``torch.use_deterministic_algorithms(True,
warn_only=True)`` and a fixed cuBLAS workspace but the fused attention kernels still on. Prints the
losses of each run and whether the pairs are equal.

Both blocks differing is why ``train --deterministic`` (``train.launch.deterministic_kernels``) also
turns the fused attention kernels off: deterministic algorithms alone leave their backward varying.
gpu_check's "deterministic kernels" row runs the same comparison with that context, equal.

    PYTHONPATH=. python3 benchmarks/gpu_determinism.py    # on a CUDA machine; elsewhere it says so
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_check as g  # noqa: E402
import torch  # noqa: E402

SIZE = g.TrainSize(hidden=1024, heads=16, layers=4, seq=1024, vocab=32000, batch=16, microbatches=8, steps=3,
                   warmup=1, dtype="bfloat16", model="llama")


def losses(offload: str) -> list[float]:
    return g.train_once(SIZE, offload, "cuda")["losses"]


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_determinism needs CUDA (torch.cuda.is_available() is False here): nothing run")
        return 0
    for deterministic in (False, True):
        torch.use_deterministic_algorithms(deterministic, warn_only=True)
        a, b, c = losses("none"), losses("none"), losses("all")
        print(f"deterministic={deterministic}: none==none {a == b}  none==all {a == c}")
        print("  none ", a, "\n  none ", b, "\n  all  ", c)
    return 0


if __name__ == "__main__":
    sys.exit(main())
