"""Hardware presets, overrides and TOML files."""
import pytest

from pipeoffload.errors import ConfigError
from pipeoffload.planner.hardware import GB, GIB, HARDWARE_PRESETS, hardware_preset, load_hardware


def test_reference_profiled_constants_are_the_defaults() -> None:
    a100, h100 = hardware_preset("A100"), hardware_preset("h100-sxm")
    assert a100.flops == pytest.approx(220e12) and a100.offload_bandwidth == 15 * GB
    assert h100.flops == pytest.approx(440e12) and h100.offload_bandwidth == 21 * GB
    assert "reference" in a100.sources["achievable_fraction"]


@pytest.mark.parametrize("name", sorted(HARDWARE_PRESETS))
def test_every_preset_says_where_each_number_comes_from(name: str) -> None:
    spec = HARDWARE_PRESETS[name]
    for key in ("memory_bytes", "peak_flops", "achievable_fraction", "d2h_bandwidth", "h2d_bandwidth",
                "nvlink_bandwidth", "internode_bandwidth", "hbm_bandwidth"):
        assert spec.sources.get(key), f"{name}.{key} has no source"
    assert spec.flops <= spec.peak_flops


def test_memory_sizes() -> None:
    assert hardware_preset("a100").memory_bytes == 80 * GIB
    assert 139 * GIB < hardware_preset("h200").memory_bytes < 141 * GIB


def test_override_marks_the_source_and_rejects_unknown_fields() -> None:
    spec = hardware_preset("a100").override(d2h_bandwidth=25 * GB)
    assert spec.d2h_bandwidth == 25 * GB and spec.sources["d2h_bandwidth"] == "user override"
    assert spec.offload_bandwidth == 15 * GB  # the slower direction
    with pytest.raises(ConfigError, match="unknown hardware field"):
        spec.override(warp_speed=9)
    with pytest.raises(ConfigError, match="achievable_fraction"):
        spec.override(achievable_fraction=1.5)


def test_toml_with_preset_and_friendly_units(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "gpu.toml"
    path.write_text('[hardware]\npreset = "h100"\nname = "my-h100"\nd2h_gbps = 30\nh2d_gbps = 28\n'
                    'memory_gib = 94\nshares_pcie_switch = false\n')
    spec = load_hardware(path)
    assert spec.name == "my-h100"
    assert spec.d2h_bandwidth == 30 * GB and spec.h2d_bandwidth == 28 * GB and spec.offload_bandwidth == 28 * GB
    assert spec.memory_bytes == 94 * GIB and not spec.shares_pcie_switch
    assert spec.flops == pytest.approx(440e12)  # inherited from the preset
    assert str(path) in spec.sources["d2h_bandwidth"]


def test_toml_without_preset_needs_every_field(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "gpu.toml"
    path.write_text("peak_tflops = 100\n")
    with pytest.raises(ConfigError, match="give all fields or a preset"):
        load_hardware(path)
    path.write_text("peak_tflops = [\n")
    with pytest.raises(ConfigError, match="hardware file"):
        load_hardware(path)


def test_collective_bandwidth_inside_and_across_nodes() -> None:
    spec = hardware_preset("h100")
    assert spec.collective_bandwidth(8, 1) == spec.nvlink_bandwidth
    assert spec.collective_bandwidth(2, 8) == spec.internode_bandwidth
