"""A config.json whose rope_theta is 0 or below is refused by every reader of the folder, not only by `train`
(`generate` and `plan --model hf:DIR` read it and gave NaN logits or planned it)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeoffload.errors import ConfigError
from pipeoffload.llama_config import LlamaShape
from tests.conftest import run_cli
from tests.hf_fixtures import make_hf_dir

BASE = {"architectures": ["LlamaForCausalLM"], "vocab_size": 300, "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4}


@pytest.mark.parametrize("fields", [{"rope_theta": 0}, {"rope_theta": -1.0},
                                    {"rope_parameters": {"rope_type": "default", "rope_theta": 0.0}}])
def test_from_hf_refuses_a_rope_base_at_or_below_zero(fields: dict) -> None:
    with pytest.raises(ConfigError, match=r"^config.json: rope_theta=-?[01].0: must be a finite number > 0"):
        LlamaShape.from_hf({**BASE, **fields})


def test_generate_and_plan_refuse_it_in_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "hf"
    make_hf_dir(folder, "llama")
    cfg = json.loads((folder / "config.json").read_text())
    cfg.pop("rope_parameters", None)
    cfg["rope_theta"] = 0
    (folder / "config.json").write_text(json.dumps(cfg))
    for argv in (("generate", f"hf:{folder}", "--prompt", "The"),
                 ("plan", "--model", f"hf:{folder}", "--gpu", "a100", "--gpus", "2", "--global-batch", "8")):
        code, out, err = run_cli(*argv)
        assert code == 2 and not out and len(err.splitlines()) == 1, (argv, err)
        assert "rope_theta=0.0: must be a finite number > 0" in err, err
