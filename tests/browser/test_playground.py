"""The playground in a real headless Chromium: loads cleanly, redraws on input, shows the CLI's
message for bad input, and its numbers are `simulate --json`'s."""
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from pipeoffload.web.server import make_server
from tests.browser.conftest import Console
from tests.conftest import run_cli


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    server = make_server(0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def page(browser: Any, base: str) -> Iterator[tuple[Any, Console]]:
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    console = Console(page)
    page.goto(base + "/")
    page.wait_for_selector("#chart svg .box", timeout=30_000)
    yield page, console
    page.close()



def _set(page: Any, name: str, value: str) -> None:
    if name == "family":
        page.select_option("[name=family]", value)
        return
    page.fill(f"[name={name}]", value)
    page.dispatch_event(f"[name={name}]", "change")


def _wait_ranks(page: Any, ranks: int) -> None:
    page.wait_for_selector(f"#chart svg[data-ranks='{ranks}']:not(.stale)", timeout=30_000)
    page.wait_for_function("!document.getElementById('chart').classList.contains('stale')", timeout=30_000)


def test_page_loads_without_console_errors(page: tuple[Any, Console]) -> None:
    p, console = page
    assert console.errors == []
    assert p.locator("#chart svg path.device").count() == 8  # default 8 ranks: one memory curve each
    assert p.is_hidden("#error")
    assert "rank units" in p.inner_text("#numbers") and "(t)" in p.inner_text("#numbers")


def test_numbers_on_the_page_are_simulate_json(page: tuple[Any, Console]) -> None:
    p, console = page
    _set(p, "family", "group-interleaved")
    _set(p, "ranks", "4")
    _set(p, "microbatches", "8")
    _set(p, "group_size", "2")
    _set(p, "offload", "all")
    _wait_ranks(p, 4)
    p.wait_for_function("document.querySelector('#command').textContent.includes('--offload all') && "
                        "document.querySelector('#command').textContent.includes('--group-size 2')")
    command = p.inner_text("#command").split()
    assert command[:2] == ["pipeoffload", "simulate"]
    code, out, err = run_cli(*command[1:], "--json")
    assert code == 0, (command, err)
    expected = json.loads(out)
    cells = p.locator("#numbers td[data-key]")
    assert cells.count() >= 6
    for i in range(cells.count()):
        key, value = cells.nth(i).get_attribute("data-key"), cells.nth(i).get_attribute("data-value")
        assert json.loads(value or "null") == expected[key], key
    shown = p.locator("#numbers td[data-key=makespan]").inner_text()
    assert float(shown) == pytest.approx(expected["makespan"], rel=1e-5)
    assert expected["offloaded"] > 0 and p.locator("#chart rect.box[fill='#C44E52']").count() == expected["offloaded"]
    assert console.errors == []


def test_changing_an_input_redraws_the_chart(page: tuple[Any, Console]) -> None:
    p, console = page
    _set(p, "ranks", "4")
    _wait_ranks(p, 4)
    before = int(p.get_attribute("#chart svg", "data-boxes") or 0)
    _set(p, "ranks", "6")
    _set(p, "microbatches", "12")
    _wait_ranks(p, 6)
    after = int(p.get_attribute("#chart svg", "data-boxes") or 0)
    assert after > before > 0
    assert p.locator("#chart svg path.device").count() == 6
    assert p.locator("#chart svg rect.box").count() == after
    assert console.errors == []


def test_bad_input_shows_the_cli_message(page: tuple[Any, Console]) -> None:
    p, console = page
    _set(p, "ranks", "0")
    p.wait_for_selector("#error:not([hidden])", timeout=30_000)
    _, _, err = run_cli("simulate", "group-interleaved", "--ranks", "0")
    message = p.inner_text("#error")
    # the check behind the CLI's flag, in the same words, named by the field the page sends
    assert message.startswith("ranks: ") and err.rstrip().endswith(message.removeprefix("ranks: "))
    _set(p, "ranks", "4")
    p.wait_for_selector("#error[hidden]", state="attached", timeout=30_000)
    _set(p, "offload", "sometimes")
    p.wait_for_function("document.getElementById('error').textContent.includes('sometimes')", timeout=30_000)
    assert "valid forms" in p.inner_text("#error")
    _set(p, "offload", "none")
    p.wait_for_selector("#error[hidden]", state="attached", timeout=30_000)
    assert console.errors == []
