"""``report.html``: one self-contained page per run directory (speed sweep, training grid,
decoding), its figures carrying the run's rows, failed and noisy rows marked, provenance at
the top. (The page in a browser: tests/test_html_browser.py.)"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bench.cli import app
from bench.engine.provenance import environment
from bench.engine.results import ResultsWriter, write_env
from bench.html.report import write_report_html
from bench.quality.report import load_quality
from bench.quality.tables import headline

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
MAX_BYTES = 5 * 2**20


def _row(n: int, pass_name: str, status: str = "ok", time_ms: float = 10.0, iqr_ms: float = 0.5,
         label: str = "full", kernel: str = "sdpa", times: str = "") -> dict:
    ok = status == "ok"
    return {
        "case_id": f"{label}-{kernel}-{n}-{pass_name}", "label": label, "variant": label,
        "kernel_requested": kernel, "kernel": kernel, "params": "{}", "seq_len": n, "batch": 1,
        "heads": 8, "head_dim": 64, "dtype": "float32", "device": "cpu", "causal": False,
        "pass": pass_name, "status": status, "reason": "" if ok else "timed out after 60 s",
        "time_ms": time_ms if ok else None, "time_iqr_ms": iqr_ms if ok else None,
        "repeats": 5 if ok else None, "times_ms": times, "peak_mem_bytes": 2**20 * n / 256 if ok else None,
        "threads": 2, "git_sha": "f" * 40, "device_name": "CPU X", "hostname": "vm",
        "timestamp": "2026-01-01T00:00:00+00:00",
    }


def figures(page: Path) -> dict[str, dict]:
    """The figure JSON a page carries, by figure id."""
    text = page.read_text(encoding="utf-8")
    return {m.group(1): json.loads(m.group(2)) for m in re.finditer(
        r'<script type="application/json" id="([^"]+)-data">(.*?)</script>', text, re.S)}


def assert_self_contained(text: str) -> None:
    """Nothing the page would fetch: no external script, style, image or frame."""
    assert not re.search(r"<(script|img|iframe)[^>]*\ssrc=", text)
    assert "<link" not in text
    assert "@import" not in text


@pytest.fixture
def speed_run(tmp_path):
    """Two kernels over three lengths, forward; one timeout at the largest length and one
    row flagged noisy."""
    run = tmp_path / "speed"
    run.mkdir()
    rows = [_row(n, "fwd", time_ms=n / 100, label="full", kernel="sdpa") for n in (256, 512)]
    rows += [_row(1024, "fwd", status="timeout", label="full", kernel="sdpa")]
    rows += [_row(n, "fwd", time_ms=n / 400, label="sliding_window(window=16)", kernel="blocked")
             for n in (256, 512, 1024)]
    rows[1].update(time_iqr_ms=3.0, time_ms=5.0, noisy=True, noise_threshold=0.25)  # flagged noisy
    ResultsWriter(run).append(rows)
    write_env(run, [{**environment("cpu", 2), "command": "attn-bench sweep quick --out runs/x"}])
    return run


def test_a_speed_page_draws_every_ok_row_once_and_marks_the_others(speed_run):
    page = write_report_html(speed_run)
    text = page.read_text(encoding="utf-8")
    assert page.name == "report.html" and page.stat().st_size < MAX_BYTES
    assert_self_contained(text)
    found = figures(page)
    assert sorted(found) == ["memory-fwd", "time-fwd"]
    time = found["time-fwd"]
    series = [t for t in time["data"] if t.get("legendgroup") != "guides"]
    # a fit needs three clean points: the window's exponent is in its legend entry, full's not
    assert [t["name"] for t in series] == ["full [sdpa]", "sliding_window(window=16) [blocked] ~N^1.00"]
    assert [t["x"] for t in series] == [[256, 512], [256, 512, 1024]]
    assert len({t["line"]["color"] for t in series}) == len(series)
    guides = {t["name"]: t for t in time["data"] if t.get("legendgroup") == "guides"}
    assert sorted(guides) == ["guide: grows as N", "guide: grows as N^2"]
    for name, power in (("guide: grows as N", 1), ("guide: grows as N^2", 2)):
        (x0, x1), (y0, y1) = guides[name]["x"], guides[name]["y"]
        assert (x0, x1) == (256, 1024) and abs(y1 / y0 - 4**power) < 1e-9
    assert time["layout"]["xaxis"]["type"] == "log" and time["layout"]["yaxis"]["type"] == "log"
    assert time["data"][0]["error_y"]["array"] == [0.25, 1.5]  # half the IQR
    assert time["data"][0]["marker"]["symbol"] == ["circle", "circle-open"]  # the noisy row hollow
    hover = time["data"][0]["customdata"][1]
    assert hover[:4] == ["full", "sdpa", "sdpa", 512] and hover[-1] == "ok, noisy"
    assert text.count('<tr data-variant="full" data-kernel="sdpa" data-pass="fwd" class="failed">') == 1
    assert text.count('class="noisy"') == 1
    assert "timed out after 60 s" in text


def test_the_provenance_is_at_the_top(speed_run):
    text = write_report_html(speed_run).read_text(encoding="utf-8")
    top = text[text.index("<body>"):text.index("<section>")]
    for what in ("commit(s)", "machine(s)", "torch", "threads", "allocator", "command line(s)"):
        assert f"<dt>{what}</dt>" in top
    assert "attn-bench sweep quick --out runs/x" in top
    assert "f" * 40 in top  # the rows' commit


@pytest.mark.parametrize(("argv", "expected"), [
    (["/venv/bin/attn-bench", "sweep", "quick", "--out", "runs/a b"], "attn-bench sweep quick --out 'runs/a b'"),
    (["/venv/lib/pytest/__main__.py", "-q"], "python -m pytest -q")])
def test_the_command_line_is_recorded_with_the_environment(monkeypatch, argv, expected):
    monkeypatch.setattr("sys.argv", argv)
    assert environment("cpu", None)["command"] == expected


def test_a_quality_page_has_a_series_per_variant_and_marks_failed_runs(tmp_path):
    run = tmp_path / "quality"
    run.mkdir()
    source = (ROOT / "results/quality-small/quality.csv").read_text(encoding="utf-8").splitlines(keepends=True)
    lines = [source[0], *source[1:120]]
    failed = source[1].split(",")
    failed[0], failed[11], failed[12] = "deadbeefdeadbeef", "error", "worker died"
    lines.append(",".join(failed))
    (run / "quality.csv").write_text("".join(lines), encoding="utf-8")
    page = write_report_html(run)
    assert page.stat().st_size < MAX_BYTES
    assert_self_contained(page.read_text(encoding="utf-8"))
    top = headline(load_quality(run))
    found = figures(page)
    for metric, rows in top.groupby("metric"):
        figure = found[f"metric-{metric}"]
        data, variants = figure["data"], rows[rows.role == "variant"]
        assert sorted(t["name"] for t in data if t["showlegend"]) == sorted(variants.label.unique())
        assert sum(len(t["x"]) for t in data) == variants.groupby(["label", "task"]).ngroups
        colours = {t["name"]: t["marker"]["color"] for t in data}
        assert len(set(colours.values())) == len(colours)  # a colour per variant, the same in every panel
        assert len(figure["layout"]["annotations"]) >= rows.task.nunique()  # panel titles, then lines
        controls = rows[rows.role == "control"]
        lines = [a["text"] for a in figure["layout"]["annotations"] if a.get("xanchor") == "right"]
        assert set(controls.label) <= set(lines)
    text = page.read_text(encoding="utf-8")
    assert text.count('class="failed"') == 1 and "worker died" in text


def test_report_writes_the_page_of_a_decoding_run(tmp_path):
    run = tmp_path / "decoding"
    shutil.copytree(ROOT / "results/decoding", run, ignore=shutil.ignore_patterns("report.html"))
    result = runner.invoke(app, ["report", str(run)])
    assert result.exit_code == 0, result.output
    assert "# Decoding and streaming benchmarks" in result.output
    found = figures(run / "report.html")
    assert len(found["decoding"]["data"]) == 2  # full with and without the cache
    assert len(found["streaming"]["data"]) == 4  # step and recompute, at 1 and 2 layers


def test_report_writes_the_page_beside_report_md(speed_run):
    result = runner.invoke(app, ["report", str(speed_run)])
    assert result.exit_code == 0, result.output
    assert (speed_run / "report.md").is_file() and (speed_run / "report.html").is_file()
    assert f"page: {speed_run / 'report.html'}" in result.output


#: committed run directories a training run still writes to: their pages come when it ends
IN_PROGRESS = ("quality-small-next",)


def test_every_committed_run_has_its_page_under_5_mb():
    runs = sorted({p.parent for name in ("results.csv", "quality.csv") for p in (ROOT / "results").rglob(name)})
    runs = [run for run in runs if run.name not in IN_PROGRESS]
    assert len(runs) >= 7
    for run in runs:
        page = run / "report.html"
        assert page.is_file(), f"{run} has no report.html (attn-bench report {run.relative_to(ROOT)})"
        assert page.stat().st_size < MAX_BYTES
        assert_self_contained(page.read_text(encoding="utf-8"))
    history = ROOT / "results/history.html"
    assert history.is_file() and history.stat().st_size < MAX_BYTES


def test_the_readme_shows_a_page_and_says_how_to_open_one():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    shot = re.search(r"!\[[^\]]*\]\((docs/[^)]+\.png)\)", readme[readme.index("## Result pages"):])
    assert shot and (ROOT / shot.group(1)).is_file()
    assert "report.html" in readme and "opens offline" in readme


def test_the_committed_history_shows_every_commit_of_the_committed_runs():
    import csv

    text = (ROOT / "results/history.html").read_text(encoding="utf-8")
    commits_table = text[text.index('id="commits"'):]
    shown = set(re.findall(r">([0-9a-f]{12})<", commits_table[:commits_table.index("</table>")]))
    recorded = set()
    for name in ("results.csv", "quality.csv"):
        for path in (ROOT / "results").rglob(name):
            if path.parent.name in IN_PROGRESS:
                continue  # a training run still adding rows, perhaps from newer commits
            with path.open(encoding="utf-8") as file:
                recorded |= {row["git_sha"][:12] for row in csv.DictReader(file) if row.get("git_sha")}
    assert recorded and recorded <= shown, sorted(recorded - shown)
