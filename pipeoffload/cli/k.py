"""``pipeoffload k``: the offload-overhead ratio k, from the paper's Formula 1 and from the cost model."""
from __future__ import annotations

import argparse

from pipeoffload.cli.common import model_and_hardware, positive_int
from pipeoffload.planner.cli_args import add_hardware_args, add_model_args
from pipeoffload.planner.formulas import hideable_fraction
from pipeoffload.service import OffloadRatioRequest, OffloadRatioResult, offload_ratio, strict_json
from pipeoffload.service.argtypes import default_of


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("k", help="offload ratio k: (D2H + H2D) / (F + B) of one layer (Formula 1)")
    add_model_args(parser)
    add_hardware_args(parser)
    parser.add_argument("--tp", type=positive_int, default=default_of(OffloadRatioRequest, "tp"),
                        help="tensor-parallel size for the cost-model k, in GPUs (default %(default)s)")
    parser.add_argument("--no-partial-recompute", action="store_true",
                        help="cost-model k without LGD partial recomputation (34 instead of ~20 sbh saved)")
    parser.add_argument("--shared-host-link", action="store_true",
                        help="two GPUs share one PCIe switch: with --tp > 1 the TP peer copies at the same "
                             "time, halving each GPU's link (default: every GPU has its own link)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    model, hardware = model_and_hardware(args)
    result = offload_ratio(OffloadRatioRequest(
        model, hardware, tp=args.tp, partial_recompute=not args.no_partial_recompute,
        shared_host_link=args.shared_host_link))
    if args.json:
        print(strict_json(result.as_dict(), indent=1))
    else:
        print(format_result(result))
    return 0


def format_result(result: OffloadRatioResult) -> str:
    req = result.request
    model, hw, k1, k2 = req.model, req.hardware, result.formula1_k, result.cost_model_k
    how = "calibrated GEMM rate + element-wise" if hw.compute_model == "shape" else f"flat {hw.flops / 1e12:.0f} TFLOP/s"
    return "\n".join([
        f"Formula 1 (paper): k = 10*B_c / (3*(6h+s)*B_o) = {k1:.2f}   (offload-time k/2 = {result.offload_time:.3f})",
        f"  h={model.hidden} s={model.seq}  B_c={hw.flops / 1e12:.0f} TFLOP/s  B_o={hw.offload_bandwidth / 1e9:.0f} GB/s"
        f"  [{hw.name}: B_c {hw.sources.get('achievable_fraction', 'given')}; B_o {hw.sources.get('d2h_bandwidth', 'given')}]",
        f"cost model:        k = {k2:.2f}   ({how}; {model.name}: heads={model.heads} kv={model.num_kv_heads} "
        f"ffn={model.ffn_size}{' gated' if model.gated_mlp else ''}, "
        f"{'flash' if model.flash_attention else 'unfused'} attention, {result.saved_bytes_per_sbh:.1f} sbh saved "
        f"per layer{' with LGD' if req.partial_recompute else ''}, tp={req.tp})",
        f"  per layer and microbatch: F+I+W {result.layer_compute_s * 1e3:.2f} ms, "
        f"D2H+H2D {result.layer_copy_s * 1e3:.2f} ms",
        f"share of activations one copy engine can hide: min(1, 1/k) = {hideable_fraction(k2):.0%}",
    ])
