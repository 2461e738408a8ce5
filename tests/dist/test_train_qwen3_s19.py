"""Qwen3 (session 19) on 4 gloo ranks: `train --model hf:DIR --plan auto` held to a pipeline of 2 and tensor
parallelism over 2 equals transformers step by step (its q/k norms replicated over the TP ranks, each rank
normalising its own heads, their gradients summed over the ranks), and its plan predicts the activation peak
each rank measures (the q/k norms' saved tensors counted, split over the TP ranks: ``planner.trainblocks``)."""
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from tests.dist.hf_planned import train_as_planned  # noqa: E402
from tests.dist.test_train_llama import _assert_tied_copies_equal  # noqa: E402
from tests.hf_fixtures import make_hf_dir  # noqa: E402

pytestmark = pytest.mark.dist


def test_pp2_tp2_tied_qwen3_with_biases_equals_transformers_as_planned(tmp_path: Path) -> None:
    from pipeoffload.train.generate import load_run

    source = tmp_path / "qwen3"
    make_hf_dir(source, "qwen3", tie_word_embeddings=True, attention_bias=True, num_hidden_layers=2)  # 4 x 32 != 64
    cfg, ref, run = train_as_planned(tmp_path, source, nproc=4, pp=2, tp=2)
    _assert_tied_copies_equal(run)
    model, _, _ = load_run(run)  # the norms' weights after 5 steps: their gradients were whole
    for i, block in enumerate(model.layers[1:-1]):
        for name in ("q_norm", "k_norm"):
            theirs = getattr(ref.model.layers[i].self_attn, name).weight
            assert (getattr(block.self_attn, name).weight - theirs).abs().max().item() < 1e-5, (i, name)
