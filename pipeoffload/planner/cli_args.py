"""Flags that describe a model and a GPU, shared by ``pipeoffload k`` and ``pipeoffload plan``."""
from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

from pipeoffload.errors import ConfigError
from pipeoffload.planner.hardware import (
    GB,
    NETWORK_PRESETS,
    HardwareSpec,
    hardware_preset,
    hardware_values,
    load_hardware,
)
from pipeoffload.planner.model import ModelSpec
from pipeoffload.planner.presets import MODEL_PRESETS, model_preset

DEFAULT_LAYERS = 1  # a shape given by flags alone, without --layers (``k`` needs none)
DEFAULT_HEAD_WIDTH = 128  # heads = hidden / this without --heads or --head-dim


def _spec_default(name: str) -> object:
    """``ModelSpec``'s own default of field ``name``: the one place the help reads it from."""
    return next(f.default for f in fields(ModelSpec) if f.name == name)


# the shape flags and their help (unit and default); ``--X`` sets ModelSpec's field X (microbatch_size:
# microbatch) over a preset's or hf:DIR's value. The defaults shown are ModelSpec's or model_from_args'.
SHAPE_HELP = {
    "layers": f"transformer layers (default: the preset's; else {DEFAULT_LAYERS})",
    "hidden": "hidden size h, in elements (default: the preset's; needed without --model)",
    "heads": f"attention heads (default: the preset's; else hidden / --head-dim, without it hidden / "
             f"{DEFAULT_HEAD_WIDTH}: one head below a hidden size of {DEFAULT_HEAD_WIDTH})",
    "kv_heads": "key/value heads of grouped-query attention (default: the preset's; else = heads, multi-head)",
    "ffn": "MLP hidden size, in elements (default: the preset's; else 4 x hidden)",
    "seq": "sequence length s, in tokens (default: the preset's; needed without --model)",
    "vocab": f"vocabulary size, in tokens (default: the preset's; else {_spec_default('vocab')}, GPT-2's)",
    "microbatch_size": f"sequences per microbatch b (default: the preset's; else {_spec_default('microbatch')})",
}
_SHAPE_FLAGS = tuple(SHAPE_HELP)


def add_model_args(parser: argparse.ArgumentParser, *, require_shape: bool = False) -> None:
    group = parser.add_argument_group("model")
    group.add_argument("--model", help=f"preset: {', '.join(MODEL_PRESETS)}; or hf:DIR, the shape in a local "
                                       "Hugging Face directory's config.json (flags below override it; default: "
                                       "none, a GPT-shaped model of the flags below)")
    for flag, text in SHAPE_HELP.items():
        group.add_argument("--" + flag.replace("_", "-"), type=int, default=None, metavar="N", help=text)
    group.add_argument("--head-dim", type=int, default=None, metavar="N",
                       help="width of one attention head, in elements (default: the preset's, else hidden / "
                            "heads); the attention width heads x head-dim may differ from hidden (Mistral-Nemo)")
    group.add_argument("--no-flash", action="store_true",
                       help="unfused attention (adds the 5*a*s^2*b term; default: fused, flash attention)")
    group.add_argument("--gated-mlp", action=argparse.BooleanOptionalAction, default=None,
                       help="SwiGLU MLP (default: the preset's; GPT-style GeLU without a preset)")
    group.add_argument("--tied-embeddings", action=argparse.BooleanOptionalAction, default=None,
                       help="the head shares the embedding's weights (default: the preset's; untied without "
                            "one): one copy of the weights, plus the copies' gradient all-reduce between the "
                            "first and the last stage")


def add_hardware_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("hardware")
    group.add_argument("--gpu", default="a100", help="preset: a100, h100, h200, gh200 (default %(default)s)")
    group.add_argument("--hardware-file", metavar="TOML",
                       help="TOML with HardwareSpec fields (may name a preset; default: none, the --gpu preset)")
    group.add_argument("--flops", type=float, metavar="TFLOPS",
                       help="sustained TFLOP/s for every FLOP (the paper's B_c; replaces the calibrated "
                            "shape-dependent GEMM rate; default: that calibrated rate)")
    group.add_argument("--network", metavar="NAME",
                       help=f"inter-node network preset: {', '.join(NETWORK_PRESETS)} (default: the GPU's)")
    group.add_argument("--offload-bw", type=float, metavar="GBPS",
                       help="host link bandwidth B_o, in GB/s each way (default: the GPU's)")
    group.add_argument("--hw", action="append", default=[], metavar="FIELD=VALUE",
                       help="override any hardware field, e.g. --hw nvlink_gbps=300 --hw memory_gib=94 (repeatable; "
                            "default: none)")


