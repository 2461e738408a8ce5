"""`pipeoffload simulate FILE`: a schedule written as data (the JSON, text and CSV forms `show --format`
writes) simulates exactly as the family it was written from; the file sets the sizes, and every mistake
is one line with exit code 2. The playground never reads a file."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeoffload import SimulateRequest, run
from pipeoffload.errors import ConfigError
from pipeoffload.web.server import RequestError, request_from_query


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeoffload", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def _written(tmp_path: Path, fmt: str, family: str = "zb-v", ranks: int = 2, m: int = 4) -> Path:
    shown = _cli("show", family, "-d", str(ranks), "-m", str(m), "--format", fmt, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    path = tmp_path / f"mine.{'txt' if fmt == 'text' else fmt}"
    path.write_text(shown.stdout)
    return path


@pytest.mark.parametrize("fmt", ["json", "text", "csv"])
def test_a_written_schedule_simulates_as_its_family(tmp_path: Path, fmt: str) -> None:
    path = _written(tmp_path, fmt)
    policy = ["--offload", "all", "--json"]
    from_file = _cli("simulate", path.name, *policy, cwd=tmp_path)
    generated = _cli("simulate", "zb-v", "-d", "2", "-m", "4", *policy, cwd=tmp_path)
    assert from_file.returncode == 0, from_file.stderr
    mine, theirs = json.loads(from_file.stdout), json.loads(generated.stdout)
    mine.pop("schedule"), theirs.pop("schedule")  # the file's name (text/csv: the file's stem)
    assert mine == theirs


def test_the_python_api_takes_a_schedule_file(tmp_path: Path) -> None:
    path = _written(tmp_path, "json", "interleaved-1f1b", 2, 4)
    request = SimulateRequest(schedule_file=str(path), offload="all", offload_ratio=0.5)
    result, same = run(request), run(SimulateRequest("interleaved-1f1b", ranks=2, microbatches=4, offload="all",
                                                     offload_ratio=0.5))
    assert result.timeline.makespan == same.timeline.makespan
    assert [r.peak_activation_units for r in result.timeline.per_rank] == \
        [r.peak_activation_units for r in same.timeline.per_rank]
    assert request.command() == ["pipeoffload", "simulate", str(path), "--offload", "all", "--offload-ratio", "0.5"]


@pytest.mark.parametrize("args, expected", [
    (["-d", "3"], "--ranks 3 but schedule file 'mine.json' has 2 ranks"),
    (["-m", "8"], "--microbatches with schedule file 'mine.json': the file sets the sizes"),
    (["-v", "2"], "--stages-per-rank with schedule file"),
])
def test_sizes_beside_a_file_are_refused(tmp_path: Path, args: list[str], expected: str) -> None:
    _written(tmp_path, "json")
    out = _cli("simulate", "mine.json", *args, cwd=tmp_path)
    assert out.returncode == 2 and expected in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


@pytest.mark.parametrize("name, text, expected", [
    ("missing.json", None, "schedule file 'missing.json': cannot read it (FileNotFoundError"),
    ("typo.txt", "0F0 0X1\n", "schedule file 'typo.txt': rank 0, step 1: cannot parse action '0X1'"),
    ("nob.txt", "0F0 0F1\n", "stage 0, microbatch 0 has no B"),
    ("odd.json", '{"actions": []}', "schedule file 'odd.json': schedule JSON without the field(s)"),
])
def test_a_broken_file_is_one_line_and_exit_2(tmp_path: Path, name: str, text: str | None, expected: str) -> None:
    if text is not None:
        (tmp_path / name).write_text(text)
    out = _cli("simulate", name, cwd=tmp_path)
    assert out.returncode == 2 and expected in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_request_refusals_name_the_fields() -> None:
    with pytest.raises(ConfigError, match="family='1f1b' and schedule file 'a.json': the file is the schedule"):
        SimulateRequest("1f1b", schedule_file="a.json")
    with pytest.raises(ConfigError, match=r"schedule file 'a\.yaml': name a schedule file ending in \.json"):
        SimulateRequest(schedule_file="a.yaml")
    with pytest.raises(ConfigError, match="family is missing"):
        SimulateRequest()


def test_the_playground_never_reads_a_file() -> None:
    with pytest.raises(RequestError, match="unknown parameter"):
        request_from_query({"schedule_file": ["/etc/passwd.json"]})
