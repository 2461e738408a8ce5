"""Mixture-of-experts configs are refused in one line naming the field: the planner models dense layers."""
import json
from pathlib import Path

import pytest

from pipeoffload.cli import main
from pipeoffload.errors import ConfigError
from pipeoffload.llama_config import LlamaShape
from pipeoffload.planner.hfconfig import model_from_hf_config

DENSE = {"hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 32, "intermediate_size": 14336,
         "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 32768, "hidden_act": "silu"}
MOE = [
    ({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": 8,
      "num_experts_per_tok": 2}, "num_local_experts"),
    ({"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "num_experts": 60,
      "moe_intermediate_size": 1408}, "num_experts"),
    ({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "n_routed_experts": 256},
     "n_routed_experts"),
    ({"model_type": "custom", "moe_intermediate_size": 1408}, "moe_intermediate_size"),
    ({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "n_routed_experts": 64}, "n_routed_experts"),
]


def _hf(tmp_path: Path, cfg: dict) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({**DENSE, **cfg}))
    return tmp_path


@pytest.mark.parametrize("cfg, field", MOE)
def test_moe_configs_are_refused_naming_the_field(tmp_path: Path, cfg: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=f"{field}=.*mixtures of experts are not modelled"):
        model_from_hf_config(_hf(tmp_path, cfg))


def test_the_cli_exits_2_with_one_line(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """The probe: Mixtral was read as a dense 7.2B model that fits."""
    folder = _hf(tmp_path, MOE[0][0])
    for command in (["estimate", "--tp", "1"], ["plan", "--gpus", "8"]):
        assert main([command[0], "--model", f"hf:{folder}", "--global-batch", "8", *command[1:]]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "num_local_experts=8" in err and "not modelled" in err


def test_train_reader_refuses_the_wider_set_of_keys() -> None:
    cfg = {**DENSE, "architectures": ["LlamaForCausalLM"], "n_routed_experts": 64}
    with pytest.raises(ConfigError, match="n_routed_experts=64: mixtures of experts"):
        LlamaShape.from_hf(cfg)


def test_unset_expert_fields_are_dense(tmp_path: Path) -> None:
    spec = model_from_hf_config(_hf(tmp_path, {"architectures": ["LlamaForCausalLM"], "num_experts": None,
                                               "num_local_experts": 0}))
    assert spec.layers == 32 and spec.gated_mlp
