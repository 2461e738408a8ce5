"""The planner counts train's embeddings and head as train builds them under tensor parallelism.

``models.tensor_parallel`` shards the blocks only: the embeddings and the head stay whole on every TP
rank. The planner divided their parameters by tp (Megatron-LM's vocabulary-parallel layers), so a
``train --plan auto --tp 2`` plan counted half of the head's weights, gradients and AdamW moments on
the last rank; and train's GPT head is an ``nn.Linear`` with a bias over the vocabulary, which the
planner's head left out.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pipeoffload.llama_config import LlamaShape  # noqa: E402
from pipeoffload.models.gpt import GPTConfig  # noqa: E402
from pipeoffload.models.gpt import Head as GPTHead  # noqa: E402
from pipeoffload.models.llama import Head as LlamaHead  # noqa: E402
from pipeoffload.planner.emit import train_blocks  # noqa: E402
from pipeoffload.planner.hardware import hardware_preset  # noqa: E402
from pipeoffload.planner.model import ModelSpec  # noqa: E402
from pipeoffload.planner.stagecosts import layer_costs  # noqa: E402


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_the_gpt_head_is_train_s_head_bias_included() -> None:
    spec = train_blocks(ModelSpec(layers=1, hidden=32, heads=4, seq=16, vocab=100), 4)
    assert spec.head_params() == _count(GPTHead(GPTConfig(vocab=100, seq=16, hidden=32, heads=4)))


def test_the_llama_head_is_train_s_head() -> None:
    shape = LlamaShape(vocab=100, hidden=32, layers=1, heads=4, kv_heads=2, ffn_hidden=64, max_positions=16)
    spec = train_blocks(shape.model_spec("llama", 16), 2)
    assert spec.head_params() == _count(LlamaHead(shape))


@pytest.mark.parametrize("tp", [2, 4])
def test_train_s_embeddings_and_head_stay_whole_on_every_tp_rank(tp: int) -> None:
    hw = hardware_preset("h100")
    megatron = ModelSpec(layers=4, hidden=256, heads=8, seq=128, vocab=1000, tied_embeddings=True)
    train = train_blocks(megatron, 2)
    one, split = layer_costs(train, hw, 1), layer_costs(train, hw, tp)
    assert (split.head_params, split.embedding_params, split.tied_params) == (
        one.head_params, one.embedding_params, one.tied_params)
    assert split.params == pytest.approx(one.params / tp)  # the blocks are sharded
    m_one, m_split = layer_costs(megatron, hw, 1), layer_costs(megatron, hw, tp)
    assert m_split.head_params == pytest.approx(m_one.head_params / tp)  # Megatron's are vocabulary-parallel
