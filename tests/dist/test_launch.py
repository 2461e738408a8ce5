"""The runtime runs under torchrun (environment rendezvous), not only under our spawn helper."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.dist


def test_torchrun_two_ranks(tmp_path):
    trace = tmp_path / "trace.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "pipeoffload.runtime", "--schedule", "interleaved-1f1b", "--stages-per-rank", "2",
           "--steps", "2", "--trace", str(trace)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env={"OMP_NUM_THREADS": "1",
                          **os.environ})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "step 1 loss" in done.stderr + done.stdout
    assert "peak activation bytes per rank" in done.stdout
    data = json.loads(trace.read_text())  # written atomically, with each rank's true peak beside the events
    assert set(data["otherData"]["peak_bytes"]) == {"0", "1"} and data["traceEvents"]


def test_torch_multiprocessing_spawn(tmp_path):
    import torch.multiprocessing as tmp
    from workers import mp_spawn_entry

    tmp.spawn(mp_spawn_entry, args=(2, str(tmp_path)), nprocs=2, join=True)
    first, last = ((tmp_path / f"rank{r}.txt").read_text().split() for r in (0, 1))
    assert first == ["none", "True"] and last[1] == "True" and float(last[0]) > 0
