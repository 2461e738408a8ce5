"""The playground in a real headless Chromium: loads cleanly, redraws on input, shows the CLI's
message for bad input, and its numbers are `simulate --json`'s."""
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.browser.conftest import Console
from tests.conftest import run_cli


@pytest.fixture(scope="module")
def tab(browser: Any) -> Iterator[tuple[Any, Console]]:
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    yield page, Console(page)
    page.close()


@pytest.fixture
def page(tab: tuple[Any, Console], base: str) -> tuple[Any, Console]:
    """The module's tab on a fresh playground: every test starts from the page's defaults, whichever tests
    ran before it in this worker (pytest-xdist spreads a module's tests over workers)."""
    page, console = tab
    page.goto(base + "/")
    page.wait_for_selector("#chart:not(.stale) svg .box", timeout=30_000)
    console.errors.clear()
    return page, console



def _set(page: Any, name: str, value: str) -> None:
    if name in ("family", "backward"):
        page.select_option(f"[name={name}]", value)
        return
    page.fill(f"[name={name}]", value)
    page.dispatch_event(f"[name={name}]", "change")


def _wait_ranks(page: Any, ranks: int) -> None:
    # selectors, not wait_for_function: the page's CSP forbids the eval that a JavaScript predicate needs
    page.wait_for_selector(f"#chart:not(.stale) svg[data-ranks='{ranks}']", timeout=30_000)


def _draw_zb_h1_offloaded(page: Any) -> None:
    """zb-h1 on 4 ranks, 8 microbatches, everything offloaded (both windows' copies), drawn."""
    for name, value in (("family", "zb-h1"), ("ranks", "4"), ("microbatches", "8"), ("offload", "all")):
        _set(page, name, value)
    _wait_drawn(page, "--microbatches 8 --offload all")


def _wait_drawn(page: Any, words: str) -> None:
    """Until the chart is drawn for a request whose command line holds ``words`` (the form's last change
    reaches the server after a short delay: a chart of the inputs before it can still be showing)."""
    page.wait_for_selector(f"#command:has-text('{words}')", timeout=30_000)
    page.wait_for_selector("#chart:not(.stale) svg[data-ranks]", timeout=30_000)


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
    p.wait_for_selector("#command:has-text('--offload all'):has-text('--group-size 2')", timeout=30_000)
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
    _set(p, "microbatches", "8")
    _wait_drawn(p, " --microbatches 8")  # 4 ranks is the request's default: not on its command line
    _wait_ranks(p, 4)
    before = int(p.get_attribute("#chart svg", "data-boxes") or 0)
    _set(p, "ranks", "6")
    _set(p, "microbatches", "12")
    _wait_drawn(p, "--ranks 6 --microbatches 12")
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
    p.wait_for_selector("#error:has-text('sometimes')", timeout=30_000)
    assert "valid forms" in p.inner_text("#error")
    _set(p, "offload", "none")
    p.wait_for_selector("#error[hidden]", state="attached", timeout=30_000)
    assert console.errors == []


def _stale(page: Any, selector: str) -> bool:
    return "stale" in (page.get_attribute(selector, "class") or "")


@pytest.mark.parametrize("name,value,message", [
    ("ranks", "1e", "ranks: '1e' is not an integer"), ("ranks", "", "ranks: empty"),
    ("microbatches", "--", "microbatches: '--' is not an integer"), ("time_f", "", "time_f: empty"),
])
def test_a_number_that_does_not_parse_is_an_error_never_the_default(
        page: tuple[Any, Console], name: str, value: str, message: str) -> None:
    p, console = page
    _set(p, "family", "1f1b")
    _set(p, "ranks", "4")
    _set(p, "microbatches", "8")
    _set(p, "time_f", "1")
    _wait_ranks(p, 4)
    _set(p, name, value)
    p.wait_for_selector(f'#error:has-text("{message}")', timeout=30_000)
    assert _stale(p, "#numbers") and _stale(p, "#chart")  # the old numbers are not shown as the answer
    _set(p, name, {"ranks": "4", "microbatches": "8", "time_f": "1"}[name])
    _wait_ranks(p, 4)
    assert p.is_hidden("#error") and not _stale(p, "#numbers")
    assert console.errors == []