def model_from_args(args: argparse.Namespace) -> ModelSpec:
    """A preset or ``hf:DIR`` with overrides, or a GPT-shaped model (head size 128, FFN 4h) built from the
    flags; ``--head-dim`` sets the head width (without ``--heads``, heads = hidden / head-dim)."""
    given = {k: getattr(args, k) for k in _SHAPE_FLAGS if getattr(args, k) is not None}
    if "microbatch_size" in given:
        given["microbatch"] = given.pop("microbatch_size")
    head_dim = getattr(args, "head_dim", None)
    if head_dim is not None:
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1:
            raise ConfigError(f"--head-dim {head_dim}: must be a whole number >= 1 (the width of one attention "
                              "head, e.g. 128); leave it out for hidden / heads")
        given["head_size"] = head_dim
    if args.model and args.model.startswith("hf:"):
        from pipeoffload.planner.hfconfig import model_from_hf_config

        spec = model_from_hf_config(Path(args.model[3:]).expanduser()).with_(**given)
    elif args.model:
        spec = model_preset(args.model).with_(**given)
    else:
        missing = [f"--{k}" for k in ("hidden", "seq") if k not in given]
        if missing:
            raise ConfigError(f"no --model preset and no {' '.join(missing)}: give a preset or the model's shape")
        hidden = given["hidden"]
        if "heads" not in given:
            given["heads"] = _default_heads(hidden, head_dim)
        given.setdefault("layers", DEFAULT_LAYERS)
        spec = ModelSpec(name=f"gpt-h{hidden}", **given)
    if spec.head_size is not None and spec.head_size * spec.heads == spec.hidden:
        spec = spec.with_(head_size=None)  # the default width, said explicitly: the same model
    return with_model_switches(spec, args)


def _default_heads(hidden: int, head_dim: int | None) -> int:
    """Heads of a model given without ``--heads``: hidden / head width (``--head-dim``, else 128; a hidden
    below 128 without ``--head-dim`` is one head). A width that does not divide hidden is refused, not rounded."""
    width = head_dim or DEFAULT_HEAD_WIDTH
    if head_dim is None and hidden < width:
        return 1
    if hidden % width:
        flag = f"--head-dim {head_dim}" if head_dim else f"the default head width {DEFAULT_HEAD_WIDTH}"
        raise ConfigError(f"--hidden {hidden} is not a multiple of {flag}; give --heads N, or a --head-dim that "
                          "divides --hidden")
    return hidden // width


def with_model_switches(spec: ModelSpec, args: argparse.Namespace) -> ModelSpec:
    """``spec`` with the switches ``--no-flash`` and ``--gated-mlp/--no-gated-mlp`` applied."""
    if args.no_flash:
        spec = spec.with_(flash_attention=False)
    if args.gated_mlp is not None:
        spec = spec.with_(gated_mlp=args.gated_mlp)
    if args.tied_embeddings is not None:
        spec = spec.with_(tied_embeddings=args.tied_embeddings)
    return spec


def hardware_from_args(args: argparse.Namespace) -> HardwareSpec:
    spec = hardware_preset(args.gpu)
    if args.hardware_file:
        spec = load_hardware(args.hardware_file, base=spec)
    overrides: dict[str, object] = {}
    for item in args.hw:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--hw {item!r}: expected FIELD=VALUE, e.g. --hw d2h_gbps=25")
        overrides[key.strip()] = value.strip()
    # each value parsed as its field's type: shares_pcie_switch=no is false, d2h_gbps=fast is refused
    values = hardware_values(overrides, lambda key, value: f"--hw {key}={value}")
    network = getattr(args, "network", None)
    if network and "network" in values and str(values["network"]).lower() != network.lower():
        raise ConfigError(f"--network {network} and --hw network={values['network']} disagree; give one of them")
    if args.flops is not None:  # the paper's B_c: every FLOP at this sustained rate (flat compute model)
        sustained = args.flops * 1e12
        peak = float(values.get("peak_flops", spec.peak_flops))  # type: ignore[arg-type]
        if not 0 < sustained <= peak:
            raise ConfigError(f"--flops {args.flops:g}: the sustained rate must be > 0 and at most the "
                              f"{spec.name}'s peak {peak / 1e12:g} TFLOP/s; give a lower --flops or another "
                              "peak with --hw peak_tflops=...")
        values["achievable_fraction"], values["compute_model"] = sustained / peak, "flat"
    if args.offload_bw is not None:
        if not args.offload_bw > 0:
            raise ConfigError(f"--offload-bw {args.offload_bw:g}: must be > 0 GB/s")
        values["d2h_bandwidth"] = values["h2d_bandwidth"] = args.offload_bw * GB
    if network:
        spec = spec.with_network(network)
    try:
        return spec.override(**values) if values else spec
    except ConfigError as err:
        given = [f"--hw {item}" for item in args.hw]
        raise ConfigError(f"{' '.join(given)}: {err}" if given else str(err)) from None
