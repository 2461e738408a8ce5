"""Accelerator descriptions: memory, achievable compute, host link, NVLink and network bandwidth.

Every preset field says where it comes from in ``HardwareSpec.sources``. Where the reference
implementation profiled a constant (its GPU table: A100 220 TFLOP/s and 15 GB/s, H100 440 TFLOP/s and
21 GB/s), that constant is the default; other GPUs inherit the closest profiled value and say so.
Presets can be overridden field by field, from the CLI or from a TOML file (``load_hardware``).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import tomllib

from pipeoffload.errors import ConfigError

GIB = 1024**3
GB = 1e9


@dataclass(frozen=True, kw_only=True)
class HardwareSpec:
    """One accelerator and its links. Bandwidths are per GPU and per direction, in bytes/s."""

    name: str = "custom"
    memory_bytes: float
    peak_flops: float  # dense bf16/fp16 tensor-core FLOP/s from the datasheet
    achievable_fraction: float  # sustained training throughput / peak
    d2h_bandwidth: float
    h2d_bandwidth: float
    shares_pcie_switch: bool = False  # GPUs 2p and 2p+1 share one host link (per direction)
    nvlink_bandwidth: float = 200 * GB  # achievable collective bus bandwidth inside a node
    internode_bandwidth: float = 25 * GB  # network bandwidth per GPU
    hbm_bandwidth: float = 2.0e12
    gpus_per_node: int = 8
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        for key in ("memory_bytes", "peak_flops", "d2h_bandwidth", "h2d_bandwidth", "nvlink_bandwidth",
                    "internode_bandwidth", "hbm_bandwidth"):
            value = getattr(self, key)
            if not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"hardware {key}={value!r}: must be a positive number")
        if not 0 < self.achievable_fraction <= 1:
            raise ConfigError(f"hardware achievable_fraction={self.achievable_fraction!r}: must be in (0, 1]")
        if not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 1:
            raise ConfigError(f"hardware gpus_per_node={self.gpus_per_node!r}: must be an integer >= 1")

    @property
    def flops(self) -> float:
        """Sustained FLOP/s used for compute times (the paper's B_c)."""
        return self.peak_flops * self.achievable_fraction

    @property
    def offload_bandwidth(self) -> float:
        """The paper's B_o: one-way host-link bandwidth of one GPU (the slower direction)."""
        return min(self.d2h_bandwidth, self.h2d_bandwidth)

    def collective_bandwidth(self, group: int, span: int) -> float:
        """Bus bandwidth of a collective over ``group`` ranks placed ``span`` consecutive GPUs apart."""
        return self.nvlink_bandwidth if group * span <= self.gpus_per_node else self.internode_bandwidth

    def override(self, **changes: Any) -> HardwareSpec:
        """A copy with some fields replaced; each replaced field's source becomes "user override"."""
        given = {k: v for k, v in changes.items() if v is not None}
        unknown = sorted(set(given) - _FIELDS)
        if unknown:
            raise ConfigError(f"unknown hardware field(s) {', '.join(unknown)}; valid: {', '.join(sorted(_FIELDS))}")
        sources = dict(self.sources)
        sources.update({k: "user override" for k in given if k != "name"})
        return replace(self, sources=sources, **given)

    def as_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "sources"}
        out["sources"] = dict(self.sources)
        return out


_FIELDS = {f.name for f in dataclasses.fields(HardwareSpec)} - {"sources"}

_REF = "reference implementation's profiled constant (zbpp_utils get_gpu_flops_and_offload_bandwidth)"
_A100_SOURCES = {
    "memory_bytes": "datasheet: 80 GB HBM2e (nvidia-smi: 81920 MiB)",
    "peak_flops": "datasheet: 312 TFLOP/s dense BF16",
    "achievable_fraction": f"220/312: {_REF}",
    "d2h_bandwidth": f"15 GB/s: {_REF}",
    "h2d_bandwidth": f"15 GB/s: {_REF}",
    "shares_pcie_switch": "DGX/HGX A100: two GPUs behind each PCIe Gen4 switch",
    "nvlink_bandwidth": "NVLink3 300 GB/s per direction; ~230 GB/s all-reduce bus bandwidth (typical nccl-tests)",
    "internode_bandwidth": "one 200 Gb/s HDR NIC per GPU = 25 GB/s",
    "hbm_bandwidth": "datasheet: 2039 GB/s",
}
_H100_SOURCES = {
    "memory_bytes": "datasheet: 80 GB HBM3 (nvidia-smi: 81559 MiB)",
    "peak_flops": "datasheet: 989 TFLOP/s dense BF16 (SXM)",
    "achievable_fraction": f"440/989: {_REF}",
    "d2h_bandwidth": f"21 GB/s: {_REF} (one copy stream; could be ~2x with both directions)",
    "h2d_bandwidth": f"21 GB/s: {_REF}",
    "shares_pcie_switch": "assumed like DGX A100 (two GPUs per PCIe switch); UNVERIFIED for each HGX H100 board",
    "nvlink_bandwidth": "NVLink4 450 GB/s per direction; ~360 GB/s all-reduce bus bandwidth assumed",
    "internode_bandwidth": "one 400 Gb/s NDR NIC per GPU = 50 GB/s",
    "hbm_bandwidth": "datasheet: 3350 GB/s",
}


