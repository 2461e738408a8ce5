"""The README's Python block runs and prints what the CLI command its comment names prints."""
from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

from tests.conftest import run_cli

README = Path(__file__).resolve().parents[2] / "README.md"


def _python_block() -> str:
    text = README.read_text()
    start = text.index("From Python:")
    return re.search(r"```python\n(.*?)```", text[start:], re.S).group(1)  # type: ignore[union-attr]


def test_the_readme_python_block_equals_the_cli_it_names() -> None:
    """Its CostModel is per stage: written per rank (f=1 with two stages per rank) it printed a
    makespan of 211.5 against the command's 106.5 t."""
    block = _python_block()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, "README.md", "exec"), {})  # noqa: S102 - the README's own code
    makespan, bubble, peak, stall = (float(x) for x in out.getvalue().split())
    command = re.search(r"`pipeoffload (simulate [^`]*)`", block.replace("\n# ", " ")).group(1)  # type: ignore[union-attr]
    code, cli, err = run_cli(*command.split(), "--json")
    assert code == 0, err
    data = json.loads(cli)
    assert makespan == data["makespan"] and round(makespan, 6) == 106.5
    assert abs(bubble - data["bubble_ratio"]) < 1e-12 and stall == 0
    assert peak == max(r["peak_rank_units"] for r in data["per_rank"])
    printed = re.search(r"# ([0-9.]+) ([0-9.]+) ([0-9.]+) ([0-9.]+): ", block).groups()  # type: ignore[union-attr]
    assert [float(x) for x in printed] == [round(makespan, 4), round(bubble, 4), peak, stall]
