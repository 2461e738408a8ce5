"""Accelerator descriptions: memory, achievable compute, host link, NVLink and network bandwidth.

Every preset field says where it comes from in ``HardwareSpec.sources``. Where the reference
implementation profiled a constant (its GPU table: A100 220 TFLOP/s and 15 GB/s, H100 440 TFLOP/s and
21 GB/s), that constant is the default; other GPUs inherit the closest profiled value and say so.
Presets can be overridden field by field, from the CLI or from a TOML file (``load_hardware``).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import tomllib

from pipeoffload.errors import ConfigError
from pipeoffload.fileio import read_input_text

GIB = 1024**3
GB = 1e9
# Rates below these make a transfer or a GEMM take longer than a float can hold once summed over a step
# (``--hw internode_gbps=1e-320`` gave "dp sync inf s"); latencies above MAX_LATENCY are not latencies.
MIN_RATE = 1.0  # bytes/s or FLOP/s
MAX_LATENCY = 60.0  # seconds per message
_RATE_FIELDS = ("memory_bytes", "peak_flops", "d2h_bandwidth", "h2d_bandwidth", "nvlink_bandwidth",
                "internode_bandwidth", "hbm_bandwidth")


def gib(value: float) -> str:
    """Bytes in GiB, with two significant digits below 0.1 GiB (never "0.0" for a small model)."""
    return f"{value / GIB:.1f}" if value == 0 or value >= 0.1 * GIB else f"{value / GIB:.2g}"


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
    # ---- calibrated cost model (docs/planner.md, benchmarks/planner_accuracy.py) ------------------
    # "shape": GEMMs at a rate that depends on their per-GPU shape, element-wise kernels at HBM speed;
    # "flat": every FLOP at ``flops`` (the paper's B_c), nothing else (the model of Formula 1).
    compute_model: str = "flat"
    gemm_max_fraction: float = 0.75  # of peak, for a GEMM of unbounded size
    gemm_half_intensity: float = 150.0  # FLOP per byte at which a GEMM runs at half that rate
    hbm_efficiency: float = 0.8  # achievable fraction of hbm_bandwidth for element-wise kernels
    nvlink_latency: float = 15e-6  # seconds per collective or transfer inside a node
    network: str = "ib-hdr"  # name of the inter-node network (see NETWORK_PRESETS)
    internode_latency: float = 10e-6  # seconds per inter-node transfer or collective step
    # fused (flash) attention's forward rate as a fraction of peak; None: the GEMM curve at the kernel's
    # intensity (an assumption: docs/planner.md, "Flash attention"; FlashAttention-2 reports 50-73%)
    flash_fraction: float | None = None
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        for key in _RATE_FIELDS:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"hardware {key}={value!r}: must be a positive number")
            if not math.isfinite(value):
                raise ConfigError(f"hardware {key}={value!r}: must be a finite number")
            if value < MIN_RATE:
                shown = f"{value / GB:g} GB/s" if key.endswith("_bandwidth") else f"{value:g}"
                raise ConfigError(f"hardware {key}={shown}: below {MIN_RATE:g} per second, times overflow to infinity; give the "
                                  f"real {key.replace('_bandwidth', ' bandwidth').replace('_', ' ')}")
        if not isinstance(self.shares_pcie_switch, bool):
            raise ConfigError(f"hardware shares_pcie_switch={self.shares_pcie_switch!r}: must be true or false")
        if not 0 < self.achievable_fraction <= 1:
            raise ConfigError(f"hardware achievable_fraction={self.achievable_fraction!r}: must be in (0, 1]")
        if not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 1:
            raise ConfigError(f"hardware gpus_per_node={self.gpus_per_node!r}: must be an integer >= 1")
        if self.compute_model not in ("shape", "flat"):
            raise ConfigError(f"hardware compute_model={self.compute_model!r}: must be 'shape' or 'flat'")
        for key in ("gemm_max_fraction", "hbm_efficiency"):
            if not 0 < getattr(self, key) <= 1:
                raise ConfigError(f"hardware {key}={getattr(self, key)!r}: must be in (0, 1]")
        if self.flash_fraction is not None and not 0 < self.flash_fraction <= 1:
            raise ConfigError(f"hardware flash_fraction={self.flash_fraction!r}: must be in (0, 1] or unset")
        for key in ("gemm_half_intensity", "nvlink_latency", "internode_latency"):
            if not getattr(self, key) >= 0 or not math.isfinite(getattr(self, key)):
                raise ConfigError(f"hardware {key}={getattr(self, key)!r}: must be a finite number >= 0")
        for key in ("nvlink_latency", "internode_latency"):
            if getattr(self, key) > MAX_LATENCY:
                raise ConfigError(f"hardware {key}={getattr(self, key)!r}: seconds per message, at most "
                                  f"{MAX_LATENCY:g}; give the link's latency in seconds (e.g. 1e-05)")

    @property
    def flops(self) -> float:
        """Sustained FLOP/s used for compute times (the paper's B_c)."""
        return self.peak_flops * self.achievable_fraction

    @property
    def offload_bandwidth(self) -> float:
        """The paper's B_o: one-way host-link bandwidth of one GPU (the slower direction)."""
        return min(self.d2h_bandwidth, self.h2d_bandwidth)

    def within_node(self, group: int, span: int) -> bool:
        return group * span <= self.gpus_per_node

    def collective_bandwidth(self, group: int, span: int) -> float:
        """Peak bus bandwidth of a collective over ``group`` ranks placed ``span`` consecutive GPUs apart.

        Inside a node: NVLink. Across nodes NCCL runs one ring per NIC, so a group with ``n`` members in
        each node moves data through ``n`` NICs per node: ``n`` x the per-GPU network bandwidth, at most
        NVLink's (e.g. DP over 4 DGX A100 with all 8 GPUs of each node in the group: ~200 GB/s; DP
        across TP8 nodes, one member per node: one NIC, 25 GB/s)."""
        if self.within_node(group, span):
            return self.nvlink_bandwidth
        members_per_node = max(1, self.gpus_per_node // span) if span < self.gpus_per_node else 1
        return min(self.nvlink_bandwidth, self.internode_bandwidth * members_per_node)

    def collective_latency(self, group: int, span: int) -> float:
        return self.nvlink_latency if self.within_node(group, span) else self.internode_latency

    def collective_time(self, nbytes: float, group: int, span: int = 1) -> float:
        """All-gather or reduce-scatter of a ``nbytes`` tensor (the gathered size) over ``group`` ranks:
        latency + (group - 1) / group x bytes / bus bandwidth (the nccl-tests definition of bus
        bandwidth). Larger messages get closer to the peak bandwidth; an all-reduce is two of these."""
        if group <= 1:
            return 0.0
        return (self.collective_latency(group, span)
                + (group - 1) / group * nbytes / self.collective_bandwidth(group, span))

    def p2p_time(self, nbytes: float, within_node: bool) -> float:
        """One point-to-point transfer between pipeline neighbours: latency + bytes / link bandwidth."""
        if within_node:
            return self.nvlink_latency + nbytes / self.nvlink_bandwidth
        return self.internode_latency + nbytes / self.internode_bandwidth

    def with_network(self, name: str) -> HardwareSpec:
        """A copy whose inter-node links are those of a ``NETWORK_PRESETS`` entry."""
        net = NETWORK_PRESETS.get(name.lower())
        if net is None:
            raise ConfigError(f"unknown network {name!r}; presets: {', '.join(NETWORK_PRESETS)}")
        sources = dict(self.sources)
        sources.update({"network": net.source, "internode_bandwidth": net.source,
                        "internode_latency": net.source})
        return replace(self, network=net.name, internode_bandwidth=net.bandwidth,
                       internode_latency=net.latency, sources=sources)

    def override(self, **changes: Any) -> HardwareSpec:
        """A copy with some fields replaced; each replaced field's source becomes "user override".
        ``network`` applies that ``NETWORK_PRESETS`` entry's links (as ``with_network``; a bandwidth or
        latency given alongside it wins), never only its name."""
        given = {k: v for k, v in changes.items() if v is not None}
        unknown = sorted(set(given) - _FIELDS)
        if unknown:
            raise ConfigError(f"unknown hardware field(s) {', '.join(unknown)}; valid: {', '.join(sorted(_FIELDS))}")
        base = self
        if "network" in given:
            base = self.with_network(str(given.pop("network")))
        sources = dict(base.sources)
        sources.update({k: "user override" for k in given if k != "name"})
        return replace(base, sources=sources, **given)

    def as_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "sources"}
        out["sources"] = dict(self.sources)
        return out


_FIELDS = {f.name for f in dataclasses.fields(HardwareSpec)} - {"sources"}


@dataclass(frozen=True)
class Network:
    """Inter-node links of one GPU: achievable bandwidth per GPU (one direction) and latency."""

    name: str
    bandwidth: float
    latency: float
    source: str


NETWORK_PRESETS: dict[str, Network] = {n.name: n for n in (
    Network("ib-hdr", 23 * GB, 10e-6, "one 200 Gb/s HDR InfiniBand NIC per GPU (DGX A100): 25 GB/s line rate, "
            "~23 GB/s achievable (~92%, ib_write_bw-class); ~10 us per message (assumed)"),
    Network("ib-ndr", 46 * GB, 10e-6, "one 400 Gb/s NDR InfiniBand NIC per GPU (DGX H100): 50 GB/s line rate, "
            "~46 GB/s achievable (assumed ~92%); ~10 us per message (assumed)"),
    Network("roce-200", 21 * GB, 20e-6, "one 200 Gb/s RoCE v2 NIC per GPU: 25 GB/s line rate, ~21 GB/s "
            "achievable (assumed ~85%: RoCE congestion control); ~20 us per message (assumed). UNVERIFIED"),
    Network("roce-100", 10.5 * GB, 20e-6, "one 100 Gb/s RoCE v2 NIC per GPU: 12.5 GB/s line rate, ~10.5 GB/s "
            "achievable (assumed ~85%); ~20 us per message (assumed). UNVERIFIED"),
)}

_FIT = ("fitted on Korthikanti et al. 2022 Table 4 (22B layer, TP8, sequence parallel: forward 7.2 ms, "
        "forward+backward 19.0 ms); checked on held-out rows, benchmarks/planner_accuracy.py")
_REF = "reference implementation's profiled constant (zbpp_utils get_gpu_flops_and_offload_bandwidth)"
_A100_SOURCES = {
    "memory_bytes": "datasheet: 80 GB HBM2e (nvidia-smi: 81920 MiB)",
    "peak_flops": "datasheet: 312 TFLOP/s dense BF16",
    "achievable_fraction": f"220/312: {_REF}",
    "d2h_bandwidth": f"15 GB/s: {_REF}",
    "h2d_bandwidth": f"15 GB/s: {_REF}",
    "shares_pcie_switch": "DGX/HGX A100: two GPUs behind each PCIe Gen4 switch",
    "nvlink_bandwidth": "NVLink3 300 GB/s per direction; ~200 GB/s bus bandwidth measured by nccl-tests on "
                        "8 x A100 (NVIDIA/nccl-tests issue #149)",
    "internode_bandwidth": NETWORK_PRESETS["ib-hdr"].source,
    "hbm_bandwidth": "datasheet: 2039 GB/s",
    "compute_model": "calibrated (benchmarks/planner_accuracy.py)",
    "gemm_max_fraction": _FIT,
    "gemm_half_intensity": _FIT,
    "hbm_efficiency": "~80% of the datasheet HBM bandwidth for streaming kernels (assumed, STREAM-class)",
    "nvlink_latency": "~15 us per NCCL collective of a few KiB on 8 x A100 (assumed, nccl-tests small sizes)",
}
_H100_SOURCES = {
    "memory_bytes": "datasheet: 80 GB HBM3 (nvidia-smi: 81559 MiB)",
    "peak_flops": "datasheet: 989 TFLOP/s dense BF16 (SXM)",
    "achievable_fraction": f"440/989: {_REF}",
    "d2h_bandwidth": f"21 GB/s: {_REF} (one copy stream; could be ~2x with both directions)",
    "h2d_bandwidth": f"21 GB/s: {_REF}",
    "shares_pcie_switch": "assumed like DGX A100 (two GPUs per PCIe switch); UNVERIFIED for each HGX H100 board",
    "nvlink_bandwidth": "NVLink4 450 GB/s per direction; ~360 GB/s all-reduce bus bandwidth assumed",
    "internode_bandwidth": NETWORK_PRESETS["ib-ndr"].source,
    "hbm_bandwidth": "datasheet: 3350 GB/s",
    "compute_model": "the A100 calibration transferred (UNVERIFIED: no published per-layer H100 measurement used)",
    "gemm_max_fraction": "A100 fit x (440/989) / (220/312): the reference's profiled H100/A100 ratio of "
                         "sustained to peak (UNVERIFIED)",
    "gemm_half_intensity": "A100 fit x the ratio of ridge points (peak / HBM bandwidth), UNVERIFIED",
    "hbm_efficiency": "~80% of the datasheet HBM bandwidth (assumed)",
    "nvlink_latency": "~15 us per collective (assumed as A100)",
}


def _preset(name: str, sources: dict[str, str], **values: Any) -> HardwareSpec:
    return HardwareSpec(name=name, sources=sources, **values)


# Fitted by ``benchmarks/planner_accuracy.py --fit`` on Korthikanti et al. 2022 Table 4 (see _FIT).
A100_GEMM_MAX_FRACTION = 0.79
A100_GEMM_HALF_INTENSITY = 125.0
_A100_RIDGE = 312e12 / (2039 * GB)


def _hopper_calibration(hbm: float) -> dict[str, Any]:
    """The A100 curve moved to a Hopper GPU (989 TFLOP/s): same shape, the reference's profiled ratio of
    sustained to peak, and half-rate intensity scaled with the ridge point. UNVERIFIED."""
    return {"compute_model": "shape",
            "gemm_max_fraction": min(1.0, A100_GEMM_MAX_FRACTION * (440 / 989) / (220 / 312)),
            "gemm_half_intensity": A100_GEMM_HALF_INTENSITY * (989e12 / hbm) / _A100_RIDGE}


HARDWARE_PRESETS: dict[str, HardwareSpec] = {
    h.name: h
    for h in (
        _preset("a100", _A100_SOURCES, memory_bytes=80 * GIB, peak_flops=312e12, achievable_fraction=220 / 312,
                d2h_bandwidth=15 * GB, h2d_bandwidth=15 * GB, shares_pcie_switch=True,
                nvlink_bandwidth=200 * GB, hbm_bandwidth=2039 * GB, compute_model="shape",
                gemm_max_fraction=A100_GEMM_MAX_FRACTION, gemm_half_intensity=A100_GEMM_HALF_INTENSITY,
                network="ib-hdr", internode_bandwidth=NETWORK_PRESETS["ib-hdr"].bandwidth,
                internode_latency=NETWORK_PRESETS["ib-hdr"].latency),
        _preset("h100", _H100_SOURCES, memory_bytes=81559 * 2**20, peak_flops=989e12,
                achievable_fraction=440 / 989, d2h_bandwidth=21 * GB, h2d_bandwidth=21 * GB,
                shares_pcie_switch=True, nvlink_bandwidth=360 * GB, hbm_bandwidth=3350 * GB,
                network="ib-ndr", internode_bandwidth=NETWORK_PRESETS["ib-ndr"].bandwidth,
                internode_latency=NETWORK_PRESETS["ib-ndr"].latency, **_hopper_calibration(3350 * GB)),
        _preset("h200", {**_H100_SOURCES,
                         "memory_bytes": "datasheet: 141 GB HBM3e (nvidia-smi: 143771 MiB)",
                         "achievable_fraction": f"H100's 440/989 (same compute die; {_REF} for H100)",
                         "d2h_bandwidth": "H100's 21 GB/s (same PCIe Gen5 host link; not profiled on H200)",
                         "h2d_bandwidth": "H100's 21 GB/s (same PCIe Gen5 host link; not profiled on H200)",
                         "hbm_bandwidth": "datasheet: 4800 GB/s"},
                memory_bytes=143771 * 2**20, peak_flops=989e12, achievable_fraction=440 / 989,
                d2h_bandwidth=21 * GB, h2d_bandwidth=21 * GB, shares_pcie_switch=True,
                nvlink_bandwidth=360 * GB, hbm_bandwidth=4800 * GB,
                network="ib-ndr", internode_bandwidth=NETWORK_PRESETS["ib-ndr"].bandwidth,
                internode_latency=NETWORK_PRESETS["ib-ndr"].latency, **_hopper_calibration(4800 * GB)),
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
                nvlink_bandwidth=360 * GB, hbm_bandwidth=4000 * GB,
                network="ib-ndr", internode_bandwidth=NETWORK_PRESETS["ib-ndr"].bandwidth,
                internode_latency=NETWORK_PRESETS["ib-ndr"].latency, **_hopper_calibration(4000 * GB)),
    )
}
_ALIASES = {"a100-80gb": "a100", "h100-sxm": "h100", "h100sxm": "h100"}
# how a user describes hardware of their own: the command line's flag, or the call that reads the file
_HARDWARE_FILE = {True: "with --hardware-file", False: "read by pipeoffload.planner.load_hardware"}