def test_resizing_redraws_without_simulating_again(page: tuple[Any, Console]) -> None:
    p, console = page
    _set(p, "ranks", "4")
    _wait_ranks(p, 4)
    asked: list[str] = []
    listener = lambda request: asked.append(request.url) if "/api/" in request.url else None  # noqa: E731
    p.on("request", listener)
    width = p.get_attribute("#chart svg", "width")
    p.set_viewport_size({"width": 900, "height": 1000})
    p.wait_for_selector(f"#chart svg:not([width='{width}'])", timeout=30_000)
    p.set_viewport_size({"width": 1300, "height": 1000})
    p.wait_for_selector(f"#chart svg[width='{width}']", timeout=30_000)
    p.remove_listener("request", listener)
    assert asked == [] and not _stale(p, "#chart")
    assert console.errors == []


def test_options_the_family_does_not_take_are_disabled(page: tuple[Any, Console]) -> None:
    p, console = page
    _set(p, "family", "group-interleaved")
    _set(p, "group_size", "2")
    for name in ("group_size", "stages_per_rank", "backward"):
        assert p.is_enabled(f"[name={name}]")
    _set(p, "family", "1f1b")
    for name in ("group_size", "stages_per_rank", "backward"):
        assert p.is_disabled(f"[name={name}]")
    _set(p, "ranks", "3")
    _wait_ranks(p, 3)  # the g typed for group-interleaved is not sent: 1f1b simulates, no error
    assert p.is_hidden("#error") and "group-size" not in p.inner_text("#command")
    # the note lists only what the page can set: not zb's generator arguments memory_limit and costs
    _set(p, "family", "zb")
    p.wait_for_selector("#family-note:has-text('zb:')", timeout=30_000)
    assert "options: none" in p.inner_text("#family-note") and "memory_limit" not in p.inner_text("#family-note")
    _set(p, "family", "group-interleaved")
    p.wait_for_selector("#family-note:has-text('options: group_size, backward')", timeout=30_000)
    assert console.errors == []


def test_backward_and_p2p_controls_and_the_state_in_the_url(browser: Any, base: str,
                                                              page: tuple[Any, Console]) -> None:
    p, console = page
    _set(p, "family", "group-interleaved")
    _set(p, "ranks", "4")
    _set(p, "microbatches", "8")
    _set(p, "group_size", "2")
    _set(p, "backward", "full")
    _set(p, "p2p_time", "0.5")
    p.wait_for_selector("#command:has-text('--backward full'):has-text('--p2p-time 0.5')", timeout=30_000)
    _wait_ranks(p, 4)
    command = p.inner_text("#command").split()
    code, out, _ = run_cli(*command[1:], "--json")
    assert code == 0
    assert json.loads(p.get_attribute("#numbers td[data-key=makespan]", "data-value") or "null") == \
        json.loads(out)["makespan"]
    shared = p.url  # the link a user copies: opening it shows the same state
    assert "backward=full" in shared and "p2p_time=0.5" in shared
    other = browser.new_page()
    other.goto(shared)
    other.wait_for_selector("#chart:not(.stale) svg[data-ranks='4']", timeout=30_000)
    assert other.input_value("[name=p2p_time]") == "0.5" and other.input_value("[name=backward]") == "full"
    assert other.inner_text("#command") == p.inner_text("#command")
    other.close()
    _set(p, "backward", "")
    _set(p, "p2p_time", "0")
    assert console.errors == []


def test_hover_highlights_a_microbatch_and_the_tooltip_says_what_it_waited_for(page: tuple[Any, Console]) -> None:
    p, console = page
    _set(p, "family", "1f1b")
    _set(p, "ranks", "4")
    _set(p, "microbatches", "8")
    _wait_ranks(p, 4)
    box = p.locator("#chart rect.box[data-rank='1'][data-mb='2']").first
    box.hover()
    p.wait_for_selector("#chart svg.highlighting", timeout=30_000)
    assert p.locator("#chart rect.box.hl").count() == 4 * 2  # microbatch 2's F and B on every rank
    assert p.locator("#chart rect.box.hl:not([data-mb='2'])").count() == 0
    text = p.inner_text("#tooltip")
    assert "on rank 1 (stage 1, microbatch 2)" in text and "waited for: " in text
    p.mouse.move(1, 1)
    assert console.errors == []


