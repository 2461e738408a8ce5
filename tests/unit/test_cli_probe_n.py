"""Probe N (a fresh install and the docs as written): the messages, docs and results files it found wrong."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeoffload.cli.common import EXTRAS
from tests.conftest import refused, run_cli

ROOT = Path(__file__).resolve().parents[2]

# ``python -m pipeoffload.runtime`` (runpy imports the package first, as -m does) with the extra's
# packages hidden, as in test_extras
RUNTIME_WITHOUT_EXTRAS = ("import runpy, sys\nfor name in {names!r}: sys.modules[name] = None\n"
                          "sys.argv = ['pipeoffload.runtime', '--spawn', '2']\n"
                          "runpy.run_module('pipeoffload.runtime', run_name='__main__', alter_sys=True)")


def test_python_m_runtime_without_torch_is_the_extra_line_not_a_traceback() -> None:
    """It printed a traceback: runtime/__init__ imported torch before ``__main__`` ran."""
    code = RUNTIME_WITHOUT_EXTRAS.format(names=sorted(EXTRAS))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr == ("python -m pipeoffload.runtime: error: this command needs torch (the 'train' extra): "
                           "pip install 'pipeoffload[train]'\n")  # the line of the pipeoffload commands


@pytest.mark.parametrize("command", ["simulate 1f1b -d 100000 -m 100000", "compare '1f1b -d 100000 -m 100000'",
                                     "show 1f1b -d 100000 -m 100000"])
def test_a_schedule_too_large_is_refused_in_the_flags_words(command: str) -> None:
    """simulate and compare told a command-line user to "pass max_actions=None"."""
    err = refused(command, "above the limit of 2,000,000", "use fewer ranks (-d) or microbatches (-m)")
    assert "max_actions" not in err


@pytest.mark.parametrize("command", ["generate runs/nonexistent", "export runs/nonexistent --hf out"])
def test_a_run_dir_that_does_not_exist_says_so(command: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """It said "no config.toml", as for a folder that exists without one."""
    monkeypatch.chdir(tmp_path)
    refused(command, "RUN_DIR 'runs/nonexistent' does not exist")
    assert list(tmp_path.iterdir()) == []


def test_the_playground_doc_names_the_trace_upload_among_the_200_answers() -> None:
    """POST /api/trace answers a file it cannot draw with 200 (web/server.py, as /api/chart does); the
    doc named only /api/chart."""
    page = (ROOT / "docs" / "playground.md").read_text()
    start = page.index("Bad input answers")
    sentence = " ".join(page[start:page.index("Every error has that shape", start)].split())
    assert "`/api/chart` and `POST /api/trace`" in sentence and "HTTP status 200" in sentence


def test_plan_emit_refuses_a_name_that_is_not_toml(tmp_path: Path) -> None:
    """It wrote a train config (TOML) into x.json without a word."""
    out = tmp_path / "x.json"
    refused(f"plan --model gpt3-1.3b --gpus 8 --global-batch 16 --memory 40 --emit {out}",
            f"--emit {out}: a train config (TOML) is written there, but the name ends in '.json'", ".toml")
    assert not out.exists()


RESULTS = ("flash_attention_assumption", "planner_accuracy", "plan_pp_vs_tp_paper", "offload_vs_reference",
           "plan_identity")


@pytest.mark.parametrize("name", RESULTS)
def test_each_results_file_names_its_command(name: str) -> None:
    first = (ROOT / "benchmarks" / "results" / f"{name}.txt").read_text().splitlines()[0]
    assert first.startswith(f"# command: .venv/bin/python benchmarks/{name}.py "), first


def test_plan_identity_check_reads_its_digest_file_past_the_command_line() -> None:
    spec = importlib.util.spec_from_file_location("plan_identity", ROOT / "benchmarks" / "plan_identity.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    digests = module.recorded_digests((ROOT / "benchmarks" / "results" / "plan_identity.txt").read_text())
    assert len(digests) == 196 and all(re.fullmatch("[0-9a-f]{16}", d) for d in digests.values())


def _readme_block() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("$ pipeoffload schedules")
    return text[start:text.index("```", start)]


def test_the_readme_schedules_sample_lists_the_families_in_the_printed_order() -> None:
    code, out, _ = run_cli("schedules")
    assert code == 0
    printed = [line.split()[0] for line in out.splitlines()]
    comment = " ".join(line.split("#", 1)[1] for line in _readme_block().splitlines()[:2])
    assert [name.strip() for name in comment.split(",")] == printed


def test_the_readme_show_sample_is_the_head_of_the_real_output() -> None:
    code, out, _ = run_cli("show", "1f1b", "--ranks", "3", "--microbatches", "4")
    assert code == 0
    sample = _readme_block().split("$ pipeoffload show 1f1b --ranks 3 --microbatches 4\n")[1]
    shown = [line for line in sample.splitlines() if line.strip() != "..."]
    assert shown == out.splitlines()[:len(shown)] and shown[0].startswith("# 1f1b: ranks=3")
