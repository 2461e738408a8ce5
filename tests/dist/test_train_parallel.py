"""`pipeoffload train` on several ranks equals one process: PP bitwise (2 torchrun nodes), PP x DP within 1e-6."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from train_workers import gpt_params  # noqa: E402

from pipeoffload.train.config import TrainConfig, validate  # noqa: E402
from pipeoffload.train.launch import run_ranks  # noqa: E402

pytestmark = pytest.mark.dist

BASE = TrainConfig.build(layers=2, hidden=32, heads=4, seq_len=32, global_batch=8, microbatches=2, steps=3,
                   eval_every=2, warmup=1, lr=3e-3, progress=False)
_cache: dict = {}


def one_process() -> list[dict]:
    if "ref" not in _cache:  # one thread, as every spawned rank: matmul results depend on the thread count
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            _cache["ref"] = run_ranks(gpt_params, validate(BASE))[0]
        finally:
            torch.set_num_threads(threads)
    return _cache["ref"]["history"]


def losses(history: list[dict]) -> list[float]:
    return [h["loss"] for h in history]


def cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeoffload", "train", *args], capture_output=True, text=True,
                          timeout=timeout)


def flags(cfg: TrainConfig) -> list[str]:
    out = []
    for key in ("layers", "hidden", "heads", "seq_len", "global_batch", "microbatches", "steps", "eval_every",
                "warmup", "lr"):
        out += [f"--{key.replace('_', '-')}", str(cfg.get(key))]
    return out + ["--no-progress"]


PP_DP = BASE.updated(pp=2, dp=2, nproc=4, schedule="interleaved-1f1b")


def pp_dp() -> list[dict]:
    if "pp_dp" not in _cache:
        _cache["pp_dp"] = run_ranks(gpt_params, validate(PP_DP))
    return _cache["pp_dp"]


def test_pp_x_dp_replicas_bitwise_equal_and_close_to_one_process() -> None:
    results = pp_dp()
    by_coords = {r["coords"]: r for r in results}
    for pp_rank in range(2):
        a, b = by_coords[(0, pp_rank, 0)]["params"], by_coords[(1, pp_rank, 0)]["params"]
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    got, ref = losses(results[0]["history"]), losses(one_process())
    assert len(got) == len(ref) == 3
    assert max(abs(x - y) for x, y in zip(got, ref)) < 1e-6
    assert got != losses([{"loss": 0.0}] * 3)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_two_torchrun_nodes_pipeline_only_equal_one_process_bitwise(tmp_path: Path) -> None:
    """4 pipeline ranks (1F1B, offload all) as 2 torchrun "nodes" x 2 processes joined by the c10d
    rendezvous on localhost: every loss torch.equal to one process (so also to one node)."""
    port, out = _free_port(), tmp_path / "run"
    args = [*flags(BASE), "--pp", "4", "--offload", "all", "--out", str(out), "--timeout", "120"]
    nodes = [
        subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
                          "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                          "--rdzv-id", "pipeoffload-test", "-m", "pipeoffload", "train", *args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for node in (0, 1)
    ]
    outputs = [n.communicate(timeout=300) for n in nodes]
    assert all(n.returncode == 0 for n in nodes), outputs
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    ref = one_process()
    assert torch.equal(torch.tensor(losses(metrics)), torch.tensor(losses(ref)))
    assert [m["val_loss"] for m in metrics] == [h["val_loss"] for h in ref]
    for m in metrics:  # the schema of metrics.jsonl
        assert len(m["peak_act_bytes"]) == len(m["sim_peak_act_bytes"]) == len(m["host_bytes"]) == 4
        assert m["layout"] == {"pp": 4, "dp": 1, "tp": 1}  # what the per-rank lists index
        assert m["cuda_max_allocated"] is None and m["tokens_per_s"] > 0
        assert m["peak_act_bytes"] == [int(x) for x in m["sim_peak_act_bytes"]]  # measured = simulated
        assert max(m["host_bytes"]) > 0  # offload all put activations on the host


def test_pp_x_tp_close_to_one_process() -> None:
    """2 pipeline x 2 tensor-parallel ranks: the losses within 1e-5 of one process."""
    results = run_ranks(gpt_params, validate(BASE.updated(pp=2, tp=2, nproc=4)))
    got, ref = losses(results[0]["history"]), losses(one_process())
    assert max(abs(x - y) for x, y in zip(got, ref)) < 1e-5


def test_split_backward_measured_peak_equals_simulated() -> None:
    """zb-h1 without offload on 2 ranks holds slots between I and W: the simulated peak counts the share
    of a slot the runtime measured still held after I, not the whole slot (it reported 1.5x before)."""
    cfg = BASE.updated(pp=2, nproc=2, schedule="zb-h1", steps=1, global_batch=4)
    record = run_ranks(gpt_params, validate(cfg))[0]["history"][-1]
    assert record["peak_act_bytes"] == [int(x) for x in record["sim_peak_act_bytes"]]


def test_dp_replicas_with_split_backward_bitwise_equal_and_close_to_one_process() -> None:
    """2 data-parallel replicas, zb-h1 (split backward: each stage's mean starts after its last W,
    overlapped with the rest of the step): the replicas hold the same bits, the losses those of one
    process within 1e-6."""
    results = run_ranks(gpt_params, validate(BASE.updated(dp=2, nproc=2, schedule="zb-h1")))
    a, b = results[0]["params"], results[1]["params"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    got, ref = losses(results[0]["history"]), losses(one_process())
    assert max(abs(x - y) for x, y in zip(got, ref)) < 1e-6


@pytest.mark.parametrize("split", ["2,0", "0,2"])
def test_a_given_layer_split_trains_bitwise_like_one_process(split: str) -> None:
    """``layers_per_stage`` (what `plan --emit` writes for its split): the first stage with both blocks
    and the head alone on the last, or the embedding alone on the first."""
    results = run_ranks(gpt_params, validate(BASE.updated(pp=2, nproc=2, layers_per_stage=split)))
    # modules by global index: 0 the embedding, 1-2 the blocks, 3 the head
    held = [sorted({int(n.split(".")[1]) for n in r["params"]}) for r in sorted(results, key=lambda r: r["coords"])]
    assert held == ([[0, 1, 2], [3]] if split == "2,0" else [[0], [1, 2, 3]]), held
    assert losses(results[0]["history"]) == losses(one_process())
