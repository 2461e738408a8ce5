"""Examples and the demo keep running (they are what users copy first)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_compare_offload_example(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "compare_offload.py"), "--ranks", "4",
                             "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "offload=all" in result.stdout and len(list(tmp_path.glob("*.png"))) == 5


def test_demo_simulation_tour(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "pipeoffload.demo", "--no-train", "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "PipeOffload g=4, v=2" in result.stdout and (tmp_path / "report.html").exists()