def hardware_preset(name: str) -> HardwareSpec:
    """Case-insensitive preset lookup (also accepts e.g. ``A100-80GB`` and ``H100-SXM``)."""
    key = name.lower()
    key = _ALIASES.get(key, key)
    spec = HARDWARE_PRESETS.get(key)
    if spec is None:
        raise ConfigError.named(lambda n: f"unknown gpu {name!r}; presets: {', '.join(HARDWARE_PRESETS)} (or "
                                f"describe one in a TOML file {_HARDWARE_FILE[n.flags]})")
    return spec


def load_hardware(path: str | Path, base: HardwareSpec | None = None) -> HardwareSpec:
    """Read a TOML file of ``HardwareSpec`` fields. ``preset = "h100"`` in the file (or ``base``) gives
    the starting point; other keys override it. Bandwidths may be given in GB/s with a ``_gbps`` suffix,
    memory in GiB as ``memory_gib`` and compute as ``peak_tflops``."""
    try:
        data = tomllib.loads(read_input_text(path))
    except (OSError, ValueError) as err:  # ValueError: TOMLDecodeError, and UnicodeDecodeError (not text)
        raise ConfigError(f"hardware file {str(path)!r}: {err}") from None
    data = data.get("hardware", data)
    if not isinstance(data, dict):  # ``hardware = 3``: the table's place holds a value
        raise ConfigError(f"hardware file {str(path)!r}: hardware = {data!r}: not a table; write [hardware] and "
                          "its fields under it")
    data = dict(data)
    preset = data.pop("preset", None)
    if preset is not None:
        if not isinstance(preset, str) or preset.lower() not in HARDWARE_PRESETS and preset.lower() not in _ALIASES:
            raise ConfigError(f"hardware file {str(path)!r}: preset = {preset!r}: not a GPU preset; give one of "
                              f"{', '.join(HARDWARE_PRESETS)} in quotes")
        base = hardware_preset(preset)
    values = hardware_values(data, lambda key, value: f"hardware file {str(path)!r}: {key} = {value!r}")
    try:
        if base is None:
            network = values.pop("network", None)
            try:
                spec = HardwareSpec(**values)
            except TypeError as err:
                raise ConfigError(f"hardware file {str(path)!r}: {err}; give all fields or a preset") from None
            if network is not None:  # the preset's links, then the file's own bandwidth/latency over them
                spec = spec.with_network(str(network)).override(
                    **{k: values[k] for k in ("internode_bandwidth", "internode_latency") if k in values})
                values["network"] = network
        else:
            spec = base.override(**values)
    except ConfigError as err:
        message = str(err)
        raise ConfigError(message if str(path) in message else f"hardware file {str(path)!r}: {message}") from None
    return replace(spec, sources={**spec.sources, **{k: f"file {path}" for k in values if k != 'name'}})


