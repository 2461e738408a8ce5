"""Formula 1 (the paper's k), its CLI, and the closed-form bubble/memory estimates."""
import json

import pytest

from pipeoffload.cli import main
from pipeoffload.planner.formulas import (
    bubble_1f1b,
    formula1_k,
    gis_bubble,
    gis_idle_slots,
    gis_peak_units,
    hideable_fraction,
    offload_time,
)
from pipeoffload.planner.hardware import hardware_preset
from pipeoffload.planner.model import ModelSpec
from pipeoffload.planner.stagecosts import layer_costs


def test_formula1_reference_a100_value() -> None:
    k = formula1_k(4096, 8192, 220e12, 15e9)
    assert k == pytest.approx(10 * 220e12 / (3 * (6 * 4096 + 8192) * 15e9))
    assert round(k, 3) == 1.492
    assert round(offload_time(k), 3) == 0.746


@pytest.mark.parametrize("h, s, a100", [(4096, 2048, 1.84), (4096, 32768, 0.85), (8192, 8192, 0.85),
                                        (12288, 4096, 0.63), (16384, 8192, 0.46), (5120, 16384, 1.04)])
def test_formula1_table_and_h100_ratio(h: int, s: int, a100: float) -> None:
    assert formula1_k(h, s, 220e12, 15e9) == pytest.approx(a100, abs=0.005)
    # H100 constants (440 TFLOP/s, 21 GB/s) give 2 * 15/21 = 1.4286x the A100 value
    ratio = formula1_k(h, s, 440e12, 21e9) / formula1_k(h, s, 220e12, 15e9)
    assert round(ratio, 4) == 1.4286


def test_formula1_from_presets_matches_to_three_digits() -> None:
    for gpu, expected in (("a100", 1.492), ("h100", 2.131)):
        hw = hardware_preset(gpu)
        assert round(formula1_k(4096, 8192, hw.flops, hw.offload_bandwidth), 3) == expected


def test_cost_model_k_equals_formula1_for_a_gpt_layer_without_recompute_time() -> None:
    """Formula 1 is the flat cost model's k for a GPT layer saving 20 sbh, if LGD recomputation were free."""
    hw = hardware_preset("a100").override(compute_model="flat")
    model = ModelSpec(layers=1, hidden=4096, heads=32, seq=8192)
    lc = layer_costs(model, hw, partial_recompute=True)
    lgd = model.recompute_elementwise_bytes() / hw.hbm_bandwidth
    k = 2 * lc.activation_bytes / hw.offload_bandwidth / (lc.time_f + lc.time_i + lc.time_w - lgd)
    assert k == pytest.approx(formula1_k(4096, 8192, hw.flops, hw.offload_bandwidth), rel=1e-12)


def test_k_cli_prints_formula1(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["k", "--hidden", "4096", "--seq", "8192", "--gpu", "a100"]) == 0
    out = capsys.readouterr().out
    assert "k = 10*B_c / (3*(6h+s)*B_o) = 1.49 " in out
    assert main(["k", "--hidden", "4096", "--seq", "8192", "--gpu", "h100", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert round(data["formula1_k"], 2) == 2.13 and data["offload_time"] == pytest.approx(data["formula1_k"] / 2)


def test_k_cli_overrides_and_errors(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["k", "--hidden", "4096", "--seq", "8192", "--gpu", "h100", "--flops", "440", "--offload-bw", "21",
                 "--json"]) == 0
    assert round(json.loads(capsys.readouterr().out)["formula1_k"], 3) == 2.131
    assert main(["k", "--hidden", "4096", "--seq", "8192", "--flops", "440"]) == 2  # above the A100's 312 peak
    assert "--flops 440" in capsys.readouterr().err
    assert main(["k", "--seq", "8192"]) == 2
    assert "--hidden" in capsys.readouterr().err
    assert main(["k", "--hidden", "4096", "--seq", "8192", "--gpu", "tpu"]) == 2
    assert "unknown gpu" in capsys.readouterr().err


def test_bubble_and_gis_closed_forms() -> None:
    assert bubble_1f1b(8, 32) == pytest.approx(7 / 39)
    assert gis_idle_slots(8, 36, 3, 6) == 18 and gis_idle_slots(8, 32, 4, 6) == 32
    assert round(gis_bubble(8, 32, 2, 8), 3) == 0.068 and round(gis_bubble(8, 32, 2, 4), 3) == 0.086
    assert gis_peak_units(8, 2, 8) == 16 and gis_peak_units(8, 2, 4) == 12 and gis_peak_units(16, 4, 8) == 40
    assert [gis_peak_units(16, 4, 12, oc) for oc in (1, 2, 3, 4)] == [36, 24, 12, 0]
    assert hideable_fraction(0.5) == 1.0 and hideable_fraction(2.0) == 0.5
