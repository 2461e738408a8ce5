"""Tensor parallelism of the reference GPT on gloo: a sharded stage computes what the unsharded one
does, and the pipeline runner runs sharded stages (2 pipeline ranks x 2 tensor-parallel ranks)."""
from __future__ import annotations

import pytest
from tp_workers import tp_module_worker, tp_pipeline_worker

from pipeoffload.runtime.launch import spawn

pytestmark = pytest.mark.dist

TOL = 1e-5


def test_sharded_blocks_and_model_match_unsharded():
    result = spawn(tp_module_worker, 2, (), timeout=60, deadline=240)
    assert result.ok, result.errors
    for rank_result in result.results:
        one = rank_result["pipeline_1rank"]
        assert max(one["loss"]) < TOL and max(one["grad"]) < TOL and one["end_bytes"] == [0, 0], one
        for res in (rank_result["plain"], rank_result["sequence_parallel"]):
            _check_module(res)


def _check_module(res: dict) -> None:
    assert res["block_plain"], "a sharded stage must return a plain torch.Tensor"
    assert "0.qkv.weight" in res["sharded"] and "0.fc2.weight" in res["sharded"]
    assert res["block_out"] < TOL and res["block_in_grad"] < TOL
    assert max(res["block_grads"].values()) < TOL, res["block_grads"]
    assert len(res["model_grads"]) == 30 and max(res["model_grads"].values()) < TOL, res["model_grads"]
    assert res["model_loss"] < TOL
    norm, norm_ref = res["norm"]
    assert norm_ref > 0.1 and abs(norm - norm_ref) < TOL * norm_ref, res["norm"]  # the clip is active
    assert max(res["clipped_grads"].values()) < TOL, res["clipped_grads"]


def test_pipeline_of_tensor_parallel_stages_with_offload():
    result = spawn(tp_pipeline_worker, 4, (2, "1f1b", "all"), timeout=60, deadline=300)
    assert result.ok, result.errors
    for rank, res in enumerate(result.results):
        assert max(res["grad"]) < TOL, (rank, res)
        assert res["end_bytes"] == [0, 0] and min(res["peak"]) > 0, (rank, res)
    last = [res for res in result.results if res["loss"]]
    assert len(last) == 2 and all(max(res["loss"]) < TOL for res in last)