def test_a_large_pipeline_is_drawn_on_a_canvas_zooms_and_exports(page: tuple[Any, Console]) -> None:
    p, console = page
    _set(p, "family", "1f1b")
    _set(p, "ranks", "32")
    _set(p, "microbatches", "170")  # 10,880 boxes: above the canvas threshold (10,000)
    _wait_drawn(p, "--ranks 32 --microbatches 170")
    p.wait_for_selector("#chart:not(.stale) svg[data-ranks='32'][data-drawn='canvas']", timeout=60_000)
    assert p.locator("#chart canvas.boxes").count() == 1 and p.locator("#chart rect.box").count() == 0
    whole = p.get_attribute("#chart svg", "data-view")
    p.click("#zoom-in")
    p.wait_for_selector(f"#chart svg:not([data-view='{whole}'])", timeout=30_000)
    start, end = map(float, (p.get_attribute("#chart svg", "data-view") or "").split(","))
    assert 0 <= start < end and end - start < float(whole.split(",")[1])  # type: ignore[union-attr]
    box = p.locator("#chart svg").bounding_box()
    assert box is not None
    p.mouse.move(box["x"] + box["width"] / 2, box["y"] + 3)  # rank 0's compute lane, mid-window
    p.wait_for_selector("#tooltip:not([hidden])", timeout=30_000)
    assert "on rank 0" in p.inner_text("#tooltip")
    p.dblclick("#chart svg")
    p.wait_for_selector(f"#chart svg[data-view='{whole}']", timeout=30_000)
    with p.expect_download() as download:
        p.click("#export-svg")
    exported = open(download.value.path(), encoding="utf-8").read()  # every box of the view, in the SVG
    assert exported.startswith("<svg") and exported.count('<rect class="box') == 32 * 170 * 2
    with p.expect_download() as download:
        p.click("#export-png")
    assert open(download.value.path(), "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    _set(p, "ranks", "4")
    _set(p, "microbatches", "8")
    _wait_ranks(p, 4)
    assert console.errors == []


def test_a_runs_metrics_show_measured_memory_beside_simulated(page: tuple[Any, Console], tmp_path: Any) -> None:
    from pipeoffload.train.report import key_figures, load_metrics

    p, console = page
    rows = [{"step": 1, "loss": 5.0, "peak_act_bytes": [3 * 2**20, 2 * 2**20], "sim_peak_act_bytes": [3 * 2**20, 2**21]},
            {"step": 2, "loss": 4.0, "peak_act_bytes": [4 * 2**20, 2 * 2**20], "sim_peak_act_bytes": [3 * 2**20, 2**21]},
            {"step": 2, "val_loss": 4.5}]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    p.set_input_files("#metrics-file", str(path))
    p.wait_for_selector("#measured svg[data-ranks='2']", timeout=30_000)
    metrics = load_metrics(path)  # what `pipeoffload report` reads from the same file
    for kind, key in (("measured", "peak_act_bytes"), ("simulated", "sim_peak_act_bytes")):
        shown = [float(v or 0) for v in p.locator(f"#measured rect.{kind}").evaluate_all(
            "els => els.map(e => e.getAttribute('data-bytes'))")]
        assert shown == metrics.per_rank_max(key)
    figures = dict(key_figures(metrics))  # the ratio in `pipeoffload report`'s words, under each rank
    for rank in range(2):
        text = figures[f"peak activations, rank {rank}"]
        assert p.text_content(f"#measured text.ratio[data-rank='{rank}']") == "× " + text.split("measured/simulated ")[1][:-1]
    corrupt = tmp_path / "bad.jsonl"
    corrupt.write_text('{"step": 1}\n{not json\n')
    p.set_input_files("#metrics-file", str(corrupt))
    p.wait_for_selector("#measured-error:has-text('bad.jsonl:2: not a JSON object')", timeout=30_000)
    assert console.errors == []


def _view(p: Any) -> str:
    return p.get_attribute("#chart:not(.stale) svg", "data-view") or ""


def _url_view(url: str) -> str | None:
    from urllib.parse import parse_qs, urlsplit

    return parse_qs(urlsplit(url).query).get("view", [None])[0]


def test_the_zoom_window_is_in_the_url_for_links_reload_and_history(browser: Any, base: str) -> None:
    p = browser.new_page(viewport={"width": 1300, "height": 1000})
    console = Console(p)
    p.goto(base + "/?family=1f1b&ranks=4&microbatches=8")
    p.wait_for_selector("#chart:not(.stale) svg[data-ranks='4'] rect.box", timeout=30_000)
    whole = _view(p)
    assert _url_view(p.url) is None
    p.click("#zoom-in")
    p.wait_for_url(lambda url: _url_view(url) is not None, timeout=30_000)
    first = _view(p)
    assert first != whole and _url_view(p.url) == first
    p.click("#zoom-in")
    p.wait_for_url(lambda url: _url_view(url) not in (None, first), timeout=30_000)
    second = _view(p)
    assert _url_view(p.url) == second
    shared = browser.new_page(viewport={"width": 1300, "height": 1000})  # a link opens the same window
    shared.goto(p.url)
    shared.wait_for_selector(f"#chart:not(.stale) svg[data-ranks='4'][data-view='{second}']", timeout=30_000)
    assert "showing" in shared.inner_text("#view-line")
    shared.close()
    p.reload()
    p.wait_for_selector(f"#chart:not(.stale) svg[data-view='{second}']", timeout=30_000)
    for move, expected in ((p.go_back, first), (p.go_back, whole), (p.go_forward, first)):
        move()
        p.wait_for_selector(f"#chart:not(.stale) svg[data-ranks='4'][data-view='{expected}']", timeout=30_000)
    assert p.input_value("[name=ranks]") == "4" and p.is_hidden("#error")
    assert console.errors == []
    p.close()


def test_a_bad_zoom_window_in_the_url_falls_back_to_the_whole_step(browser: Any, base: str) -> None:
    from urllib.parse import quote

    p = browser.new_page(viewport={"width": 1300, "height": 1000})
    console = Console(p)
    charts: list[str] = []
    p.on("request", lambda r: charts.append(r.url) if "/api/chart" in r.url else None)
    query = base + "/?family=1f1b&ranks=4&microbatches=8"
    p.goto(query + "&view=2.5,7")  # a window typed into a link by hand
    p.wait_for_selector("#chart:not(.stale) svg[data-view='2.5,7']", timeout=30_000)
    p.goto(query)
    p.wait_for_selector("#chart:not(.stale) svg[data-ranks='4']", timeout=30_000)
    whole = _view(p)
    charts.clear()
    bad_views = ("abc", "7,2.5", "0,1e9", "1,Infinity", "0,1e-9")  # not numbers, reversed, outside, too narrow
    for bad in bad_views:
        p.goto(query + "&view=" + quote(bad, safe=","))
        p.wait_for_selector(f"#chart:not(.stale) svg[data-view='{whole}']", timeout=30_000)
        assert "showing the whole step" in p.inner_text("#view-line"), bad
        assert _url_view(p.url) is None and p.is_hidden("#error"), bad
    p.wait_for_timeout(400)  # past the window's settle time: nothing more was asked for
    assert len(charts) == len(bad_views), charts  # one simulation per load, no loop
    assert console.errors == []
    p.close()


def test_a_stall_budget_and_a_planned_k_are_fields_and_stay_in_a_shared_url(browser: Any, base: str) -> None:
    """``max_stall`` and ``plan_ratio`` are the page's fields too: a link that has them opens with them,
    keeps them in its URL, and its numbers are those of the same `simulate` command."""
    other = browser.new_page(viewport={"width": 1300, "height": 1000})
    console = Console(other)
    other.goto(base + "/?family=zb-v&ranks=8&microbatches=32&offload=all&offload_ratio=0.68&max_stall=2")
    other.wait_for_selector("#chart:not(.stale) svg[data-ranks='8']", timeout=60_000)
    other.wait_for_selector("#command:has-text('--max-stall 2')", timeout=30_000)
    assert other.input_value("[name=max_stall]") == "2" and "max_stall=2" in other.url
    command = other.inner_text("#command").split()
    code, out, _ = run_cli(*command[1:], "--json")
    expected = json.loads(out)
    assert code == 0 and expected["peak_activation_units"] == 3  # the budget's plan (12 units without it)
    assert json.loads(other.get_attribute("#numbers td[data-key=peak_rank_units]", "data-value") or "null") == 1.5
    other.fill("[name=max_stall]", "")
    other.fill("[name=plan_ratio]", "0.5")
    other.dispatch_event("[name=plan_ratio]", "change")
    other.wait_for_selector("#command:has-text('--plan-ratio 0.5')", timeout=30_000)
    assert "plan_ratio=0.5" in other.url and "max_stall" not in other.url
    assert console.errors == []
    other.close()


def test_the_cli_policy_line_and_a_bad_policy_named_by_its_box(page: tuple[Any, Console]) -> None:
    """The offload figures `simulate` prints under its table are under the page's table too, in its words;
    the table's stall says it is summed over ranks; a bad policy names the box it came from."""
    p, console = page
    _draw_zb_h1_offloaded(p)
    command = p.inner_text("#command").split()
    code, out, _ = run_cli(*command[1:])
    assert code == 0 and p.inner_text("#policy-line") == out.splitlines()[-1]
    stall = p.locator("#numbers th", has_text="stall")
    assert "total stall" in stall.inner_text() and "summed over ranks" in (stall.get_attribute("title") or "")
    _set(p, "offload", "budget:abc")
    p.wait_for_selector("#error:not([hidden])", timeout=30_000)
    assert p.inner_text("#error").startswith("offload='budget:abc': 'abc' is not a number")
    _set(p, "offload", "none")
    p.wait_for_selector("#error[hidden]", state="attached", timeout=30_000)
    assert p.is_hidden("#policy-line")  # the CLI prints no policy line without a policy
    assert console.errors == []


def test_a_links_family_alias_is_read_and_an_unknown_one_is_said(browser: Any, base: str) -> None:
    """A link's family is read as the command line reads it (an alias, any case); a name this server does
    not know shows the default family with a note naming the link's, never silently another schedule."""
    p = browser.new_page(viewport={"width": 1280, "height": 800})
    console = Console(p)
    p.goto(base + "/?family=Interleaved&ranks=4&microbatches=8")
    p.wait_for_selector("#chart:not(.stale) svg[data-ranks='4'] rect.box", timeout=30_000)
    assert p.input_value("#family") == "interleaved-1f1b" and "interleaved-1f1b" in p.inner_text("#command")
    assert p.is_hidden("#link-note")
    p.goto(base + "/?family=nope&ranks=4&microbatches=8")
    p.wait_for_selector("#chart:not(.stale) svg[data-ranks='4'] rect.box", timeout=30_000)
    note = p.inner_text("#link-note")
    assert "family=nope is not a schedule family" in note and "showing group-interleaved" in note
    assert p.input_value("#family") == "group-interleaved"
    _set(p, "ranks", "6")  # the user's own choice: the note about the link goes
    p.wait_for_selector("#link-note[hidden]", state="attached", timeout=30_000)
    assert console.errors == []
    p.close()


@pytest.mark.parametrize("size", [(1280, 800), (1920, 1080)])
def test_nothing_is_cut_off_at_common_window_sizes(browser: Any, base: str, size: tuple[int, int]) -> None:
    """Each rank's peak label (six digits: v = 3 makes thirds) ends inside the chart, and the file inputs
    are wide enough for their button and file name, not squeezed to a number box's width."""
    p = browser.new_page(viewport={"width": size[0], "height": size[1]})
    console = Console(p)
    p.goto(base + "/?family=interleaved-1f1b&ranks=4&microbatches=8&stages_per_rank=3&offload=all")
    p.wait_for_selector("#chart:not(.stale) svg[data-ranks='4'] rect.box", timeout=30_000)
    chart = p.locator("#chart svg").bounding_box()
    labels = p.locator("#chart text.peak")
    assert labels.count() == 4 and any("." in (labels.nth(i).text_content() or "") for i in range(4))
    for i in range(labels.count()):
        box = labels.nth(i).bounding_box()
        assert box["x"] + box["width"] <= chart["x"] + chart["width"], labels.nth(i).text_content()
    number_box = p.locator("[name=ranks]").bounding_box()["width"]
    for file_input in ("#metrics-file", "#trace-file"):
        assert p.locator(file_input).bounding_box()["width"] > 2 * number_box, file_input
    assert console.errors == []
    p.close()


def test_the_chart_zooms_and_pans_from_the_keyboard(page: tuple[Any, Console]) -> None:
    """The chart takes focus with Tab after the export buttons: + zooms in, the arrows pan, 0 shows the
    whole step again, as the wheel, dragging and a double-click do."""
    p, console = page
    whole = _view(p)
    p.focus("#export-png")
    p.keyboard.press("Tab")
    assert p.evaluate("() => document.activeElement.id") == "chart"
    p.keyboard.press("+")
    p.wait_for_selector(f"#chart svg:not([data-view='{whole}'])", timeout=30_000)
    zoomed = _view(p)
    t0, t1 = map(float, zoomed.split(","))
    assert t1 - t0 == pytest.approx(float(whole.split(",")[1]) / 2, rel=1e-3)
    p.keyboard.press("ArrowRight")
    p.wait_for_selector(f"#chart svg:not([data-view='{zoomed}'])", timeout=30_000)
    assert float(_view(p).split(",")[0]) > t0
    p.keyboard.press("0")
    p.wait_for_selector(f"#chart svg[data-view='{whole}']", timeout=30_000)
    assert console.errors == []


def test_the_tooltip_stays_inside_the_window_at_the_right_end(browser: Any, base: str) -> None:
    """Hovering the last box of the step (at the right edge of a 1280-wide window) shows the whole tooltip,
    left of the pointer, not running off the window's edge."""
    p = browser.new_page(viewport={"width": 1280, "height": 800})
    console = Console(p)
    p.goto(base + "/?family=1f1b&ranks=4&microbatches=8")
    p.wait_for_selector("#chart:not(.stale) svg[data-ranks='4'] rect.box", timeout=30_000)
    boxes = p.locator("#chart rect.box")
    last = max((boxes.nth(i).bounding_box() for i in range(boxes.count())), key=lambda b: b["x"] + b["width"])
    p.mouse.move(last["x"] + last["width"] / 2, last["y"] + last["height"] / 2)
    p.wait_for_selector("#tooltip:not([hidden])", timeout=30_000)
    tip = p.locator("#tooltip").bounding_box()
    assert "waited for" in p.inner_text("#tooltip")
    assert 0 <= tip["x"] and tip["x"] + tip["width"] <= 1280 and tip["y"] + tip["height"] <= 800, tip
    assert console.errors == []
    p.close()


def test_the_measured_over_simulated_ratios_do_not_overlap(page: tuple[Any, Console], tmp_path: Any) -> None:
    """Four ranks whose ratios have many digits: each label under its rank stays clear of the next."""
    p, console = page
    row = {"step": 1, "peak_act_bytes": [123456789, 98765432, 50000000, 40000000],
           "sim_peak_act_bytes": [120000000, 100000000, 52000000, 39000000]}
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps(row) + "\n")
    p.set_input_files("#metrics-file", str(path))
    p.wait_for_selector("#measured svg[data-ranks='4']", timeout=30_000)
    boxes = [p.locator(f"#measured text.ratio[data-rank='{r}']").bounding_box() for r in range(4)]
    for left, right in zip(boxes, boxes[1:]):
        assert left["x"] + left["width"] < right["x"], (left, right)
    assert p.text_content("#measured text.ratio[data-rank='0']") == "× 1.029"
    assert console.errors == []


