"""Phi-3 (session 19) on 2 gloo ranks: `train --model hf:DIR --plan auto` held to tensor parallelism over 2 equals
transformers step by step: each rank reads its shard of q, k and v (and gate, up) as rows of the fused
``qkv_proj`` (``gate_up_proj``), the column-parallel plan splits them as Llama's, and the weights after 5 steps
are transformers' fused rows; its plan predicts the activation peak each rank measures (Llama's saved tensors)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from tests.dist.test_plan_auto_peak import _predicted  # noqa: E402
from tests.dist.test_train_llama import STEPS, _losses, reference_run  # noqa: E402
from tests.hf_fixtures import TEXT, make_hf_dir  # noqa: E402

pytestmark = pytest.mark.dist


def test_tp2_phi3_equals_transformers_as_planned(tmp_path: Path) -> None:
    from pipeoffload.train.generate import load_run

    source, data = tmp_path / "phi3", tmp_path / "data.txt"
    make_hf_dir(source, "phi3", num_hidden_layers=2, sliding_window=64)
    data.write_text(TEXT * 20)
    argv = ["--model", f"hf:{source}", "--data", str(data), "--plan", "auto", "--memory", "0.01", "--gpu", "a100",
            "--nproc", "2", "--pp", "1", "--tp", "2", "--global-batch", "8", "--seq-len", "64", "--steps", str(STEPS),
            "--warmup", "2", "--lr", "3e-3", "--dtype", "fp32", "--out", str(tmp_path / "run"), "--eval-every", "100",
            "--no-progress"]
    cfg, predicted = _predicted(argv)
    assert (cfg.parallel.pp, cfg.parallel.tp, cfg.parallel.dp) == (1, 2, 1)
    got = _losses(cfg)
    want, ref = reference_run(cfg, source)
    assert len(got) == STEPS and max(abs(a - b) for a, b in zip(got, want)) < 1e-5, (got, want)
    run = Path(cfg.run.out)
    model, _, _ = load_run(run)
    for i, block in enumerate(model.layers[1:-1]):  # each shard's rows landed where transformers keeps them
        attn, mlp, theirs = block.self_attn, block.mlp, ref.model.layers[i]
        ours = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
        assert (ours - theirs.self_attn.qkv_proj.weight).abs().max().item() < 1e-5, i
        ours = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
        assert (ours - theirs.mlp.gate_up_proj.weight).abs().max().item() < 1e-5, i
    measured = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["peak_act_bytes"]
    for rank, peak in enumerate(measured):  # both TP ranks of the one pipeline rank
        assert peak <= predicted[0] <= 1.04 * peak, (rank, predicted[0], peak)
