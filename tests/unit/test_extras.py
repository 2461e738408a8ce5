"""`pip install pipeoffload` without the `train` extra: planner, simulator and pictures work; a command
that needs the extra says so in one line naming the install command (exit 2).

The extra's packages are hidden in a fresh interpreter (``sys.modules[name] = None`` makes importing
them fail as if they were not installed); CI also installs the wheel into a venv without them (.ci/run).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pipeoffload.cli.common import EXTRAS

HIDE = "import sys\nfor name in {names!r}: sys.modules[name] = None\nfrom pipeoffload.cli import main\nsys.exit(main(sys.argv[1:]))"


def run_without_extras(*argv: str) -> subprocess.CompletedProcess[str]:
    code = HIDE.format(names=sorted(EXTRAS))
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)


def test_the_planner_simulator_and_pictures_run_without_the_train_extra(tmp_path: Path) -> None:
    chart = tmp_path / "zb-v.png"
    done = run_without_extras("simulate", "zb-v", "--ranks", "4", "--microbatches", "8", "--offload", "all",
                              "--plot", str(chart))
    assert done.returncode == 0, done.stderr
    assert "bubble" in done.stdout and chart.stat().st_size > 1000
    done = run_without_extras("plan", "--model", "gpt3-13b", "--gpus", "4", "--global-batch", "8", "--memory", "80")
    assert done.returncode == 0, done.stderr
    assert "PP" in done.stdout


def test_a_command_that_needs_the_extra_names_the_install_command(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = run_without_extras("train", "--steps", "1", "--out", str(out))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "pip install 'pipeoffload[train]'" in lines[0] and "torch" in lines[0]
    assert not out.exists()