def test_an_emptied_box_keeps_every_input_in_the_url_and_across_a_reload(page: tuple[Any, Console]) -> None:
    """Emptying a required box shows its message; the URL still holds every input (the empty box as
    `ranks=`), so a reload shows the same inputs and the same message, not the defaults."""
    p, console = page
    _set(p, "microbatches", "12")
    _set(p, "offload", "all")
    _wait_drawn(p, "--microbatches 12 --offload all")
    _set(p, "ranks", "")
    p.wait_for_selector("#error:has-text('ranks: empty')", timeout=30_000)
    assert "microbatches=12" in p.url and "offload=all" in p.url and "ranks=&" in p.url
    p.reload()
    p.wait_for_selector("#error:has-text('ranks: empty')", timeout=30_000)
    assert p.input_value("[name=ranks]") == "" and p.input_value("[name=microbatches]") == "12"
    assert p.input_value("[name=offload]") == "all"
    assert console.errors == []


def test_an_exported_chart_carries_its_title_numbers_and_legend(page: tuple[Any, Console]) -> None:
    """An exported SVG is read away from the page: it has the chart's title, its headline numbers and a
    legend naming every colour (the second offload window's own entries, device and host memory)."""
    p, console = page
    _draw_zb_h1_offloaded(p)
    with p.expect_download() as download:
        p.click("#export-svg")
    exported = open(download.value.path(), encoding="utf-8").read()
    assert exported.startswith("<svg") and p.inner_text("#summary-line").split(" — ")[0] in exported
    for label in p.inner_text("#legend").splitlines():
        assert f">{label.replace(chr(39), '&#39;')}</text>" in exported, label
    assert "offload D2H after I (W&#39;s part)" in exported and "host memory (own scale)" in exported
    assert exported.count('<rect class="box') == int(p.get_attribute("#chart svg", "data-boxes") or 0)
    assert console.errors == []


