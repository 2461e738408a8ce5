"""The paper's PP-vs-TP question on its own setting, under the calibrated cost model.

Run: .venv/bin/python benchmarks/plan_pp_vs_tp_paper.py [--save benchmarks/results/plan_pp_vs_tp_paper.txt]

Setting (the paper's as summarised second-hand; UNVERIFIED): GPT-3-like models with grouped-query
attention (8 KV groups), 5.8-83.8B parameters, sequence 4k-32k, 8/16/32 A100-80GB in nodes of 8 over
RoCE, B_o = 15 GB/s (the a100 preset's host link), baseline interleaved 1F1B + TP8 + sequence
parallelism. The shapes are ours (the paper's are not available to us): head size 128, FFN 4h, GeLU,
vocabulary 50257, tied embeddings, flash attention, layers chosen to match the parameter count:
5.8B h4096 l32, 10.5B h5120 l38, 18.1B h6144 l46, 42.9B h8192 l62, 66.6B h10240 l62, 83.8B h10240 l78.
Network: the roce-200 preset (one 200 Gb/s NIC per GPU, UNVERIFIED). Memory budget: the whole
80 GiB (the paper's GPUs). Each row runs ``compare_tp`` twice: against tp8-interleaved and against
the best TP 2-8 plan. The sensitivity block reruns one row with single assumptions changed.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import replace

from pipeoffload.fileio import write_atomic
from pipeoffload.planner.compare_tp import Comparison, compare_tp
from pipeoffload.planner.hardware import GIB, hardware_preset
from pipeoffload.planner.model import ModelSpec
from pipeoffload.planner.plans import PlanRequest
from pipeoffload.planner.stagecosts import TrainingSetup

SHAPES = {"5.8b": (4096, 32), "10.5b": (5120, 38), "18.1b": (6144, 46), "42.9b": (8192, 62),
          "66.6b": (10240, 62), "83.8b": (10240, 78)}
ROWS = [  # model, GPUs, seq, global batch
    ("5.8b", 8, 4096, 64), ("5.8b", 8, 16384, 32), ("10.5b", 8, 8192, 32), ("18.1b", 16, 8192, 64),
    ("42.9b", 32, 4096, 128), ("66.6b", 32, 8192, 64), ("83.8b", 32, 4096, 128),
]


def model(name: str, seq: int) -> ModelSpec:
    hidden, layers = SHAPES[name]
    return ModelSpec(name=f"gqa8-{name}", layers=layers, hidden=hidden, heads=hidden // 128, kv_heads=8,
                     seq=seq, vocab=50257, tied_embeddings=True)


def request(name: str, gpus: int, seq: int, batch: int, **setup: object) -> PlanRequest:
    hw = hardware_preset("a100").with_network("roce-200")
    return PlanRequest(model=model(name, seq), hardware=hw, gpus=gpus, global_batch=batch,
                       memory_budget=hw.memory_bytes, setup=TrainingSetup(**setup))  # type: ignore[arg-type]


def _plan(p) -> str:  # type: ignore[no-untyped-def]
    if p is None:
        return "does not fit"
    c = p.choice
    g = f" g{c.group_size}" if c.group_size else ""
    return (f"{p.layout} {c.family} v{c.stages_per_rank}{g} off={c.offload} rc={c.recompute} "
            f"{p.tokens_per_second:,.0f} tok/s MFU {p.mfu:.1%} act {p.memory.activations / GIB:.1f} "
            f"total {p.memory.total / GIB:.1f} GiB")


def _ratio(c: Comparison) -> str:
    if c.speedup is None or c.pp is None or c.tp is None:
        return "   n/a"
    return f"{c.speedup - 1:+6.1%} act x{c.pp.memory.activations / max(c.tp.memory.activations, 1):.2f}"


def line(label: str, req: PlanRequest, baseline: str, match_memory: bool = False) -> list[str]:
    start = time.perf_counter()
    c = compare_tp(req, baseline, match_memory)
    how = " (PP activations <= TP's)" if match_memory else ""
    return [f"{label} vs {baseline}{how}: PP+offload/TP {_ratio(c)}  ({time.perf_counter() - start:.0f} s)",
            f"    PP : {_plan(c.pp)}", f"    TP : {_plan(c.tp)}"]


def sensitivity(row: int) -> list[str]:
    """Rerun one row against tp8-interleaved with single assumptions changed."""
    name, gpus, seq, batch = ROWS[row]
    lines = ["", f"# sensitivity on {name} s={seq} {gpus} GPUs batch {batch}, vs tp8-interleaved"]
    base = request(name, gpus, seq, batch)
    hw = base.hardware
    cases = [("as above", base),
             ("flat B_c = 220 TFLOP/s (no GEMM-shape or element-wise cost)",
              replace(base, hardware=hw.override(compute_model="flat"))),
             ("no LGD partial recomputation", request(name, gpus, seq, batch, partial_recompute=False)),
             ("host link shared, alternating slots", request(name, gpus, seq, batch, host_link="alternating")),
             ("host link shared, serialized", request(name, gpus, seq, batch, host_link="serialized")),
             ("InfiniBand HDR instead of RoCE", replace(base, hardware=hw.with_network("ib-hdr"))),
             ("RoCE at 100 Gb/s per GPU", replace(base, hardware=hw.with_network("roce-100"))),
             (f"global batch {2 * batch}", request(name, gpus, seq, 2 * batch)),
             (f"global batch {4 * batch}", request(name, gpus, seq, 4 * batch))]
    for label, req in cases:
        lines += line(label, req, "tp8-interleaved")
        print("\n".join(lines[-3:]), flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", help="also write the report to this file")
    parser.add_argument("--rows", type=int, default=len(ROWS), help="only the first N rows")
    parser.add_argument("--sensitivity", type=int, action="append", default=None, metavar="ROW",
                        help="only the sensitivity runs of ROW (0-based; repeatable)")
    args = parser.parse_args()
    lines = ["# plan_pp_vs_tp_paper: PP + offload (TP1) vs TP on the paper's setting (calibrated a100, roce-200)"]
    if args.sensitivity is None:
        for name, gpus, seq, batch in ROWS[: args.rows]:
            req = request(name, gpus, seq, batch)
            label = f"{name} s={seq} {gpus} GPUs batch {batch} ({req.model.total_params() / 1e9:.1f}B)"
            for baseline, match in (("tp8-interleaved", False), ("tp8-interleaved", True), ("best", False)):
                lines += line(label, req, baseline, match)
                print("\n".join(lines[-3:]), flush=True)
    for row in args.sensitivity if args.sensitivity is not None else [3]:
        lines += sensitivity(row)
    if args.save:
        write_atomic(args.save, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
