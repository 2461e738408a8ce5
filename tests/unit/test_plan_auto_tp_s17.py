"""`train --plan auto` with a --tp the Llama-family model cannot take (session 17): refused naming the
model's rule (tp divides the key/value heads), as a run without --plan is; it said that no plan keeping
--tp 4 fitted the memory budget, whatever the budget."""
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
