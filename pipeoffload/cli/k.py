"""``pipeoffload k``: the offload-overhead ratio k, from the paper's Formula 1 and from the cost model."""
from __future__ import annotations

import argparse
import json

from pipeoffload.errors import ConfigError
from pipeoffload.planner.cli_args import add_hardware_args, add_model_args, hardware_from_args, model_from_args
from pipeoffload.planner.formulas import formula1_k, hideable_fraction, offload_time
from pipeoffload.planner.stagecosts import layer_costs


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("k", help="offload ratio k: (D2H + H2D) / (F + B) of one layer (Formula 1)")
    add_model_args(parser)
    add_hardware_args(parser)
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size for the cost-model k")
    parser.add_argument("--no-partial-recompute", action="store_true",
                        help="cost-model k without LGD partial recomputation (34 instead of ~20 sbh saved)")
    parser.add_argument("--shared-host-link", action="store_true",
                        help="two GPUs share one PCIe switch: with --tp > 1 the TP peer copies at the same "
                             "time, halving each GPU's link (default: every GPU has its own link)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    model, hw = model_from_args(args), hardware_from_args(args)
    if args.tp < 1 or model.heads % args.tp or model.num_kv_heads % args.tp or model.ffn_size % args.tp:
        raise ConfigError(f"--tp {args.tp}: must divide the model's heads ({model.heads}), KV heads "
                          f"({model.num_kv_heads}) and FFN width ({model.ffn_size}); use a common divisor")
    lgd = not args.no_partial_recompute
    k1 = formula1_k(model.hidden, model.seq, hw.flops, hw.offload_bandwidth)
    lc = layer_costs(model, hw, args.tp, partial_recompute=lgd)
    share = 2.0 if args.shared_host_link and hw.shares_pcie_switch and args.tp > 1 else 1.0
    copy = lc.activation_bytes * share * (1 / hw.d2h_bandwidth + 1 / hw.h2d_bandwidth)
    compute = lc.time_f + lc.time_i + lc.time_w
    k2 = copy / compute
    saved = lc.activation_bytes * args.tp / (model.tokens * model.hidden)
    if args.json:
        print(json.dumps({
            "formula1_k": k1, "offload_time": offload_time(k1), "cost_model_k": k2,
            "hidden": model.hidden, "seq": model.seq, "B_c_flops": hw.flops, "B_o_bytes_per_s": hw.offload_bandwidth,
            "saved_bytes_per_sbh": saved, "layer_compute_s": compute, "layer_copy_s": copy, "tp": args.tp,
            "gpu": hw.name, "sources": {k: hw.sources.get(k, "") for k in ("achievable_fraction", "d2h_bandwidth")},
        }, indent=1))
        return 0
    print(f"Formula 1 (paper): k = 10*B_c / (3*(6h+s)*B_o) = {k1:.2f}   (offload-time k/2 = {offload_time(k1):.3f})")
    print(f"  h={model.hidden} s={model.seq}  B_c={hw.flops / 1e12:.0f} TFLOP/s  B_o={hw.offload_bandwidth / 1e9:.0f} GB/s"
          f"  [{hw.name}: {hw.sources.get('achievable_fraction', 'given')}; {hw.sources.get('d2h_bandwidth', 'given')}]")
    how = "calibrated GEMM rate + element-wise" if hw.compute_model == "shape" else f"flat {hw.flops / 1e12:.0f} TFLOP/s"
    print(f"cost model:        k = {k2:.2f}   ({how}; {model.name}: heads={model.heads} kv={model.num_kv_heads} "
          f"ffn={model.ffn_size}{' gated' if model.gated_mlp else ''}, "
          f"{'flash' if model.flash_attention else 'unfused'} attention, {saved:.1f} sbh saved per layer"
          f"{' with LGD' if lgd else ''}, tp={args.tp})")
    print(f"  per layer and microbatch: F+I+W {compute * 1e3:.2f} ms, D2H+H2D {copy * 1e3:.2f} ms")
    print(f"share of activations one copy engine can hide: min(1, 1/k) = {hideable_fraction(k2):.0%}")
    return 0
