"""Opening attn-bench's HTML pages in headless Chromium (Debian's ``chromium``, driven by
playwright through its executable path: no browser download) and checking them: console
errors, network requests, the figures drawn against the figure data the page carries,
sorting, filtering and marked rows. The page tests and the README's screenshot use it."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: where Debian and others put the browser
CHROMIUM = ("chromium", "chromium-browser")
#: the longest a page may take to draw before the check calls it hung (ms)
DRAW_TIMEOUT_MS = 60_000


def chromium_path() -> str | None:
    """The Chromium executable on PATH, or None."""
    for name in CHROMIUM:
        found = shutil.which(name)
        if found:
            return found
    return None


def skip_reason() -> str | None:
    """Why the browser tests cannot run here (one line), or None when they can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[dev]')"
    if chromium_path() is None:
        return "no chromium executable on PATH (apt-get install chromium)"
    return None


@dataclass
class Loaded:
    """What opening a page showed."""

    requests: list[str] = field(default_factory=list)  # every URL the page asked for
    blocked: list[str] = field(default_factory=list)  # those its Content-Security-Policy refused
    errors: list[str] = field(default_factory=list)  # console errors and uncaught exceptions
    drawn_ms: float | None = None  # when every figure was drawn, ms after navigation start
    plots: dict[str, tuple[int, int]] = field(default_factory=dict)  # id: (series, points) drawn
    draw_error: str | None = None


def figure_data(html: str) -> dict[str, tuple[int, int]]:
    """The figures a page's text carries: ``{id: (series, points)}`` from their JSON."""
    found = {}
    for match in re.finditer(r'<script type="application/json" id="([^"]+)-data">(.*?)</script>', html, re.S):
        data = json.loads(match.group(2))["data"]
        found[match.group(1)] = (len(data), sum(len(trace.get("x") or []) for trace in data))
    return found


