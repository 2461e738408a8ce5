"""The pure core never imports torch: only runtime/, models/ and profiling code may."""
import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "pipeoffload"
TORCH_ALLOWED = ("runtime", "models", "train", "profiling.py", "torch_interop.py")


def _core_modules() -> list[Path]:
    return [p for p in PACKAGE.rglob("*.py") if not p.relative_to(PACKAGE).parts[0].startswith(TORCH_ALLOWED)]


def test_no_core_module_imports_torch_at_top_level() -> None:
    offenders = []
    for path in _core_modules():
        for node in ast.parse(path.read_text()).body:
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            if any(n == "torch" or n.startswith("torch.") for n in names):
                offenders.append(str(path.relative_to(PACKAGE)))
    assert not offenders, f"pure-core modules import torch: {offenders}"


def test_the_scan_covers_the_core_packages() -> None:
    """The exclusion list must not swallow a core package: each one named in the standards is scanned."""
    scanned = {p.relative_to(PACKAGE).parts[0] for p in _core_modules()}
    for name in ("ir.py", "semantics.py", "simulator.py", "validation.py", "costs.py", "passes", "schedules",
                 "planner", "viz", "service", "cli", "web"):
        assert name in scanned, f"pipeoffload/{name} is not scanned for torch imports"


def test_importing_the_core_and_cli_does_not_load_torch() -> None:
    modules = sorted(
        ".".join(("pipeoffload",) + p.relative_to(PACKAGE).with_suffix("").parts).removesuffix(".__init__")
        for p in _core_modules() if p.name != "__main__.py"
    )
    code = "import sys\n" + "".join(f"import {m}\n" for m in modules) + \
        "from pipeoffload.cli import build_parser\nbuild_parser()\nprint('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