def test_a_server_that_cannot_be_reached_is_said_with_the_fix(page: tuple[Any, Console]) -> None:
    """A request that fails in the network (the playground's command stopped) shows one line saying which
    server and what to do, with the last chart dimmed, not only the browser's "Failed to fetch"."""
    p, _ = page
    p.route("**/api/chart?*", lambda route: route.abort())
    try:
        _set(p, "ranks", "5")
        p.wait_for_selector("#error:not([hidden])", timeout=30_000)
        message = p.inner_text("#error")
        assert "cannot reach the playground server" in message and "pipeoffload playground" in message
        assert "start it again" in message and "\n" not in message and _stale(p, "#chart")
    finally:
        p.unroute("**/api/chart?*")


def _hold_chart_requests(p: Any, held: list[Any], count: int) -> None:
    """Until ``count`` chart requests are held by the route (its handler runs while Playwright waits)."""
    for _ in range(600):
        if len(held) >= count:
            return
        p.wait_for_timeout(50)
    raise AssertionError(f"{len(held)} chart requests held, expected {count}")


def test_a_request_in_flight_says_simulating_and_the_status_never_sticks(page: tuple[Any, Console]) -> None:
    """While /api/chart is answering, a status line (role=status) says "simulating…"; it clears when the
    answer, an error or a failed request arrives, and when a newer input (even a bad one) supersedes it."""
    p, console = page
    held: list[Any] = []
    p.route("**/api/chart?*", lambda route: held.append(route))
    try:
        assert p.get_attribute("#busy", "role") == "status" and p.inner_text("#busy") == ""
        _set(p, "ranks", "5")
        _hold_chart_requests(p, held, 1)
        p.wait_for_selector("#busy:has-text('simulating…')", timeout=30_000)
        _set(p, "ranks", "")  # a bad input supersedes the request in flight: nothing is simulating now
        p.wait_for_selector("#error:has-text('ranks: empty')", timeout=30_000)
        assert p.inner_text("#busy") == ""
        _set(p, "ranks", "6")
        _hold_chart_requests(p, held, 2)
        p.wait_for_selector("#busy:has-text('simulating…')", timeout=30_000)
        _set(p, "ranks", "7")  # supersedes ranks=6, whose answer then arrives last
        _hold_chart_requests(p, held, 3)
        for route in (held[2], held[1], held[0]):
            try:
                route.continue_()
            except Exception:  # noqa: BLE001 - a request the page aborted cannot be continued
                pass
        _wait_ranks(p, 7)
        p.wait_for_selector("#busy:text-is('')", state="attached", timeout=30_000)
        assert p.is_hidden("#error")
    finally:
        p.unroute("**/api/chart?*")
    p.route("**/api/chart?*", lambda route: route.abort())
    try:
        _set(p, "ranks", "3")  # a request that fails: its message, and the status cleared
        p.wait_for_selector("#error:has-text('cannot reach')", timeout=30_000)
        assert p.inner_text("#busy") == ""
    finally:
        p.unroute("**/api/chart?*")


