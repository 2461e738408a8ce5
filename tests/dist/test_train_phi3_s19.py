"""Phi-3 (session 19) on 2 gloo ranks: `train --model hf:DIR --plan auto` held to tensor parallelism over 2 equals
transformers step by step: each rank reads its shard of q, k and v (and gate, up) as rows of the fused
``qkv_proj`` (``gate_up_proj``), the column-parallel plan splits them as Llama's, and the weights after 5 steps
are transformers' fused rows; its plan predicts the activation peak each rank measures (Llama's saved tensors)."""
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from tests.dist.hf_planned import train_as_planned  # noqa: E402
from tests.hf_fixtures import make_hf_dir  # noqa: E402

pytestmark = pytest.mark.dist


def test_tp2_phi3_equals_transformers_as_planned(tmp_path: Path) -> None:
    from pipeoffload.train.generate import load_run

    source = tmp_path / "phi3"
    make_hf_dir(source, "phi3", num_hidden_layers=2, sliding_window=64)
    cfg, ref, run = train_as_planned(tmp_path, source, nproc=2, pp=1, tp=2)
    model, _, _ = load_run(run)
    for i, block in enumerate(model.layers[1:-1]):  # each shard's rows landed where transformers keeps them
        attn, mlp, theirs = block.self_attn, block.mlp, ref.model.layers[i]
        ours = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
        assert (ours - theirs.self_attn.qkv_proj.weight).abs().max().item() < 1e-5, i
        ours = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
        assert (ours - theirs.mlp.gate_up_proj.weight).abs().max().item() < 1e-5, i