def open_page(browser: Any, path: Path) -> tuple[Any, Loaded]:
    """Open ``path`` in a new page of ``browser`` and wait until its figures are drawn (or
    failed); the page and what it showed."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    loaded = Loaded()
    page.on("request", lambda request: loaded.requests.append(request.url))
    page.on("requestfailed", lambda request: loaded.blocked.append(request.url)
            if request.failure == "csp" else None)
    page.on("console", lambda message: loaded.errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: loaded.errors.append(str(error)))
    page.goto(path.resolve().as_uri())
    page.wait_for_selector("body[data-plots-drawn], body[data-plots-error]", state="attached",
                           timeout=DRAW_TIMEOUT_MS)
    loaded.draw_error = page.get_attribute("body", "data-plots-error")
    drawn = page.get_attribute("body", "data-plots-ms")
    loaded.drawn_ms = float(drawn) if drawn else None
    loaded.plots = {item[0]: (item[1], item[2]) for item in page.evaluate(
        "Array.from(document.querySelectorAll('div.plot')).map(d => [d.id, (d.data || []).length, "
        "(d.data || []).reduce((n, t) => n + (t.x ? t.x.length : 0), 0)])")}
    return page, loaded


def outside_requests(path: Path, loaded: Loaded) -> list[str]:
    """The requests a page made beyond itself (a ``blob:`` URL is the page's own memory:
    Plotly's unpacked bundle), blocked or not."""
    return [url for url in loaded.requests if url != path.resolve().as_uri() and not url.startswith("blob:")]


def page_problems(path: Path, loaded: Loaded) -> list[str]:
    """What is wrong with a loaded page: a console error, a request other than the page
    itself (even one its policy blocked), a figure not drawn or drawn with other series or
    points than its data says."""
    problems = [f"console error: {e}" for e in loaded.errors]
    problems += [f"request{' (blocked by the policy)' if url in loaded.blocked else ''}: {url}"
                 for url in outside_requests(path, loaded)]
    if loaded.draw_error:
        problems.append(f"figures not drawn: {loaded.draw_error}")
    try:
        expected = figure_data(path.read_text(encoding="utf-8"))
    except ValueError as err:
        return [*problems, f"figure data does not parse: {err}"]
    if not expected:
        problems.append("the page carries no figure")
    for plot_id, counts in expected.items():
        if loaded.plots.get(plot_id) != counts:
            problems.append(f"figure {plot_id}: drawn (series, points) {loaded.plots.get(plot_id)}, "
                            f"its data has {counts}")
    return problems


def column_values(page: Any, table_id: str, header: str) -> list[str]:
    """The visible cells of column ``header`` of table ``table_id``, top to bottom (a cell's
    sort key where it has one, else its text)."""
    return page.evaluate(
        """([id, header]) => {
            const table = document.getElementById(id);
            const index = Array.from(table.tHead.rows[0].cells).findIndex(c => c.textContent.trim() === header);
            return Array.from(table.tBodies[0].rows).filter(r => !r.hidden).map(
                r => r.cells[index].getAttribute('data-sort') || r.cells[index].textContent.trim());
        }""", [table_id, header])


def click_header(page: Any, table_id: str, header: str) -> None:
    """Click the header ``header`` of table ``table_id`` (sorts by it)."""
    page.locator(f"#{table_id} thead th", has_text=re.compile(f"^{re.escape(header)}$")).first.click()


def choose(page: Any, table_id: str, filter_name: str, value: str) -> None:
    """Choose ``value`` in the filter ``filter_name`` of table ``table_id`` (``""``: all rows)."""
    selector = f'select[data-table="{table_id}"][data-filter="{filter_name}"]'
    if value:
        page.select_option(selector, value=value)
    else:
        page.select_option(selector, index=0)  # "(all)"


def marked_rows(page: Any, table_id: str, mark: str) -> list[dict[str, str]]:
    """The rows of ``table_id`` with class ``mark``: their cells by header, and the row's
    computed background colour (``_background``)."""
    return page.evaluate(
        """([id, mark]) => {
            const table = document.getElementById(id);
            const headers = Array.from(table.tHead.rows[0].cells).map(c => c.textContent.trim());
            return Array.from(table.tBodies[0].querySelectorAll('tr.' + mark)).map(r => {
                const row = {_background: getComputedStyle(r).backgroundColor};
                headers.forEach((h, i) => { row[h] = r.cells[i].textContent.trim(); });
                return row;
            });
        }""", [table_id, mark])


def screenshot(page: Any, path: Path, height: int = 900) -> Path:
    """A PNG of the top of ``page`` (its provenance and first figure)."""
    page.set_viewport_size({"width": 1280, "height": height})
    page.screenshot(path=str(path))
    return path


def launch(playwright: Any) -> Any:
    """Debian's Chromium, headless, through playwright (``--no-sandbox``: root in CI)."""
    return playwright.chromium.launch(executable_path=chromium_path(), headless=True, args=["--no-sandbox"])


def time_pages(paths: list[Path], rounds: int) -> dict[Path, list[float]]:
    """Open every page ``rounds`` times, interleaved (page 1, page 2, ..., page 1, ...), each
    in a fresh tab; when each drew all its figures, in ms after navigation start."""
    from playwright.sync_api import sync_playwright

    times: dict[Path, list[float]] = {path: [] for path in paths}
    with sync_playwright() as playwright:
        browser = launch(playwright)
        for _ in range(rounds):
            for path in paths:
                page, loaded = open_page(browser, path)
                page.close()
                if loaded.drawn_ms is None:
                    raise RuntimeError(f"{path}: figures not drawn: {loaded.draw_error}")
                times[path].append(loaded.drawn_ms)
        browser.close()
    return times


def main(argv: list[str]) -> int:
    """``python tests/page_browser.py PAGE PNG``: open PAGE, check it, write its screenshot.
    ``python tests/page_browser.py --time ROUNDS PAGE...``: when each page is drawn, over
    ROUNDS interleaved openings (median, min, max)."""
    from playwright.sync_api import sync_playwright

    if len(argv) > 2 and argv[0] == "--time":
        times = time_pages([Path(p) for p in argv[2:]], int(argv[1]))
        for path, values in times.items():
            ordered = sorted(values)
            print(f"{path}: drawn after {ordered[len(ordered) // 2]:.0f} ms (median of {len(values)}; "
                  f"min {ordered[0]:.0f}, max {ordered[-1]:.0f}; all: {', '.join(f'{v:.0f}' for v in values)})")
        return 0
    if len(argv) != 2:
        print("usage: python tests/page_browser.py PAGE PNG | --time ROUNDS PAGE...")
        return 2
    path, png = Path(argv[0]), Path(argv[1])
    with sync_playwright() as playwright:
        browser = launch(playwright)
        page, loaded = open_page(browser, path)
        problems = page_problems(path, loaded)
        screenshot(page, png)
        browser.close()
    print(f"{path}: drawn {len(loaded.plots)} figure(s) at {loaded.drawn_ms} ms; screenshot {png}")
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
