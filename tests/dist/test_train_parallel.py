"""`pipeoffload train` on spawned gloo ranks equals one process: PP bitwise, PP x DP within 1e-6."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from train_workers import gpt_params  # noqa: E402

from pipeoffload.train.config import TrainConfig, validate  # noqa: E402
from pipeoffload.train.launch import run_ranks  # noqa: E402

pytestmark = pytest.mark.dist

BASE = TrainConfig(layers=2, hidden=32, heads=4, seq_len=32, global_batch=8, microbatches=2, steps=3,
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
        out += [f"--{key.replace('_', '-')}", str(getattr(cfg, key))]
    return out + ["--no-progress"]


def test_pipeline_only_4_ranks_equals_one_process_bitwise(tmp_path: Path) -> None:
    """`pipeoffload train --nproc 4 --pp 4` (1F1B, offload all): every loss torch.equal to one process."""
    run = cli(*flags(BASE), "--pp", "4", "--nproc", "4", "--offload", "all", "--out", str(tmp_path / "run"))
    assert run.returncode == 0, run.stderr
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    ref = one_process()
    assert torch.equal(torch.tensor(losses(metrics)), torch.tensor(losses(ref)))
    assert [m["val_loss"] for m in metrics] == [h["val_loss"] for h in ref]
    for m in metrics:  # the schema of metrics.jsonl
        assert len(m["peak_act_bytes"]) == len(m["sim_peak_act_bytes"]) == len(m["host_bytes"]) == 4
        assert m["cuda_max_allocated"] is None and m["tokens_per_s"] > 0
        assert m["peak_act_bytes"] == [int(x) for x in m["sim_peak_act_bytes"]]  # measured = simulated
        assert max(m["host_bytes"]) > 0  # offload all put activations on the host


def test_pp_x_dp_replicas_bitwise_equal_and_close_to_one_process() -> None:
    cfg = validate(replace(BASE, pp=2, dp=2, nproc=4, schedule="interleaved-1f1b"))
    results = run_ranks(gpt_params, cfg)
    by_coords = {r["coords"]: r for r in results}
    for pp_rank in range(2):
        a, b = by_coords[(0, pp_rank, 0)]["params"], by_coords[(1, pp_rank, 0)]["params"]
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    got, ref = losses(results[0]["history"]), losses(one_process())
    assert len(got) == len(ref) == 3
    assert max(abs(x - y) for x, y in zip(got, ref)) < 1e-6
    assert got != losses([{"loss": 0.0}] * 3)
