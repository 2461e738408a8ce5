"""docs/gallery's pictures are what docs/make_gallery.py draws today: the generator records a hash of
what each picture shows (chart data, texts, legend entries and colours; ``drawn_facts``), recomputed
here. The committed pictures had gone stale (no I -> W offload ticks, a host scale of 4.02 where the
chart code says 3.5, an old title) and nothing noticed. Pixels are not compared."""
import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
# line plots that benchmarks draw (docs/offload.md names their commands), not timeline charts
OTHER_GENERATORS = {"gallery/faster_link.png": "benchmarks/replay_at_smaller_k.py",
                    "gallery/stall_budget.png": "benchmarks/stall_budget.py"}
REGENERATE = "the gallery is stale: regenerate it with `.venv/bin/python docs/make_gallery.py` and commit docs/"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_gallery", DOCS / "make_gallery.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _recorded() -> list[dict]:
    path = DOCS / "gallery" / "facts.json"
    return json.loads(path.read_text()) if path.exists() else []


def test_every_picture_has_recorded_facts() -> None:
    pictures = {f"gallery/{p.name}" for p in (DOCS / "gallery").glob("*.png")} - set(OTHER_GENERATORS)
    assert pictures and pictures == {entry["picture"] for entry in _recorded()}, REGENERATE


@pytest.mark.parametrize("entry", _recorded() or [None], ids=lambda e: e["picture"] if e else "none")
def test_each_picture_shows_what_the_generator_draws_today(entry: dict | None) -> None:
    assert entry is not None, REGENERATE
    gallery = _generator()
    assert gallery.drawn_facts(gallery.run(*entry["run"])) == entry["facts"], f"{entry['picture']}: {REGENERATE}"



def test_no_amount_of_one_is_written_in_the_plural() -> None:
    """gallery.md said "device peak 1 rank units" (the at-scale picture's numbers): an amount of 1 takes
    the singular, as every other output (``units.rank_units``)."""
    text = (DOCS / "gallery.md").read_text()
    assert not re.findall(r"(?<![\d.(])1 (?:rank|activation) units", text), REGENERATE


def test_the_at_scale_numbers_are_what_the_generator_writes_today() -> None:
    gallery = _generator()
    name, d, m, v = gallery.LARGE
    written = gallery.at_scale(gallery.run(name, d, m, v, offload="all"))
    assert "device peak 1 rank unit," in written, written
    assert written in (DOCS / "gallery.md").read_text(), REGENERATE
