"""A real headless Chromium driven by Playwright: Debian's `chromium` (never a downloaded browser).

Skipped, with the reason, only when the playwright package or a system Chromium is missing
(`.ci/run` installs Debian's chromium first). Set PIPEOFFLOAD_CHROMIUM to use another binary.
"""
import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium_path() -> str | None:
    given = os.environ.get("PIPEOFFLOAD_CHROMIUM")
    if given:
        return given
    return next((p for p in map(shutil.which, CANDIDATES) if p), None)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One browser per test module (launching costs about a second)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    path = chromium_path()
    if path is None:
        pytest.skip("no system Chromium (apt-get install chromium; .ci/run does it)")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=path, args=["--no-sandbox", "--disable-gpu"])
        yield launched
        launched.close()


class Console:
    """Console errors and uncaught page errors of one page."""

    def __init__(self, page: Any) -> None:
        self.errors: list[str] = []
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))