def test_the_keyboard_reaches_a_boxs_details_as_the_tooltip_gives_them(page: tuple[Any, Console]) -> None:
    """On the focused chart, the arrows up and down pick a rank and comma and period step through its
    actions: the box is outlined, its microbatch highlighted and a status line says what hovering it says;
    a box out of the zoom window pans it into view; Escape leaves."""
    p, console = page
    _set(p, "family", "1f1b")
    _set(p, "ranks", "4")
    _set(p, "microbatches", "8")
    _wait_drawn(p, "1f1b --microbatches 8")  # 4 ranks is the request's default: not on its command line
    _wait_ranks(p, 4)
    p.focus("#export-png")
    p.keyboard.press("Tab")
    assert p.evaluate("() => document.activeElement.id") == "chart"
    assert p.get_attribute("#chart", "aria-describedby") == "chart-details"
    p.keyboard.press("ArrowDown")
    p.wait_for_selector("#chart rect.cursor[data-rank='0']", timeout=30_000)
    assert "on rank 0" in p.inner_text("#chart-details")
    assert "waited for: nothing: the first action" in p.inner_text("#chart-details")
    p.keyboard.press(".")
    p.keyboard.press("ArrowDown")
    p.wait_for_selector("#chart rect.cursor[data-rank='1']", timeout=30_000)
    shown = p.inner_text("#chart-details")
    mb = p.get_attribute("#chart rect.cursor", "data-mb")
    assert f"on rank 1 (stage 1, microbatch {mb})" in shown and "; waited for: " in shown
    assert p.locator("#chart rect.box.hl").count() == 4 * 2  # its microbatch's F and B on every rank
    assert p.locator(f"#chart rect.box.hl:not([data-mb='{mb}'])").count() == 0
    mark = p.locator("#chart rect.cursor").bounding_box()
    p.mouse.move(mark["x"] + mark["width"] / 2, mark["y"] + mark["height"] / 2)
    p.wait_for_selector("#tooltip:not([hidden])", timeout=30_000)
    assert p.inner_text("#tooltip").replace("\n", "; ") == shown  # the same words as hovering that box
    p.mouse.move(1, 1)
    p.focus("#chart")
    for _ in range(3):
        p.keyboard.press("+")
    zoomed = _view(p)
    for _ in range(8):  # step past the window's right end: the window pans to the box
        p.keyboard.press(".")
    p.wait_for_selector(f"#chart svg:not([data-view='{zoomed}'])", timeout=30_000)
    t0, t1 = map(float, _view(p).split(","))
    found = re.search(r"\): ([\d.e+-]+) to ([\d.e+-]+) t;", p.inner_text("#chart-details"))
    assert found, p.inner_text("#chart-details")
    start, end = float(found[1]), float(found[2])
    assert t0 <= start and end <= t1
    p.keyboard.press("Escape")
    p.wait_for_selector("#chart rect.cursor", state="detached", timeout=30_000)
    assert p.inner_text("#chart-details") == "" and p.locator("#chart rect.box.hl").count() == 0
    assert console.errors == []
