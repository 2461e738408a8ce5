"""Mistral's sliding window (Mistral-7B-v0.1 has one of 4096 tokens): full causal attention is the window's
own on sequences of at most that many tokens, so such a folder trains, plans and generates within it, is
refused beyond it, and its export keeps the window. It was refused outright ("set it to null")."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from pipeoffload.cli import main  # noqa: E402
from pipeoffload.errors import ConfigError  # noqa: E402
from pipeoffload.hfdir import open_hf_dir  # noqa: E402
from pipeoffload.llama_config import LlamaShape  # noqa: E402
from pipeoffload.models.hf import hf_model  # noqa: E402
from pipeoffload.planner.hfconfig import model_from_hf_config  # noqa: E402
from pipeoffload.train.generate import load_source  # noqa: E402
from tests.hf_fixtures import make_hf_dir  # noqa: E402

WINDOW = 16


@pytest.fixture(scope="module")
def mistral(tmp_path_factory) -> tuple[Path, object]:  # type: ignore[no-untyped-def]
    path = tmp_path_factory.mktemp("hf") / "mistral"
    return path, make_hf_dir(path, "mistral", seed=5, sliding_window=WINDOW)


def test_the_window_is_read_and_written_back(mistral) -> None:  # type: ignore[no-untyped-def]
    raw = json.loads((mistral[0] / "config.json").read_text())
    assert raw["sliding_window"] == WINDOW
    shape = LlamaShape.from_hf(raw)
    assert shape.sliding_window == WINDOW and shape.context == WINDOW  # max_position_embeddings is 4096
    assert shape.to_hf()["sliding_window"] == WINDOW  # what export writes: the same model again
    assert LlamaShape.from_hf({**raw, "sliding_window": None}).to_hf()["sliding_window"] is None


def test_within_the_window_the_model_equals_transformers(mistral) -> None:  # type: ignore[no-untyped-def]
    path, ref = mistral
    ours = hf_model(open_hf_dir(path)).eval()
    tokens = torch.randint(0, 300, (2, WINDOW))
    with torch.no_grad():
        diff = (ours.layers(tokens, None, 0) - ref(tokens).logits).abs().max().item()
    assert diff < 1e-4, diff


def test_generate_keeps_at_most_the_window(mistral) -> None:  # type: ignore[no-untyped-def]
    _, _, context, _ = load_source(f"hf:{mistral[0]}")
    assert context == WINDOW


def test_train_beyond_the_window_is_one_line(mistral, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "run"
    assert main(["train", "--model", f"hf:{mistral[0]}", "--seq-len", str(WINDOW + 1), "--out", str(out),
                 "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"sliding_window={WINDOW}" in err and f"--seq-len {WINDOW}" in err, err
    assert f"above the sliding_window={WINDOW} of model='hf:" in err, err  # it read "model='hf:...''s sliding_window"
    assert not out.exists()


def test_train_within_the_window_runs(mistral, tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "run"
    assert main(["train", "--model", f"hf:{mistral[0]}", "--seq-len", str(WINDOW), "--global-batch", "2",
                 "--microbatches", "2", "--steps", "1", "--eval-every", "100", "--out", str(out),
                 "--no-progress"]) == 0
    assert (out / "metrics.jsonl").is_file()


def test_the_planner_plans_within_the_window(mistral) -> None:  # type: ignore[no-untyped-def]
    spec = model_from_hf_config(mistral[0])
    assert spec.seq == WINDOW and spec.attention_window == WINDOW
    with pytest.raises(ConfigError, match=f"sliding_window={WINDOW}"):
        spec.with_(seq=WINDOW * 2)


def _qwen2(**fields: object) -> dict[str, object]:
    raw = json.loads(transformers.Qwen2Config(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                              num_attention_heads=4, num_key_value_heads=2).to_json_string())
    raw.update(architectures=["Qwen2ForCausalLM"], **fields)
    return raw


def test_other_architectures_still_refuse_a_window_that_slides() -> None:
    raw = _qwen2(sliding_window=4096, use_sliding_window=True, max_window_layers=1, layer_types=None)
    assert "sliding_attention" in transformers.Qwen2Config(**raw).layer_types  # transformers slides layer 1
    with pytest.raises(ConfigError, match="sliding_window=4096 with use_sliding_window=true is not supported for Qwen2ForCausalLM"):
        LlamaShape.from_hf(raw)


def test_a_qwen2_window_no_layer_uses_is_full_attention() -> None:
    """Qwen2 slides only layers from max_window_layers on (28 by default, past a small model's last)."""
    raw = _qwen2(sliding_window=4096, use_sliding_window=True, max_window_layers=2, layer_types=None)
    assert set(transformers.Qwen2Config(**raw).layer_types) == {"full_attention"}
    assert LlamaShape.from_hf(raw).sliding_window == 0


def test_swish_is_silu() -> None:
    shape = LlamaShape.from_hf(_qwen2(hidden_act="swish"))
    assert shape.to_hf()["hidden_act"] == "silu"
    assert torch.equal(torch.nn.functional.silu(torch.arange(-3.0, 3.0)),
                       transformers.activations.ACT2FN["swish"](torch.arange(-3.0, 3.0)))


@pytest.mark.parametrize("config", [transformers.LlamaConfig, transformers.MistralConfig, transformers.Qwen2Config])
def test_left_out_positions_are_transformers_default(config) -> None:  # type: ignore[no-untyped-def]
    """An export writes max_position_embeddings: where the source left it out it must be what transformers read
    (its config class's default), not one number for every architecture (it was 4096)."""
    raw = json.loads(config(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, sliding_window=None).to_json_string())
    raw["architectures"] = [config.__name__.replace("Config", "ForCausalLM")]
    del raw["max_position_embeddings"]
    assert LlamaShape.from_hf(raw).to_hf()["max_position_embeddings"] == config().max_position_embeddings
