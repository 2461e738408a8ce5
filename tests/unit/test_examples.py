"""Examples and the demo keep running (they are what users copy first)."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_compare_offload_example(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "compare_offload.py"), "--ranks", "4",
                             "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert len(list(tmp_path.glob("*.png"))) == 5
    rows = {(w[0], w[1]): {w[i]: float(w[i + 1].rstrip("%")) for i in (2, 4, 6, 8)}
            for w in (line.split() for line in result.stdout.splitlines()[1:])}
    # 1F1B on paper (d = 4, m = 16, F = 1, B = I + W = 2): (m + d - 1) * 3 = 57, busy 48, bubble 1 - 48/57;
    # the first rank holds d microbatches' activations at its peak
    assert rows[("1f1b", "offload=none")] == {"makespan": 57.0, "bubble": 15.8, "memory": 4.0, "stall": 0.0}
    zbv, group = rows[("zb-v", "offload=none")], rows[("group-interleaved", "offload=none")]
    assert zbv["memory"] == 4.0 and zbv["bubble"] < group["bubble"] < 15.8  # ZB-V: 1F1B's memory, less bubble
    first, full = rows[("group-interleaved", "offload=first:1")], rows[("group-interleaved", "offload=all")]
    assert full["memory"] <= first["memory"] < group["memory"] < 4.0  # offload lowers the peak ...
    assert full["makespan"] == first["makespan"] == group["makespan"] and full["stall"] == 0  # ... at no time


def test_demo_simulation_tour(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "pipeoffload.demo", "--no-train", "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "PipeOffload g=4, v=2" in result.stdout and (tmp_path / "report.html").exists()


@pytest.mark.parametrize("argv, piece", [
    (["compare_offload.py", "--ranks", "0"], "num_ranks=0: must be an integer >= 1"),
    (["compare_offload.py", "--offload-ratio", "-1"], "offload ratio k=-1.0: must be >= 0"),
    (["train_pipeline.py", "--spawn", "2", "--offload", "bogus"], "offload='bogus': the policy is not understood"),
    (["train_own_model.py", "--pp", "0"], "pp=0: must be >= 1"),
])
def test_an_example_given_a_bad_value_says_it_in_one_line(tmp_path: Path, argv: list[str], piece: str) -> None:
    """A user's first typo in an example was a ConfigError traceback (from every spawned rank in
    train_pipeline.py), exit 1."""
    result = subprocess.run([sys.executable, str(ROOT / "examples" / argv[0]), *argv[1:]], capture_output=True,
                            text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.startswith(f"{argv[0]}: error: {piece}"), result.stderr
    assert len(result.stderr.splitlines()) == 1 and not list(tmp_path.iterdir()), result.stderr
