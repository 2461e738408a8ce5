"""Activation bytes with and without sequence parallelism against Korthikanti et al. 2022, Table 2.

Without sequence parallelism the LayerNorm inputs and outputs and the dropout masks are whole on every
tensor-parallel rank: ``sbh(10 + 24/t) + 5as^2b/t`` per GPT layer, against ``34sbh/t + 5as^2b/t``."""
import json

import pytest

from pipeoffload.cli import main
from pipeoffload.planner.hardware import hardware_preset
from pipeoffload.planner.model import ModelSpec
from pipeoffload.planner.presets import model_preset
from pipeoffload.planner.stagecosts import layer_costs

S, B, H, A, V = 2048, 2, 1024, 16, 1000
GPT = ModelSpec(layers=4, hidden=H, heads=A, seq=S, vocab=V, microbatch=B)
SBH = S * B * H


@pytest.mark.parametrize("t", [1, 2, 8])
@pytest.mark.parametrize("flash", [True, False])
def test_gpt_layer_matches_the_published_formula(t: int, flash: bool) -> None:
    model = GPT.with_(flash_attention=flash)
    scores = 0 if flash else 5 * A * S * S * B / t
    assert model.layer_activation_bytes(t, sequence_parallel=True) == pytest.approx(SBH * 34 / t + scores)
    assert model.layer_activation_bytes(t, sequence_parallel=False) == pytest.approx(SBH * (10 + 24 / t) + scores)


@pytest.mark.parametrize("t", [1, 2, 8])
def test_lgd_keeps_only_the_norm_inputs_replicated(t: int) -> None:
    """LGD drops LN outputs, the activation output and the masks: 4 replicated + 16 split (20 at t = 1)."""
    assert GPT.layer_activation_bytes(t, True, sequence_parallel=False) == pytest.approx(SBH * (4 + 16 / t))
    assert GPT.layer_activation_bytes(t, True, sequence_parallel=True) == pytest.approx(SBH * 20 / t)


def test_llama_shape_replicates_its_norm_tensors_and_no_masks() -> None:
    """llama3-8b (RMSNorm, SwiGLU, no dropout, GQA): 8 of its 34 sbh are the norms' inputs and outputs."""
    m = model_preset("llama3-8b")
    sbh = m.seq * m.microbatch * m.hidden
    assert m.activation_terms() == pytest.approx((8, 26))
    assert m.layer_activation_bytes(8, sequence_parallel=False) == pytest.approx(sbh * (8 + 26 / 8))
    assert m.layer_activation_bytes(8, True, sequence_parallel=False) == pytest.approx(sbh * (4 + 19 / 8))


@pytest.mark.parametrize("t", [1, 2, 8])
def test_weight_inputs_and_head_replicate_the_norm_outputs(t: int) -> None:
    """W needs QKV and fc1 inputs (norm outputs, whole without SP) and the split proj/fc2 inputs; the head's
    final norm in/out is whole without SP, its fp32 logits stay split over the vocabulary."""
    assert GPT.layer_weight_input_bytes(t, sequence_parallel=True) == pytest.approx(SBH * 14 / t)
    assert GPT.layer_weight_input_bytes(t, sequence_parallel=False) == pytest.approx(SBH * (4 + 10 / t))
    assert GPT.head_activation_bytes(t, sequence_parallel=False) == pytest.approx(4 * SBH + 4 * S * B * V / t)
    assert GPT.head_activation_bytes(t, sequence_parallel=True) == pytest.approx((4 * SBH + 4 * S * B * V) / t)
    assert GPT.head_weight_input_bytes(t, sequence_parallel=False) == pytest.approx(2 * SBH)
    assert GPT.layer_w_fraction(t, sequence_parallel=False) == pytest.approx((4 + 10 / t) / (10 + 24 / t))


def test_layer_costs_pass_the_flag_on() -> None:
    hw = hardware_preset("a100")
    sp, no_sp = (layer_costs(GPT, hw, 8, sequence_parallel=flag) for flag in (True, False))
    assert sp.activation_bytes == pytest.approx(SBH * 34 / 8)
    assert no_sp.activation_bytes == pytest.approx(SBH * (10 + 24 / 8))
    assert no_sp.w_bytes == pytest.approx(SBH * (4 + 10 / 8))
    assert no_sp.head_activation_bytes == pytest.approx(4 * SBH + 4 * S * B * V / 8)
    assert no_sp.head_w_bytes == pytest.approx(2 * SBH)
    lgd = layer_costs(GPT, hw, 8, partial_recompute=True, sequence_parallel=False)
    assert lgd.activation_bytes == pytest.approx(SBH * (4 + 16 / 8))
    one = layer_costs(GPT, hw, 1, sequence_parallel=False)  # nothing to replicate over at t = 1
    assert one.activation_bytes == layer_costs(GPT, hw, 1).activation_bytes


def test_lgd_redoes_the_norms_on_every_token_without_sequence_parallelism() -> None:
    norms = 8 * SBH  # two LayerNorms, read + write
    rest = GPT.recompute_elementwise_bytes() - norms
    assert GPT.recompute_elementwise_bytes(8) == pytest.approx((norms + rest) / 8)
    assert GPT.recompute_elementwise_bytes(8, sequence_parallel=False) == pytest.approx(norms + rest / 8)


def _memory(capsys, *extra: str) -> float:  # type: ignore[no-untyped-def]
    argv = ["estimate", "--model", "gpt3-175b", "--tp", "8", "--pp", "8", "--global-batch", "64", "--json"]
    assert main([*argv, *extra]) == 0
    return float(json.loads(capsys.readouterr().out)["memory_gib"]["worst"])


def test_estimate_memory_grows_without_sequence_parallelism(capsys) -> None:  # type: ignore[no-untyped-def]
    """The probe: gpt3-175b TP8 PP8 printed the same memory with and without --no-sequence-parallel."""
    sp, no_sp = _memory(capsys), _memory(capsys, "--no-sequence-parallel")
    assert no_sp > sp + 15  # 12 layers x 8 microbatches in flight x (13 - 4.25) sbh = ~20 GiB more