def _preset(name: str, sources: dict[str, str], **values: Any) -> HardwareSpec:
    return HardwareSpec(name=name, sources=sources, **values)


HARDWARE_PRESETS: dict[str, HardwareSpec] = {
    h.name: h
    for h in (
        _preset("a100", _A100_SOURCES, memory_bytes=80 * GIB, peak_flops=312e12, achievable_fraction=220 / 312,
                d2h_bandwidth=15 * GB, h2d_bandwidth=15 * GB, shares_pcie_switch=True,
                nvlink_bandwidth=230 * GB, internode_bandwidth=25 * GB, hbm_bandwidth=2039 * GB),
        _preset("h100", _H100_SOURCES, memory_bytes=81559 * 2**20, peak_flops=989e12,
                achievable_fraction=440 / 989, d2h_bandwidth=21 * GB, h2d_bandwidth=21 * GB,
                shares_pcie_switch=True, nvlink_bandwidth=360 * GB, internode_bandwidth=50 * GB,
                hbm_bandwidth=3350 * GB),
        _preset("h200", {**_H100_SOURCES,
                         "memory_bytes": "datasheet: 141 GB HBM3e (nvidia-smi: 143771 MiB)",
                         "achievable_fraction": f"H100's 440/989 (same compute die; {_REF} for H100)",
                         "d2h_bandwidth": "H100's 21 GB/s (same PCIe Gen5 host link; not profiled on H200)",
                         "h2d_bandwidth": "H100's 21 GB/s (same PCIe Gen5 host link; not profiled on H200)",
                         "hbm_bandwidth": "datasheet: 4800 GB/s"},
                memory_bytes=143771 * 2**20, peak_flops=989e12, achievable_fraction=440 / 989,
                d2h_bandwidth=21 * GB, h2d_bandwidth=21 * GB, shares_pcie_switch=True,
                nvlink_bandwidth=360 * GB, internode_bandwidth=50 * GB, hbm_bandwidth=4800 * GB),
        _preset("gh200", {**_H100_SOURCES,
                          "memory_bytes": "datasheet: 96 GB HBM3 (GH200 480GB variant)",
                          "achievable_fraction": f"H100's 440/989 (same Hopper GPU; {_REF} for H100)",
                          "d2h_bandwidth": "NVLink-C2C 450 GB/s per direction; 300 GB/s assumed achievable, "
                                           "UNVERIFIED (measure with the profiler and override)",
                          "h2d_bandwidth": "as d2h_bandwidth",
                          "shares_pcie_switch": "no: each Grace-Hopper superchip has its own C2C link",
                          "hbm_bandwidth": "datasheet: 4000 GB/s"},
                memory_bytes=96 * GB, peak_flops=989e12, achievable_fraction=440 / 989,
                d2h_bandwidth=300 * GB, h2d_bandwidth=300 * GB, shares_pcie_switch=False,
                nvlink_bandwidth=360 * GB, internode_bandwidth=50 * GB, hbm_bandwidth=4000 * GB),
    )
}
_ALIASES = {"a100-80gb": "a100", "h100-sxm": "h100", "h100sxm": "h100"}


def hardware_preset(name: str) -> HardwareSpec:
    """Case-insensitive preset lookup (also accepts e.g. ``A100-80GB`` and ``H100-SXM``)."""
    key = name.lower()
    key = _ALIASES.get(key, key)
    spec = HARDWARE_PRESETS.get(key)
    if spec is None:
        raise ConfigError(f"unknown gpu {name!r}; presets: {', '.join(HARDWARE_PRESETS)} "
                          "(or describe one in a TOML file with --hardware-file)")
    return spec


def load_hardware(path: str | Path, base: HardwareSpec | None = None) -> HardwareSpec:
    """Read a TOML file of ``HardwareSpec`` fields. ``preset = "h100"`` in the file (or ``base``) gives
    the starting point; other keys override it. Bandwidths may be given in GB/s with a ``_gbps`` suffix,
    memory in GiB as ``memory_gib`` and compute as ``peak_tflops``."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ConfigError(f"hardware file {str(path)!r}: {err}") from None
    data = dict(data.get("hardware", data))
    preset = data.pop("preset", None)
    if preset is not None:
        base = hardware_preset(str(preset))
    values = _from_friendly_units(data)
    if base is None:
        try:
            return HardwareSpec(sources={k: f"file {path}" for k in values}, **values)
        except TypeError as err:
            raise ConfigError(f"hardware file {str(path)!r}: {err}; give all fields or a preset") from None
    spec = base.override(**values)
    return replace(spec, sources={**spec.sources, **{k: f"file {path}" for k in values if k != 'name'}})


def _from_friendly_units(data: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key.endswith("_gbps"):
            out[key[: -len("_gbps")] + "_bandwidth"] = float(value) * GB
        elif key == "memory_gib":
            out["memory_bytes"] = float(value) * GIB
        elif key == "peak_tflops":
            out["peak_flops"] = float(value) * 1e12
        else:
            out[key] = value
    return out
