"""`--fsdp` (FSDP2 `fully_shard` per stage over the dp group, driven by the loop) on PP2 x DP2.

One spawn of 4 gloo ranks runs every case one after the other (a spawn costs more than these tiny
runs). With two replicas FSDP's reduce-scatter averages as the plain data-parallel all-reduce does,
(a + b) / 2 elementwise, and AdamW and clipping are elementwise on the shards, so losses and
parameters are expected bitwise equal to the run without `--fsdp`, and equal to one process within
the 1e-6 of the PP x DP test (the replicas sum 4 + 4 sequences where one process sums 8)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from test_train_parallel import BASE, losses, one_process  # noqa: E402
from train_workers import fsdp_cases  # noqa: E402

from pipeoffload.train.config import validate  # noqa: E402
from pipeoffload.train.launch import run_ranks  # noqa: E402

pytestmark = pytest.mark.dist

ZBV = {"schedule": "zb-v", "stages_per_rank": 2, "recompute": "all"}  # split backward, 2 stages per rank
OFF = {"schedule": "1f1b", "stages_per_rank": 1, "offload": "all", "steps": 2}
CASES = [
    ("plain", ZBV), ("fsdp", {**ZBV, "fsdp": True}),
    ("fsdp_resumed", {**ZBV, "fsdp": True, "resume_of": "fsdp", "resume_step": 2}),
    ("plain_from_fsdp", {**ZBV, "resume_of": "fsdp", "resume_step": 2}),
    ("fsdp_from_plain", {**ZBV, "fsdp": True, "resume_of": "plain", "resume_step": 2}),
    ("plain_offload", OFF), ("fsdp_offload", {**OFF, "fsdp": True}),
]
_cache: dict = {}


def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    if "r" not in _cache:
        cfg = validate(BASE.updated(pp=2, dp=2, nproc=4, save_every=2))
        _cache["r"] = run_ranks(fsdp_cases, cfg, (str(tmp_path_factory.mktemp("fsdp")), CASES))
    return _cache["r"]


def _same_params(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_fsdp_equals_plain_dp_bitwise_and_one_process(tmp_path_factory: pytest.TempPathFactory) -> None:
    ranks = results(tmp_path_factory)
    for r in ranks:  # every parameter sharded: zb-v puts stages 0 and 3 on pipeline rank 0
        assert len(r["fsdp"]["sharded"]) == len(r["fsdp"]["params"]) > 0 and not r["plain"]["sharded"]
    for plain, fsdp in (("plain", "fsdp"), ("plain_offload", "fsdp_offload")):
        assert ranks[0][fsdp]["losses"] == ranks[0][plain]["losses"]
        assert ranks[0][fsdp]["val"] == ranks[0][plain]["val"]
        for r in ranks:
            assert _same_params(r[fsdp]["params"], r[plain]["params"])
    # clipping ran (norm > clip) on a norm over every replica's shard, as the whole gradients' norm
    # (float64 sums of the shards' squares: equal to rounding, not necessarily bitwise)
    plain, fsdp = ranks[0]["plain"]["norms"], ranks[0]["fsdp"]["norms"]
    assert max(fsdp) > BASE.optim.clip and all(abs(a - b) <= 1e-12 * a for a, b in zip(plain, fsdp))
    ref = losses(one_process())
    got = ranks[0]["fsdp"]["losses"]
    assert len(got) == 3 and max(abs(x - y) for x, y in zip(got, ref)) < 1e-6


def test_fsdp_offload_leaves_the_gathered_weights_alone(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Offloading moves the same activation bytes with and without FSDP: the all-gathered weights,
    reallocated at each step, are excluded from the activation store anew (``refresh_parameters``)."""
    ranks = results(tmp_path_factory)
    assert any(r["plain_offload"]["host_bytes"] > 0 for r in ranks)  # the first pipeline rank offloads
    for r in ranks:
        assert r["fsdp_offload"]["host_bytes"] == r["plain_offload"]["host_bytes"]


def test_fsdp_resume_and_checkpoints_across_fsdp_and_plain(tmp_path_factory: pytest.TempPathFactory) -> None:
    ranks = results(tmp_path_factory)
    third = ranks[0]["fsdp"]["losses"][2:]
    for name in ("fsdp_resumed", "plain_from_fsdp", "fsdp_from_plain"):
        assert ranks[0][name]["losses"] == third, name
        for r in ranks:
            assert _same_params(r[name]["params"], r["fsdp"]["params"]), name
