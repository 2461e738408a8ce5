"""The layer contract of docs/architecture.md (``[tool.importlinter]`` in pyproject.toml, run by `make lint`)
holds for the package, and fails when a module imports a layer above its own."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(source_root: Path, cwd: Path) -> subprocess.CompletedProcess:
    """lint-imports with the project's contract on the ``pipeoffload`` package found under ``source_root``."""
    env = dict(os.environ, PYTHONPATH=str(source_root))
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", str(ROOT / "pyproject.toml")], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_package_keeps_its_layers(tmp_path: Path) -> None:
    done = _lint(ROOT, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 kept, 0 broken" in done.stdout


@pytest.mark.parametrize("module,upward", [
    ("errors.py", "pipeoffload.ir"),  # the old cycle: the error drew its grid through viz -> ir -> errors
    ("planner/search.py", "pipeoffload.service"),
    ("web/server.py", "pipeoffload.cli.simulate"),
    ("runtime/demo.py", "pipeoffload.cli.common"),
])
def test_an_upward_import_breaks_the_contract(tmp_path: Path, module: str, upward: str) -> None:
    copy = tmp_path / "src"
    shutil.copytree(ROOT / "pipeoffload", copy / "pipeoffload", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    path = copy / "pipeoffload" / module
    path.write_text(path.read_text() + f"\nimport {upward}  # injected by the test\n")
    done = _lint(copy, tmp_path)
    importer = "pipeoffload." + module.removesuffix(".py").replace("/", ".")
    assert done.returncode != 0
    assert "0 kept, 1 broken" in done.stdout and f"{importer} -> {upward}" in done.stdout, done.stdout
