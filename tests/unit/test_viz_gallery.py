"""docs/gallery.md agrees with the command line: each row's command reproduces its numbers (one unit
convention in docs and CLI), and every picture it links is a real PNG."""
import contextlib
import io
import json
import re
import shlex
from pathlib import Path

import pytest

from pipeoffload.cli import main

DOCS = Path(__file__).resolve().parents[2] / "docs"
ROW = re.compile(r"^\| `(?P<name>[^`]+)` \| (?P<offload>\w+) \| (?P<v>\d+) \| (?P<makespan>[\d.]+) \| [\d.]+% \| "
                 r"(?P<peak>[\d.]+) \| (?P<host>[\d.]+) \| [\d.]+ \| \[png\]\((?P<png>[^)]+)\) \| `(?P<cmd>[^`]+)` \|$")


def _rows() -> list[dict[str, str]]:
    return [m.groupdict() for line in (DOCS / "gallery.md").read_text().splitlines() if (m := ROW.match(line))]


def test_gallery_has_rows_with_and_without_offload() -> None:
    rows = _rows()
    assert len(rows) >= 12 and {r["offload"] for r in rows} == {"none", "all"}


@pytest.mark.parametrize("row", _rows(), ids=lambda r: f"{r['name']}-{r['offload']}")
def test_gallery_row_is_what_its_command_prints(row: dict[str, str]) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([*shlex.split(row["cmd"])[1:], "--json"]) == 0
    data = json.loads(out.getvalue())
    assert f"{data['makespan']:.4g}" == row["makespan"]
    assert f"{data['peak_rank_units']:.3g}" == row["peak"]
    assert f"{data['peak_host_rank_units']:.3g}" == row["host"]
    picture = DOCS / row["png"]
    assert picture.read_bytes()[:4] == b"\x89PNG" and picture.stat().st_size > 20_000
