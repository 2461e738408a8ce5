"""A full disk at a save (a 1.8 MB tmpfs, in a private mount namespace: room for one checkpoint): the run stops saying
"disk full", the last complete checkpoint stays intact, nothing partial is left, and the run resumes
once space is freed. Skipped where mounting a tmpfs is not allowed."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeoffload.train.checkpoint import list_checkpoints, verify

pytestmark = pytest.mark.dist

SMALL = "--layers 2 --hidden 32 --seq-len 32 --global-batch 8 --microbatches 2 --warmup 1 --no-progress"
SCRIPT = """
set -u
mount -t tmpfs -o size=1800k tmpfs "$1" || exit 77
cd "$2"
{py} -m pipeoffload train {small} --steps 4 --save-every 2 --out "$1/run" >a.out 2>a.err; echo $? >a.rc
ls -a "$1/run/checkpoints" >a.ls
cp -r "$1/run" full
mount -o remount,size=20m "$1"
{py} -m pipeoffload train --resume "$1/run" >b.out 2>b.err; echo $? >b.rc
cp -r "$1/run" resumed
"""


def test_disk_full_during_a_save(tmp_path: Path) -> None:
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1): cannot mount a small tmpfs here")
    mnt, out = tmp_path / "mnt", tmp_path / "out"
    mnt.mkdir()
    out.mkdir()
    script = SCRIPT.format(py=sys.executable, small=SMALL)
    done = subprocess.run(["unshare", "--mount", "sh", "-c", script, "sh", str(mnt), str(out)],
                          capture_output=True, text=True, timeout=600)
    if done.returncode == 77 or not (out / "a.rc").exists():
        pytest.skip(f"cannot mount a tmpfs in a private mount namespace here: {done.stderr.strip()[:200]}")
    err = (out / "a.err").read_text()
    assert (out / "a.rc").read_text().strip() == "1", err
    last = err.strip().splitlines()[-1]
    assert "disk full" in last and "step-000002" in last and "--resume" in last, err
    assert "Traceback" not in err and "CheckpointException" not in err
    assert not [n for n in (out / "a.ls").read_text().split() if n.startswith(".tmp-")]
    found = list_checkpoints(out / "full")
    assert [p.name for p in found] == ["step-000002"]
    verify(found[0])  # intact: every file present and matching its checksum
    assert (out / "b.rc").read_text().strip() == "0", (out / "b.err").read_text()
    steps = [json.loads(line)["step"] for line in (out / "resumed" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
