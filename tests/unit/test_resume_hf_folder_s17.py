"""`train --resume` of an hf:DIR run whose folder now holds another model (session 17): refused in one
line saying the folder changed since the run started, naming what changed; it named a shape key as if a
flag had set it ("layers=1: ... sets layers=2 (its config.json); leave --layers out")."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from pipeoffload.cli import main  # noqa: E402
from tests.conftest import refused  # noqa: E402
from tests.hf_fixtures import TEXT, make_hf_dir  # noqa: E402


def test_a_resume_from_a_changed_folder_says_it_changed(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src, run, data = tmp_path / "model", tmp_path / "run", tmp_path / "data.txt"
    make_hf_dir(src, "llama", num_hidden_layers=1)
    data.write_text(TEXT * 4)
    assert main(["train", "--model", f"hf:{src}", "--data", str(data), "--seq-len", "16", "--global-batch", "2", "--microbatches", "1",
                 "--steps", "2", "--stop-at", "1", "--out", str(run)]) == 0
    capsys.readouterr()
    shutil.rmtree(src)
    make_hf_dir(src, "qwen2", num_hidden_layers=2)  # another model under the same name
    err = refused(f"train --resume {run}", "no longer describes the model the run started from",
                  "hf_config.json", "layers 1 -> 2", "tie_embeddings False -> True", "restore that folder")
    assert "leave --" not in err
