"""A config.json that leaves out its token ids reads them as transformers' config class does: LlamaConfig and
MistralConfig default to bos 1 and eos 2 (the reader took them as none, so `generate` stopped at no id and the
data ended no document where transformers' model ends them)."""
from __future__ import annotations

import pytest

from pipeoffload.llama_config import LlamaShape

BASE = {"vocab_size": 300, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2}


@pytest.mark.parametrize("arch, config_class", [("LlamaForCausalLM", "LlamaConfig"),
                                                ("MistralForCausalLM", "MistralConfig"),
                                                ("Qwen2ForCausalLM", "Qwen2Config"),
                                                ("Qwen3ForCausalLM", "Qwen3Config"),
                                                ("Phi3ForCausalLM", "Phi3Config")])
def test_absent_token_ids_are_the_config_class_defaults(arch: str, config_class: str) -> None:
    transformers = pytest.importorskip("transformers")
    reference = getattr(transformers, config_class)()
    fields = {**BASE, "architectures": [arch], "vocab_size": 32064} if arch == "Phi3ForCausalLM" else \
        {**BASE, "architectures": [arch]}
    shape = LlamaShape.from_hf(fields)
    assert (shape.bos_token_id, shape.eos_token_id, shape.pad_token_id) == (
        reference.bos_token_id, reference.eos_token_id, reference.pad_token_id)
