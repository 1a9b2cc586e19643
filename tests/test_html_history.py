"""``attn-bench history``: run directories found recursively, one store across runs, steps
between consecutive commits on one machine classed by the rule of ``attn-bench compare``,
the page and the gate on the newest step."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys

import pandas as pd
import pytest
from typer.testing import CliRunner

from bench.cli import app
from bench.engine.results import ResultsWriter, write_env
from bench.html.history import build_history
from bench.html.history_rows import figure_meta
from bench.html.history_steps import worse_is_larger
from bench.html.history_store import SCHEMA_VERSION
from bench.speed.compare import classify_runs

runner = CliRunner()
SHAS = ("a" * 40, "b" * 40, "c" * 40)
LENGTHS = (256, 512)


def _row(n: int, sha: str, day: int, time_ms: float, iqr_ms: float = 0.5, host: str = "vm",
         status: str = "ok") -> dict:
    ok = status == "ok"
    return {
        "case_id": f"full-sdpa-{n}", "label": "full", "variant": "full", "kernel_requested": "sdpa",
        "kernel": "sdpa", "params": "{}", "seq_len": n, "batch": 1, "heads": 8, "head_dim": 64,
        "dtype": "float32", "device": "cpu", "causal": False, "pass": "fwd", "status": status,
        "reason": "" if ok else "timed out", "time_ms": time_ms if ok else None,
        "time_iqr_ms": iqr_ms if ok else None, "repeats": 5 if ok else None,
        "peak_mem_bytes": 2**20 * n / 64 if ok else None, "threads": 2, "git_sha": sha,
        "device_name": "CPU X", "hostname": host, "timestamp": f"2026-01-0{day}T00:00:00+00:00",
    }


def _run(path, rows):
    path.mkdir(parents=True)
    ResultsWriter(path).append(rows)
    write_env(path, [{"git_sha": rows[0]["git_sha"], "device_name": "CPU X", "hostname": rows[0]["hostname"],
                      "threads": 2, "torch_version": "2.x", "timestamp": rows[0]["timestamp"]}])
    return path


@pytest.fixture
def three_commits(tmp_path):
    """Three runs of the same cases at three commits (nested folders); N=512 gets 50% slower
    at the third, beyond its spread; N=256 moves within it."""
    root = tmp_path / "results"
    _run(root / "one", [_row(n, SHAS[0], 1, 10.0 * n / 256) for n in LENGTHS])
    _run(root / "deeper" / "two", [_row(n, SHAS[1], 2, 10.0 * n / 256 + 0.2) for n in LENGTHS])
    _run(root / "three", [_row(256, SHAS[2], 3, 10.3), _row(512, SHAS[2], 3, 30.0)])
    return root


def test_every_run_is_found_and_keyed_by_commit_machine_and_case(three_commits, tmp_path):
    found = build_history([three_commits], tmp_path / "out")
    assert found.counts == {"runs": 3, "read": 3, "kept": 0}
    time = found.rows[found.rows.figure == "time_ms"]
    assert sorted(time.commit_sha.unique()) == list(SHAS)
    assert time.machine.unique().tolist() == ["CPU X, 2 threads, host vm"]
    assert time.case.nunique() == 2 and len(time) == 6
    # commits unknown to git are timed by their earliest row, and say so
    assert set(found.rows.commit_time_source) == {"first row"}
    assert found.rows.groupby("commit_sha").commit_time.first()[SHAS[0]].startswith("2026-01-01")


def test_a_step_is_classed_as_compare_classes_the_two_runs(three_commits, tmp_path):
    found = build_history([three_commits], tmp_path / "out")
    steps = found.steps[found.steps.figure == "time_ms"]
    assert len(steps) == 4  # two cases, three commits each
    for a, b in (("one", "deeper/two"), ("deeper/two", "three")):
        compared = classify_runs(three_commits / a, three_commits / b)
        for n, verdict in zip(compared.seq_len, compared["class"]):
            mine = steps[steps.case.str.contains(f"N={n} ") & steps.run_b.str.endswith(b)]
            assert mine["class"].tolist() == [verdict]
    newest = found.newest_regressions
    assert newest[["figure", "class"]].values.tolist() == [["time_ms", "worse"]]
    assert "N=512" in newest.case.iloc[0]


def test_the_store_reads_only_changed_runs(three_commits, tmp_path):
    build_history([three_commits], tmp_path / "out")
    again = build_history([three_commits], tmp_path / "out")
    assert again.counts == {"runs": 3, "read": 0, "kept": 3}
    ResultsWriter(three_commits / "three").append([_row(1024, SHAS[2], 3, 50.0)])
    third = build_history([three_commits], tmp_path / "out")
    assert third.counts == {"runs": 3, "read": 1, "kept": 2}
    assert third.rows.case.str.contains("N=1024 ").any()
    with sqlite3.connect(tmp_path / "out" / "history.sqlite") as db:
        assert db.execute("SELECT COUNT(DISTINCT run) FROM cases").fetchone()[0] == 3


@pytest.mark.parametrize("store", [
    b"not a database at all",
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT); "
    f"INSERT INTO meta VALUES ('schema', '{SCHEMA_VERSION}'); "
    "CREATE TABLE cases (run TEXT, figure TEXT); INSERT INTO cases VALUES ('x', 'y')",
])
def test_a_damaged_or_foreign_store_is_rebuilt_with_a_warning(three_commits, tmp_path, store):
    out = tmp_path / "out"
    out.mkdir()
    first = build_history([three_commits], tmp_path / "clean")
    if isinstance(store, bytes):
        (out / "history.sqlite").write_bytes(store * 100)
    else:
        with sqlite3.connect(out / "history.sqlite") as db:
            db.executescript(store)
    with pytest.warns(UserWarning, match=r"history.sqlite: not a history store of this version .*; rebuilt"):
        found = build_history([three_commits], out)
    assert found.counts == {"runs": 3, "read": 3, "kept": 0}
    pd.testing.assert_frame_equal(found.rows, first.rows)


def test_one_series_per_machine_and_no_step_across_machines(tmp_path):
    root = tmp_path / "results"
    _run(root / "fast", [_row(256, SHAS[0], 1, 10.0, host="fast")])
    _run(root / "slow", [_row(256, SHAS[1], 2, 40.0, host="slow")])
    found = build_history([root], tmp_path / "out")
    assert found.steps.empty  # one commit per machine: nothing to compare
    figure = _figures(found.page)["history-time_ms"]
    assert [trace["name"] for trace in figure["data"]] == ["CPU X, 2 threads, host fast",
                                                           "CPU X, 2 threads, host slow"]


def test_two_cpus_of_one_name_are_two_machines_each_row_by_the_segment_that_wrote_it(tmp_path):
    root = tmp_path / "results"
    run = _run(root / "resumed", [_row(256, SHAS[0], 1, 10.0), _row(512, SHAS[0], 3, 20.0)])
    segment = {"git_sha": SHAS[0], "device": "cpu", "device_name": "CPU X", "hostname": "vm", "threads": 2}
    write_env(run, [{**segment, "cpu_capability": "AVX2", "timestamp": "2026-01-01T00:00:00+00:00"},
                    {**segment, "cpu_capability": "AVX512", "timestamp": "2026-01-02T00:00:00+00:00"}])
    _run(root / "unrecorded", [_row(256, SHAS[1], 4, 10.0)])  # an env.json without the CPU's fields
    found = build_history([root], tmp_path / "out")
    time = found.rows[found.rows.figure == "time_ms"].sort_values("timestamp")
    assert time.machine.tolist() == ["CPU X (AVX2), 2 threads, host vm", "CPU X (AVX512), 2 threads, host vm",
                                     "CPU X, 2 threads, host vm"]
    assert found.steps.empty  # N=256 at two commits, but on two machines: no step between them


def _figures(page) -> dict:
    text = page.read_text(encoding="utf-8")
    return {m.group(1): json.loads(m.group(2)) for m in re.finditer(
        r'<script type="application/json" id="([^"]+)-data">(.*?)</script>', text, re.S)}


def test_the_page_marks_the_regression_and_links_each_point_to_its_run(three_commits, tmp_path):
    out = tmp_path / "out"
    found = build_history([three_commits], out)
    figure = _figures(found.page)["history-time_ms"]
    assert figure["layout"]["title"]["text"].endswith("N=512 B=1 H=8 D=64 float32 cpu")  # regression first
    trace = figure["data"][0]
    assert len(trace["x"]) == 3 and trace["marker"]["symbol"] == ["circle", "circle", "x"]
    links = [point[-1] for point in trace["customdata"]]
    assert links == ["../results/one/", "../results/deeper/two/", "../results/three/"]
    assert all((out / link).is_dir() for link in links)
    menu = figure["layout"]["updatemenus"][0]["buttons"]
    assert len(menu) == 2  # one entry per case
    assert 'class="regression"' in found.page.read_text(encoding="utf-8")


def test_the_gate_fails_on_the_newest_step_only(three_commits, tmp_path):
    result = runner.invoke(app, ["history", str(three_commits), "--out", str(tmp_path / "out"),
                                 "--fail-if-regression", "10"])
    assert result.exit_code == 1, result.output
    assert "the newest step of 1 series is a regression" in result.output
    # a fourth commit back at the old speed: the regression is history, the gate passes
    _run(three_commits / "four", [_row(256, "d" * 40, 4, 10.2), _row(512, "d" * 40, 4, 20.1)])
    result = runner.invoke(app, ["history", str(three_commits), "--out", str(tmp_path / "out"),
                                 "--fail-if-regression", "10"])
    assert result.exit_code == 0, result.output
    assert "no regression" in result.output


def test_a_case_that_stops_running_is_newly_failing(tmp_path):
    root = tmp_path / "results"
    _run(root / "one", [_row(256, SHAS[0], 1, 10.0)])
    _run(root / "two", [_row(256, SHAS[1], 2, 10.0, status="timeout")])
    found = build_history([root], tmp_path / "out")
    assert found.steps[found.steps.figure == "time_ms"]["class"].tolist() == ["newly failing"]


@pytest.mark.parametrize(("figure", "value", "expected"), [
    ("time_ms", 12.0, 12.0), ("accuracy", 91.5, 8.5), ("bleu", 3.0, 97.0),
    ("bits_per_byte", 4.1, 4.1), ("tokens_per_s", 250.0, 4.0)])
def test_every_figure_is_put_so_that_larger_is_worse(figure, value, expected):
    lower_is_better = figure_meta(figure)[1]  # a quality metric's: as its tasks say
    assert worse_is_larger(figure, value, 1.0, lower_is_better)[0] == pytest.approx(expected)


def test_bad_input_is_one_line(tmp_path):
    result = runner.invoke(app, ["history", str(tmp_path / "missing")])
    assert result.exit_code == 2
    assert "RESULTS_DIR" in result.output and "no such directory" in result.output
    (tmp_path / "empty").mkdir()
    result = runner.invoke(app, ["history", str(tmp_path / "empty")])
    assert result.exit_code == 2 and "no run directory with rows found" in result.output


def test_a_history_whose_runs_are_unchanged_imports_no_torch(tmp_path):
    """Every figure's title and direction are kept with its rows, so rewriting the page of an
    unchanged store needs neither the task registry nor torch (seconds saved on every call)."""
    root = tmp_path / "results"
    _run(root / "one", [_row(256, SHAS[0], 1, 10.0)])
    build_history([root], tmp_path / "out")  # reads the run (and imports what reading needs)
    script = ("import sys; from pathlib import Path; from bench.html.history import build_history; "
              f"found = build_history([Path({str(root)!r})], Path({str(tmp_path / 'out')!r})); "
              "print(found.counts['kept'], 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "False"]
