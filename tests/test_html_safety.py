"""Pages are safe to share: what a row, a label, a metric name, a history store or a run
folder's name carries never runs and never fetches anything when a page is opened or
clicked (headless Chromium, tests/page_browser.py). Each payload is one that ran or made
a request on pages built before ids were slugs, strings escaped, links encoded and the
Content-Security-Policy added (docs/reliability.md, "Pages")."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pandas as pd
import pytest
from page_browser import launch, open_page, outside_requests, page_problems, skip_reason

from bench.engine.provenance import environment
from bench.engine.results import ResultsWriter, write_env
from bench.html.history import build_history
from bench.html.history_rows import COLUMNS
from bench.html.page import figure_div, render_page, safe_id, safe_link, section
from bench.html.quality import _figure as quality_figure
from bench.html.report import write_report_html

ID_PAYLOAD = 'acc"><img src=x onerror="window.__pwned=51">'
HISTORY_PAYLOAD = 'x"><img src=x onerror="window.__pwned=45">'
RUN_PAYLOAD = "javascript:window.__pwned=44;1"
FETCH_PAYLOAD = '<span style="mask-image:url(http://127.0.0.1:8765/x.png)">x</span>'
PWNED = "typeof window.__pwned"

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = launch(playwright)
        yield chromium
        chromium.close()


def _speed_row(n: int, label: str = "full", host: str = "vm", sha: str = "a" * 40, day: int = 1) -> dict:
    return {
        "case_id": f"{label}-sdpa-{n}", "label": label, "variant": "full", "kernel_requested": "sdpa",
        "kernel": "sdpa", "params": "{}", "seq_len": n, "batch": 1, "heads": 8, "head_dim": 64,
        "dtype": "float32", "device": "cpu", "causal": False, "pass": "fwd", "status": "ok", "reason": "",
        "time_ms": n / 100, "time_iqr_ms": 0.1, "repeats": 5, "peak_mem_bytes": 2**20, "threads": 2,
        "git_sha": sha, "device_name": "CPU X", "hostname": host, "timestamp": f"2026-01-0{day}T00:00:00+00:00",
    }


def _run(path: Path, rows: list[dict]) -> Path:
    path.mkdir(parents=True)
    ResultsWriter(path).append(rows)
    write_env(path, [{**environment("cpu", 2), "git_sha": rows[0]["git_sha"], "hostname": rows[0]["hostname"],
                      "timestamp": rows[0]["timestamp"]}])
    return path


def _opened_clean(browser, path: Path):
    """Open ``path``; assert nothing ran, nothing was requested, no error and every figure
    drawn; the page."""
    page, loaded = open_page(browser, path)
    assert page.evaluate(PWNED) == "undefined"
    assert page_problems(path, loaded) == []
    return page


def test_ids_are_slugs_and_links_keep_no_scheme():
    assert safe_id("metric-accuracy") == "metric-accuracy"
    slug = safe_id(f"metric-{ID_PAYLOAD}")
    assert set(slug) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
    assert slug != safe_id(f"metric-{ID_PAYLOAD}!")  # distinct texts stay distinct
    assert safe_link(f"{RUN_PAYLOAD}/report.html") == "javascript%3Awindow.__pwned%3D44%3B1/report.html"
    assert safe_link("../results/one/") == "../results/one/"
    assert safe_link("/etc/passwd") is None and safe_link("") is None


def test_a_metric_name_with_markup_runs_nothing_on_a_quality_page(browser, tmp_path):
    top = pd.DataFrame({"label": ["full", "full", ID_PAYLOAD], "task": ["listops", "text", "text"],
                        "value": [0.4, 0.6, 0.5], "kernel": ["sdpa", "sdpa", "-"], "seed": [0, 0, 0],
                        "role": ["variant", "variant", "reference"]})
    figures = [figure_div(quality_figure(top, metric, ["listops", "text"], {"text": {FETCH_PAYLOAD: 0.5}}),
                          f"metric-{metric}") for metric in (ID_PAYLOAD, "accuracy")]
    path = tmp_path / "report.html"
    path.write_text(render_page("quality", {"run": "x"}, [section("Figures", *figures)]), encoding="utf-8")
    page = _opened_clean(browser, path)
    texts = page.evaluate("Array.from(document.querySelectorAll('div.plot')).map(d => d.textContent)")
    assert all(ID_PAYLOAD in text for text in texts)  # the metric in a title, the reference's line label
    assert FETCH_PAYLOAD in texts[1]  # a floor's label, shown as text


def test_labels_with_styles_fetch_nothing_on_a_speed_page(browser, tmp_path):
    rows = [_speed_row(n, label=label) for n in (256, 512) for label in ("full", FETCH_PAYLOAD)]
    run = _run(tmp_path / "speed", rows)
    page = _opened_clean(browser, write_report_html(run))
    legend = page.evaluate("Array.from(document.querySelectorAll('div.plot .legendtext')).map(t => t.textContent)")
    assert any(text.startswith("<span style=") for text in legend), legend  # the label as text, not markup


@pytest.fixture
def history(tmp_path):
    """Two runs of one case at two commits, the second in a folder named like a link with a
    scheme, on a machine whose name carries a style that fetches."""
    root = tmp_path / "results"
    _run(root / "one", [_speed_row(n, host=FETCH_PAYLOAD) for n in (256, 512)])
    _run(root / RUN_PAYLOAD, [_speed_row(n, host=FETCH_PAYLOAD, sha="b" * 40, day=2) for n in (256, 512)])
    return root


def test_a_run_folder_named_like_a_script_link_runs_nothing(browser, history):
    found = build_history([history], history)
    page = _opened_clean(browser, found.page)
    hrefs = page.evaluate("Array.from(document.querySelectorAll('a')).map(a => a.href)")
    assert hrefs and all(href.startswith("file://") for href in hrefs), hrefs
    links = page.evaluate("document.querySelector('div.plot').data.flatMap("
                          "t => t.customdata.map(c => c[c.length - 1]))")
    assert sorted(links) == ["javascript%3Awindow.__pwned%3D44%3B1/", "one/"]
    # a point whose link still had a scheme would not be opened by the page's click handler
    page.evaluate("document.querySelector('div.plot').emit('plotly_click', "
                  f"{{points: [{{customdata: ['x', {RUN_PAYLOAD!r}]}}]}})")
    assert page.evaluate(PWNED) == "undefined" and page.url == found.page.resolve().as_uri()
    page.locator("a", has_text="b" * 12).first.click()  # the commits table's link to the run
    assert page.url.startswith("file://") and "javascript%3A" in page.url


def test_rows_of_no_known_run_in_the_store_never_reach_the_page(browser, history):
    found = build_history([history], history)
    db = sqlite3.connect(found.page.parent / "history.sqlite")
    ghost = {c: None for c in COLUMNS} | {"run": "ghost", "kind": "speed", "commit_sha": "a" * 40,
                                          "machine": "vm", "case": "x", "figure": HISTORY_PAYLOAD,
                                          "value": 1.0, "status": "ok", "title": "x"}
    with db:
        db.execute(f"INSERT INTO cases VALUES ({', '.join('?' * len(COLUMNS))})", [ghost[c] for c in COLUMNS])
    db.close()
    again = build_history([history], history)
    assert HISTORY_PAYLOAD not in set(again.rows.figure)
    assert "ghost" not in set(again.rows.run)
    _opened_clean(browser, again.page)


def test_the_policy_stops_markup_that_escaped_everything_else(browser, tmp_path):
    injected = section("Figures", figure_div({"data": [{"type": "scatter", "x": [1], "y": [1]}]}, "f"),
                       '<img src="x" onerror="window.__pwned=1"><script>window.__pwned=2</script>'
                       '<img src="http://127.0.0.1:8765/y.png">')
    path = tmp_path / "report.html"
    path.write_text(render_page("injected", {"run": "x"}, [injected]), encoding="utf-8")
    page, loaded = open_page(browser, path)
    assert page.evaluate(PWNED) == "undefined"
    assert outside_requests(path, loaded) == loaded.blocked == [f"{path.parent.as_uri()}/x",
                                                                "http://127.0.0.1:8765/y.png"]
    assert page.get_attribute("body", "data-plots-drawn") == "1"  # the page's own scripts still run
