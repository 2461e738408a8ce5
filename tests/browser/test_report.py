"""`pipeoffload compare`'s page in a real headless Chromium: it renders offline with no console errors,
every chart decodes, and the table shows the JSON numbers under unambiguous labels."""
import contextlib
import io
import json
from pathlib import Path
from typing import Any

from pipeoffload.cli import main
from tests.browser.conftest import Console


def test_compare_report_renders_offline(browser: Any, tmp_path: Path) -> None:
    page_file = tmp_path / "report.html"
    specs = ["1f1b -d 4 -m 8", "group-interleaved -d 4 -m 8 -g 2 --offload all --offload-ratio 0.5"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["compare", *specs, "-o", str(page_file), "--json"]) == 0
    rows = json.loads(out.getvalue())
    context = browser.new_context(offline=True)  # self-contained: nothing may come from the network
    page = context.new_page()
    console = Console(page)
    page.goto(page_file.as_uri())
    page.wait_for_load_state("load")
    assert console.errors == []
    widths = page.eval_on_selector_all("img", "imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)")
    assert len(widths) == 2 and all(w > 500 for w in widths)
    table = page.locator("#summary tr[data-row]")
    assert table.count() == 2
    for i, row in enumerate(rows):
        cells = table.nth(i).locator("td")
        assert cells.nth(0).inner_text() == f"{i + 1}. {row['label']}"
        assert cells.nth(1).inner_text() == row["command"]
        assert float(cells.nth(2).inner_text()) == row["makespan"]
        assert float(cells.nth(4).inner_text()) == row["peak_rank_units"]
        assert float(cells.nth(5).inner_text()) == row["peak_host_rank_units"]
    context.close()
