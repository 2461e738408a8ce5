"""Qwen3 (session 19) on 4 gloo ranks: `train --model hf:DIR --plan auto` held to a pipeline of 2 and tensor
parallelism over 2 equals transformers step by step (its q/k norms replicated over the TP ranks, each rank
normalising its own heads, their gradients summed over the ranks), and its plan predicts the activation peak
each rank measures (the q/k norms' saved tensors counted, split over the TP ranks: ``planner.trainblocks``)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from tests.dist.test_plan_auto_peak import _predicted  # noqa: E402
from tests.dist.test_train_llama import STEPS, _assert_tied_copies_equal, _losses, reference_run  # noqa: E402
from tests.hf_fixtures import TEXT, make_hf_dir  # noqa: E402

pytestmark = pytest.mark.dist


def test_pp2_tp2_tied_qwen3_with_biases_equals_transformers_as_planned(tmp_path: Path) -> None:
    from pipeoffload.train.generate import load_run

    source, data = tmp_path / "qwen3", tmp_path / "data.txt"
    make_hf_dir(source, "qwen3", tie_word_embeddings=True, attention_bias=True, num_hidden_layers=2)  # 4 x 32 != 64
    data.write_text(TEXT * 20)
    argv = ["--model", f"hf:{source}", "--data", str(data), "--plan", "auto", "--memory", "0.01", "--gpu", "a100",
            "--nproc", "4", "--pp", "2", "--tp", "2", "--global-batch", "8", "--seq-len", "64", "--steps", str(STEPS),
            "--warmup", "2", "--lr", "3e-3", "--dtype", "fp32", "--out", str(tmp_path / "run"), "--eval-every", "100",
            "--no-progress"]
    cfg, predicted = _predicted(argv)
    assert (cfg.parallel.pp, cfg.parallel.tp, cfg.parallel.dp) == (2, 2, 1)
    got = _losses(cfg)
    want, ref = reference_run(cfg, source)
    assert len(got) == STEPS and max(abs(a - b) for a, b in zip(got, want)) < 1e-5, (got, want)
    run = Path(cfg.run.out)
    _assert_tied_copies_equal(run)
    model, _, _ = load_run(run)  # the norms' weights after 5 steps: their gradients were whole
    for i, block in enumerate(model.layers[1:-1]):
        for name in ("q_norm", "k_norm"):
            theirs = getattr(ref.model.layers[i].self_attn, name).weight
            assert (getattr(block.self_attn, name).weight - theirs).abs().max().item() < 1e-5, (i, name)
    measured = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["peak_act_bytes"]
    for rank, peak in enumerate(measured):  # global ranks: pipeline rank 0's two TP ranks, then rank 1's
        plan = predicted[rank // cfg.parallel.tp]
        assert peak <= plan <= 1.04 * peak, (rank, plan, peak)
