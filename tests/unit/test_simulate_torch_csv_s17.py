"""`pipeoffload simulate FILE.csv` reads the CSV torch.distributed.pipelining writes too (its
``_dump_csv(format="compute_only")``, which ``torch_interop`` reads): DualPipeV's overlapped forward+backward
cells ``(a;b)OVERLAP_F_B`` become a then b, its bubbles (empty cells) and bookkeeping cells are skipped.
The form is told from the cells; the reader is torch-free (``ir.expand_overlaps``)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeoffload import SimulateRequest, run
from pipeoffload.errors import ConfigError

# torch 2.13's DualPipeV order for 2 ranks, 4 microbatches (``torch_order_csv("DualPipeV", 2, 4, 2)``), with
# a bubble and a gradient-sync cell as torch's CSVs may hold them
TORCH_DUALPIPEV = (
    "0F0,0F1,0F2,3F0,3I0,3W0,3F1,(0F3;3B1)OVERLAP_F_B,(3F2;0B0)OVERLAP_F_B,3B2,(3F3;0B1)OVERLAP_F_B,3B3,"
    "0I2,0W2,0I3,0W3\n"
    "1F0,2F0,1F1,2F1,1F2,2B0,(2F2;1B0)OVERLAP_F_B,(1F3;2B1)OVERLAP_F_B,(2F3;1B1)OVERLAP_F_B,2B2,1B2,2I3,1I3,"
    "2W3,1W3\n"
)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeoffload", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def test_torchs_csv_simulates_as_the_family_it_is(tmp_path: Path) -> None:
    rows = TORCH_DUALPIPEV.splitlines()
    (tmp_path / "torch.csv").write_text(f"{rows[0]},,0REDUCE_GRAD\n{rows[1].replace('2B0,', '2B0,,', 1)}\n")
    policy = ["--offload", "all", "--json"]
    from_file = _cli("simulate", "torch.csv", *policy, cwd=tmp_path)
    generated = _cli("simulate", "dualpipe-v", "-d", "2", "-m", "4", *policy, cwd=tmp_path)
    assert from_file.returncode == 0, from_file.stderr
    mine, theirs = json.loads(from_file.stdout), json.loads(generated.stdout)
    assert mine.pop("schedule") == "torch" and theirs.pop("schedule") == "dualpipe-v"
    assert mine == theirs


def test_the_python_api_reads_torchs_csv(tmp_path: Path) -> None:
    path = tmp_path / "dualpipev.csv"
    path.write_text(TORCH_DUALPIPEV)
    result = run(SimulateRequest(schedule_file=str(path), offload_ratio=0.5))
    same = run(SimulateRequest("dualpipe-v", ranks=2, microbatches=4, offload_ratio=0.5))
    assert result.timeline.schedule.actions == same.timeline.schedule.actions
    assert result.timeline.makespan == same.timeline.makespan


def test_a_bad_cell_inside_an_overlap_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.csv").write_text(TORCH_DUALPIPEV.replace("(0F3;3B1)", "(0F3;3X1)"))
    with pytest.raises(ConfigError, match=r"schedule file '.*bad.csv': .*cannot parse action '3X1'"):
        run(SimulateRequest(schedule_file=str(tmp_path / "bad.csv")))


def test_the_literal_is_what_torch_writes() -> None:
    pytest.importorskip("torch.distributed.pipelining")
    from pipeoffload.torch_interop import torch_order_csv

    assert torch_order_csv("DualPipeV", 2, 4, 2) == TORCH_DUALPIPEV
