"""Layouts a Llama-family model cannot take, refused with advice that applies (session 17). `train --plan
auto --tp N`: refused naming the model's rule (tp divides the key/value heads), as a run without --plan
is; it said that no plan keeping --tp 4 fitted the memory budget, whatever the budget. More stages than
an hf:DIR model's layers: the advice was "use layers >= N", which hf:DIR refuses (config.json sets it)."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from tests.conftest import refused  # noqa: E402
from tests.hf_fixtures import TEXT, make_hf_dir  # noqa: E402


@pytest.mark.parametrize("model", ["hf", "llama"])
def test_a_fixed_tp_breaking_the_models_rule_names_the_rule(model: str, tmp_path: Path) -> None:
    data = tmp_path / "data.txt"
    data.write_text(TEXT)
    if model == "hf":
        make_hf_dir(tmp_path / "qwen", "qwen2", num_hidden_layers=1)  # 2 key/value heads
        keys = f"--model hf:{tmp_path / 'qwen'}"
    else:
        keys = "--model llama --layers 2 --hidden 32 --heads 4 --kv-heads 2 --ffn-hidden 48"
    err = refused(f"train {keys} --data {data} --seq-len 16 --global-batch 8 --nproc 4 --tp 4 --plan auto "
                  f"--memory 40 --out {tmp_path / 'run'}", "tp=4: must divide the 2 key/value heads")
    assert "fits" not in err and not (tmp_path / "run").exists()


def test_too_many_stages_for_an_hf_model_advises_fewer_stages(tmp_path: Path) -> None:
    data = tmp_path / "data.txt"
    data.write_text(TEXT)
    make_hf_dir(tmp_path / "qwen", "qwen2", num_hidden_layers=1)
    err = refused(f"train --model hf:{tmp_path / 'qwen'} --data {data} --seq-len 16 --global-batch 8 --nproc 4 "
                  f"--pp 4 --out {tmp_path / 'run'}", "3 layers (embedding, blocks, head) cannot fill 4 stages",
                  "use fewer stages")
    assert "use layers" not in err