_UNIT_KEYS = {"memory_gib", "peak_tflops"}
_FRIENDLY = (*sorted(k[: -len("_bandwidth")] + "_gbps" for k in _FIELDS if k.endswith("_bandwidth")), *sorted(_UNIT_KEYS))
_BOOLEAN_WORDS = {"true": True, "yes": True, "on": True, "1": True,
                  "false": False, "no": False, "off": False, "0": False}
_FIELD_TYPES = {f.name: str(f.type) for f in dataclasses.fields(HardwareSpec)}


def hardware_values(data: Mapping[str, Any], where: Callable[[str, Any], str]) -> dict[str, Any]:
    """``HardwareSpec`` fields from user-given ones (a TOML file's values, or ``--hw`` text): friendly
    units converted (``*_gbps`` GB/s, ``memory_gib``, ``peak_tflops``) and every value checked against its
    field's type, strictly: a boolean is true/false/yes/no/on/off/1/0 and nothing else (the text "no" is
    not true), a number is a finite number. ``where(key, value)`` names a bad value in the one-line
    ``ConfigError`` (e.g. ``hardware file 'gpu.toml': d2h_gbps = 'fast'``). An unknown key is refused as
    given (``offload_gbps``, not the ``offload_bandwidth`` it would stand for), with the valid names."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if (key[: -len("_gbps")] + "_bandwidth" if key.endswith("_gbps") else key) not in _FIELDS | _UNIT_KEYS:
            raise ConfigError(f"{where(key, value)}: unknown hardware field {key}; valid: {', '.join(sorted(_FIELDS))}"
                              f" (or in GB/s, GiB, TFLOP/s: {', '.join(_FRIENDLY)})")
        if key.endswith("_gbps"):
            out[key[: -len("_gbps")] + "_bandwidth"] = _rate(key, value, where, "GB/s", GB)
        elif key == "memory_gib":
            out["memory_bytes"] = _rate(key, value, where, "GiB", GIB)
        elif key == "peak_tflops":
            out["peak_flops"] = _rate(key, value, where, "TFLOP/s", 1e12)
        elif _FIELD_TYPES.get(key) == "bool":
            word = str(value).strip().lower() if isinstance(value, (str, bool, int)) else None
            if word not in _BOOLEAN_WORDS:
                raise ConfigError(f"{where(key, value)}: not a boolean; give true or false "
                                  "(also yes/no, on/off, 1/0)")
            out[key] = _BOOLEAN_WORDS[word]
        elif _FIELD_TYPES.get(key) == "int":
            number = _number(key, value, where, "a whole number")
            if not number.is_integer():
                raise ConfigError(f"{where(key, value)}: not a whole number; give an integer such as 8")
            out[key] = int(number)
        elif _FIELD_TYPES.get(key) in ("float", "float | None"):
            out[key] = _number(key, value, where, "a number")
        elif _FIELD_TYPES.get(key) == "str":
            if not isinstance(value, str):
                raise ConfigError(f"{where(key, value)}: not a name; give text, e.g. {key} = \"...\"")
            out[key] = value
        else:
            out[key] = value
    return out


def _rate(key: str, value: Any, where: Callable[[str, Any], str], unit: str, scale: float) -> float:
    """A value given in a friendly unit, checked there: ``d2h_gbps=-1`` was refused as
    ``d2h_bandwidth=-1000000000.0``, a name and a number the user never wrote."""
    number = _number(key, value, where, unit)
    if not number * scale >= MIN_RATE:
        raise ConfigError(f"{where(key, value)}: must be a positive number of {unit} (at least {MIN_RATE / scale:.3g})")
    return number * scale


def _number(key: str, value: Any, where: Callable[[str, Any], str], unit: str) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ConfigError(f"{where(key, value)}: not a number; give {key} as a number ({unit})") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where(key, value)}: not a number; give {key} as a number ({unit})")
    if not math.isfinite(value):
        raise ConfigError(f"{where(key, value)}: not a finite number; give {key} as a finite number ({unit})")
    return float(value)


def check_hardware(value: object, field: str = "hardware") -> None:
    """A request's hardware is a ``HardwareSpec``: a preset's name (what the CLI's ``--gpu`` takes) is
    refused in one line with the call that gives its ``HardwareSpec``."""
    if not isinstance(value, HardwareSpec):
        fix = (f"pipeoffload.planner.hardware_preset({value!r})" if isinstance(value, str)
               else "a pipeoffload.planner.HardwareSpec, e.g. pipeoffload.planner.hardware_preset('a100')")
        raise ConfigError(f"{field}={value!r} is a {type(value).__name__}, not a HardwareSpec; use {fix}")
