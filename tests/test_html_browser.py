"""The committed pages in a real browser (headless Chromium, tests/page_browser.py): no
console error, no request but the page itself, every figure drawn with the series and
points its data has, a header click sorts, a filter hides the other rows, a failed row is
marked; and a page broken on purpose fails these checks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from page_browser import (
    DRAW_TIMEOUT_MS,
    choose,
    click_header,
    column_values,
    launch,
    marked_rows,
    open_page,
    page_problems,
    skip_reason,
)

from bench.speed.results import load_results

ROOT = Path(__file__).resolve().parents[1]
PAGES = {"scaling": ROOT / "results/scaling-cpu/report.html", "quality": ROOT / "results/quality-small/report.html",
         "history": ROOT / "results/history.html"}
FAILED_BACKGROUND = "rgb(248, 208, 208)"

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = launch(playwright)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def opened(browser):
    """Each committed page opened once: ``{name: (page, loaded)}``."""
    return {name: open_page(browser, path) for name, path in PAGES.items()}


@pytest.mark.parametrize("name", sorted(PAGES))
def test_a_committed_page_opens_offline_and_draws_its_data(opened, name):
    _, loaded = opened[name]
    assert page_problems(PAGES[name], loaded) == []
    assert loaded.drawn_ms is not None and loaded.drawn_ms < DRAW_TIMEOUT_MS
    print(f"{name}: {len(loaded.plots)} figures drawn {loaded.drawn_ms:.0f} ms after navigation start")


def _numbers(values: list[str]) -> list[float]:
    return [float(v) for v in values if re.fullmatch(r"-?[0-9][0-9.e+-]*", v)]


def test_a_header_click_sorts_its_column(opened):
    page, _ = opened["scaling"]
    click_header(page, "rows", "time_ms")
    up = _numbers(column_values(page, "rows", "time_ms"))
    assert len(up) > 10 and up == sorted(up)
    click_header(page, "rows", "time_ms")
    down = _numbers(column_values(page, "rows", "time_ms"))
    assert down == sorted(up, reverse=True)


def test_a_filter_hides_the_other_rows(opened):
    page, _ = opened["scaling"]
    rows = load_results(ROOT / "results/scaling-cpu")
    label = "sliding_window(window=128)"
    choose(page, "rows", "variant", label)
    assert column_values(page, "rows", "label") == [label] * int((rows.label == label).sum())
    choose(page, "rows", "kernel", "sdpa")  # both filters at once
    shown = rows[(rows.label == label) & (rows.kernel_requested == "sdpa")]
    assert len(column_values(page, "rows", "label")) == len(shown) > 0
    assert set(column_values(page, "rows", "kernel_requested")) == {"sdpa"}
    choose(page, "rows", "variant", "")
    choose(page, "rows", "kernel", "")
    assert len(column_values(page, "rows", "label")) == len(rows)


def test_a_failed_row_is_marked(opened):
    page, _ = opened["scaling"]
    rows = load_results(ROOT / "results/scaling-cpu")
    failed = marked_rows(page, "rows", "failed")
    assert len(failed) == int((rows.status != "ok").sum()) > 0
    assert {row["mark"] for row in failed} == {"failed"}
    assert all(row["status"] != "ok" for row in failed)
    assert {row["_background"] for row in failed} == {FAILED_BACKGROUND}


@pytest.mark.parametrize("name", ["scaling", "quality"])
def test_every_series_of_a_figure_has_its_own_colour(opened, name):
    page, _ = opened[name]
    figures = page.evaluate("Array.from(document.querySelectorAll('div.plot')).map(d => d._fullData"
                            ".filter(t => t.legendgroup !== 'guides').map(t => [t.name, t.marker.color]))")
    assert figures
    for traces in figures:
        colour_of = dict(traces)  # a quality figure's variant has a trace per panel, one colour
        assert len(colour_of) == len({tuple(t) for t in traces})
        assert len(set(colour_of.values())) == len(colour_of)


def test_a_history_point_links_to_its_run(opened):
    page, _ = opened["history"]
    links = page.evaluate("document.getElementById('history-time_ms').data.flatMap("
                          "t => t.customdata.map(c => c[c.length - 1]))")
    assert links and all((PAGES["history"].parent / link).exists() for link in links)
    assert all(link.endswith("report.html") for link in links)


@pytest.fixture
def broken_copy(tmp_path):
    """A copy of a committed page to break, without its Content-Security-Policy (which would
    refuse an edited script, or a request, before the checks could see it)."""
    def copy(change) -> Path:
        path = tmp_path / "report.html"
        text = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "",
                      PAGES["scaling"].read_text(encoding="utf-8"), count=1)
        path.write_text(change(text), encoding="utf-8")
        return path
    return copy


def test_broken_figure_data_is_caught(browser, broken_copy):
    path = broken_copy(lambda text: text.replace('id="time-fwd-data">{"data":[', 'id="time-fwd-data">{"data":[[', 1))
    page, loaded = open_page(browser, path)
    problems = page_problems(path, loaded)
    page.close()
    assert any(p.startswith("figures not drawn") for p in problems), problems
    assert any(p.startswith("figure data does not parse") for p in problems), problems


def test_a_series_left_undrawn_is_caught(browser, broken_copy):
    path = broken_copy(lambda text: text.replace("Plotly.newPlot(div, fig.data,",
                                                 "Plotly.newPlot(div, fig.data.slice(1),", 1))
    page, loaded = open_page(browser, path)
    page.close()
    problems = page_problems(path, loaded)
    assert any(p.startswith("figure time-fwd: drawn") for p in problems), problems


def test_a_broken_sort_script_is_caught(browser, broken_copy):
    path = broken_copy(lambda text: text.replace("rows.sort(", "rows.reverse(", 1))
    page, _ = open_page(browser, path)
    click_header(page, "rows", "time_ms")
    values = _numbers(column_values(page, "rows", "time_ms"))
    page.close()
    assert values != sorted(values)


def test_a_request_is_caught(browser, broken_copy):
    path = broken_copy(lambda text: text.replace("</body>", '<img src="http://192.0.2.1/x.png"></body>', 1))
    page, loaded = open_page(browser, path)
    page.close()
    assert any(p.startswith("request: http://192.0.2.1/") for p in page_problems(path, loaded))
