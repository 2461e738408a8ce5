"""Tensor parallelism of the reference GPT on gloo: a sharded stage computes what the unsharded one
does, and the pipeline runner runs sharded stages (2 pipeline ranks x 2 tensor-parallel ranks). One
spawn of 4 ranks runs all of it."""
from __future__ import annotations

import pytest
from tp_workers import tp_worker

from pipeoffload.runtime.launch import spawn

pytestmark = pytest.mark.dist

TOL = 1e-5


@pytest.fixture(scope="module")
def results() -> list[dict]:
    result = spawn(tp_worker, 4, (), timeout=60, deadline=300)
    assert result.ok, result.errors
    return result.results


@pytest.mark.parametrize("mode", ["plain", "sequence_parallel"])
def test_sharded_blocks_and_model_match_unsharded(results, mode):
    for rank_result in results:
        res = rank_result[mode]
        assert res["block_plain"], "a sharded stage must return a plain torch.Tensor"
        assert "0.qkv.weight" in res["sharded"] and "0.fc2.weight" in res["sharded"]
        assert res["block_out"] < TOL and res["block_in_grad"] < TOL
        assert max(res["block_grads"].values()) < TOL, res["block_grads"]
        assert len(res["model_grads"]) == 30 and max(res["model_grads"].values()) < TOL, res["model_grads"]
        assert res["model_loss"] < TOL
        norm, norm_ref = res["norm"]
        assert norm_ref > 0.1 and abs(norm - norm_ref) < TOL * norm_ref, res["norm"]  # the clip is active
        assert max(res["clipped_grads"].values()) < TOL, res["clipped_grads"]


def test_pipeline_of_tensor_parallel_stages_with_offload(results):
    for rank, rank_result in enumerate(results):
        res = rank_result["pipeline"]
        assert len(res["grad"]) == 2 and max(res["grad"]) < TOL, (rank, res)
        assert res["end_bytes"] == [0, 0] and min(res["peak"]) > 0, (rank, res)
    last = [r["pipeline"] for r in results if r["pipeline"]["loss"]]
    assert len(last) == 2 and all(len(r["loss"]) == 2 and max(r["loss"]) < TOL for r in last)
