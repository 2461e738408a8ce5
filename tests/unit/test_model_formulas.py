"""Transformer formulas against hand-computed values (Korthikanti et al. and the paper's b1/b2)."""
import pytest

from pipeoffload.errors import ConfigError
from pipeoffload.planner.model import ModelSpec
from pipeoffload.planner.presets import MODEL_PRESETS, model_preset

S, B, H, A = 2048, 2, 1024, 16
GPT = ModelSpec(layers=4, hidden=H, heads=A, seq=S, vocab=1000, microbatch=B)


def test_gpt_forward_flops_is_24bsh2_plus_4bs2h() -> None:
    assert GPT.layer_forward_flops() == 24 * B * S * H**2 + 4 * B * S**2 * H
    assert GPT.layer_forward_flops(tp=4) == (24 * B * S * H**2 + 4 * B * S**2 * H) / 4


def test_forward_input_weight_split_sums_to_three_forwards() -> None:
    f, i, w = GPT.layer_fiw_flops()
    assert f + i + w == 3 * GPT.layer_forward_flops() == 12 * B * S * H * (6 * H + S)
    assert w == 24 * B * S * H**2  # weight gradients: GEMMs only, no attention scores
    assert i == 24 * B * S * H**2 + 8 * B * S**2 * H


def test_gpt_activation_bytes_flash_unfused_and_partial_recompute() -> None:
    sbh = S * B * H
    assert GPT.layer_activation_bytes() == 34 * sbh
    assert GPT.with_(flash_attention=False).layer_activation_bytes() == 34 * sbh + 5 * A * S * S * B
    assert GPT.layer_activation_bytes(partial_recompute=True) == 20 * sbh
    assert GPT.layer_activation_bytes(tp=8) == 34 * sbh / 8


def test_activation_without_dropout_drops_masks() -> None:
    sbh = S * B * H
    no_drop = GPT.with_(dropout=False)
    assert no_drop.layer_activation_bytes() == 32 * sbh
    assert no_drop.with_(flash_attention=False).layer_activation_bytes() == 32 * sbh + 2 * A * S * S * B


def test_llama3_8b_activation_by_hand() -> None:
    # LN1 in 2, QKV in 2, Q 2, K+V 4*8/32=1, proj in 2 | LN2 in 2, fc1 in 2, gate+up 2*2*3.5=14, act out 7
    m = model_preset("llama3-8b")
    sbh = m.seq * m.microbatch * m.hidden
    assert m.layer_activation_bytes() == pytest.approx(34 * sbh)
    assert m.layer_activation_bytes(partial_recompute=True) == pytest.approx((34 - 2 - 2 - 7) * sbh)


@pytest.mark.parametrize("name, billions", [("gpt3-175b", 175), ("gpt3-13b", 13), ("gpt3-6.7b", 6.7),
                                            ("llama3-8b", 8.03), ("llama3-70b", 70.6), ("llama3-405b", 405.9)])
def test_preset_parameter_counts_match_published_sizes(name: str, billions: float) -> None:
    assert MODEL_PRESETS[name].total_params() / 1e9 == pytest.approx(billions, rel=0.015)  # 13B: hidden 5120 instead of 5140


def test_gpt_layer_parameters_are_12h2_plus_13h() -> None:
    assert GPT.params_per_layer() == 12 * H**2 + 13 * H


def test_head_and_boundary_terms() -> None:
    assert GPT.head_fiw_flops(tp=2) == (2 * B * S * H * 1000 / 2,) * 3
    assert GPT.head_activation_bytes() == 4 * S * B * H + 4 * S * B * 1000
    assert GPT.boundary_bytes(tp=4) == 2 * S * B * H / 4
    assert GPT.model_flops_per_microbatch() == 3 * (4 * GPT.layer_forward_flops() + 2 * B * S * H * 1000)


def test_invalid_shapes_name_the_constraint() -> None:
    with pytest.raises(ConfigError, match="not divisible by heads"):
        ModelSpec(layers=1, hidden=100, heads=3, seq=8)
    with pytest.raises(ConfigError, match="kv_heads"):
        ModelSpec(layers=1, hidden=96, heads=6, kv_heads=4, seq=8)
    with pytest.raises(ConfigError, match="tensor parallel size 3"):
        GPT.check_tp(3)
    with pytest.raises(ConfigError, match="unknown model"):
        model_preset("gpt-9")


def test_w_fraction_is_the_linear_inputs_over_what_a_layer_saves() -> None:
    """W needs the inputs of the four linear layers: 2 + 2 + 2 + 8 = 14 sbh of GPT's 34 (20 with LGD)."""
    flash = GPT.with_(flash_attention=True)
    assert flash.layer_weight_input_bytes() == 14 * S * B * H
    assert flash.layer_w_fraction() == pytest.approx(14 / 34)
    assert flash.layer_w_fraction(partial_recompute=True) == pytest.approx(14 / 20)
    unfused = GPT.with_(flash_attention=False)  # the s^2 scores are saved but W needs none of them
    assert unfused.layer_w_fraction() == pytest.approx(14 * S * B * H / unfused.layer_activation_bytes())
    assert GPT.head_weight_input_bytes(tp=2) == S * B * H
