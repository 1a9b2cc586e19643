"""Edited or damaged results are never trusted: a row whose value its column does not allow
is left out with its line number and measured again on resume (the line kept in
``results.csv.rejected``); a damaged header is one error that leaves the file as it is; the
report never crashes on a bad row; the regression gate fails on an ``ok`` row without a
finite time (``broken``)."""

from __future__ import annotations

import csv
import warnings

import pytest
from typer.testing import CliRunner

from bench.cli import app
from bench.engine.results import RESULTS_FILE, DamagedFileError, DamagedRowWarning, ResultsWriter, read_rows
from bench.engine.row_schema import COLUMNS
from bench.engine.rundir import RunRecorder
from bench.runner import load_run
from bench.speed.compare import classify_runs
from bench.speed.report import build_report
from bench.speed.sweep import run_sweep

runner = CliRunner()
LENGTHS = (256, 512, 1024, 2048)


def _row(n: int, time_ms: object = 10.0, status: str = "ok") -> dict:
    ok = status == "ok"
    return {"case_id": f"full-{n}", "label": "full", "variant": "full", "kernel_requested": "sdpa",
            "kernel": "sdpa", "params": "{}", "seq_len": n, "batch": 1, "heads": 8,
            "head_dim": 64, "dtype": "float32", "device": "cpu", "causal": False,
            "pass": "fwd", "status": status, "reason": "" if ok else "timed out",
            "time_ms": time_ms if ok else None, "time_iqr_ms": 0.0 if ok else None,
            "repeats": 5 if ok else None, "peak_mem_bytes": n * 1000,
            "timestamp": "2026-01-01T00:00:00"}


def _run(path, rows):
    path.mkdir()
    ResultsWriter(path).append(rows)
    return path


def _edit(path, line: int, column: str, value: str) -> None:
    """Set one cell of ``results.csv`` (line 1 is the header) as a user with an editor would."""
    with (path / RESULTS_FILE).open(newline="") as f:
        rows = list(csv.reader(f))
    rows[line - 1][rows[0].index(column)] = value
    with (path / RESULTS_FILE).open("w", newline="") as f:
        csv.writer(f).writerows(rows)


def _drop_column(path, column: str) -> None:
    with (path / RESULTS_FILE).open(newline="") as f:
        rows = list(csv.DictReader(f))
    with (path / RESULTS_FILE).open("w", newline="") as f:
        writer = csv.DictWriter(f, [c for c in COLUMNS if c != column], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


@pytest.mark.parametrize(("column", "value", "said"), [
    ("time_ms", "fast", "column 'time_ms': must be a number; got 'fast'"),
    ("seq_len", "abc", "column 'seq_len': must be an integer; got 'abc'"),
    ("time_ms", "", "column 'time_ms': an ok row must have a finite time > 0"),
    ("time_ms", "inf", "column 'time_ms': an ok row must have a finite time > 0"),
    ("status", "great", "column 'status': unknown value 'great'"),
    ("params", "{broken", "column 'params': must be JSON"),
])
def test_a_row_its_columns_do_not_allow_is_left_out_and_named_by_line(tmp_path, column, value, said):
    run = _run(tmp_path / "run", [_row(n) for n in LENGTHS])
    _edit(run, 3, column, value)
    with pytest.warns(DamagedRowWarning, match=rf"results.csv line 3: {said}"):
        rows = read_rows(run)
    assert [int(r["seq_len"]) for r in rows] == [256, 1024, 2048]


def test_blank_cells_stay_legal_in_failure_rows_and_nan_reads_as_missing(tmp_path):
    run = _run(tmp_path / "run", [_row(256), _row(512, status="timeout"),
                                  {**_row(1024), "peak_mem_bytes": float("nan")}])
    with warnings.catch_warnings():
        warnings.simplefilter("error", DamagedRowWarning)
        assert len(read_rows(run)) == 3


@pytest.mark.parametrize("column", ["time_ms", "case_id"])
def test_a_header_without_a_needed_column_is_one_error_and_the_file_stays(tmp_path, column):
    run = _run(tmp_path / "run", [_row(n) for n in LENGTHS])
    _drop_column(run, column)
    before = (run / RESULTS_FILE).read_bytes()
    with pytest.raises(DamagedFileError, match=rf"results.csv line 1: the header lacks the "
                                               rf"column\(s\) \['{column}'\]"):
        read_rows(run)
    with pytest.raises(DamagedFileError):  # a resume stops before writing anything
        RunRecorder(run, file=RESULTS_FILE, columns=COLUMNS, key=lambda r: (r["case_id"], r["pass"]))
    assert (run / RESULTS_FILE).read_bytes() == before
    result = runner.invoke(app, ["report", str(run)])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output


def test_the_report_and_its_fits_never_crash_on_a_bad_row(tmp_path):
    run = _run(tmp_path / "run", [_row(n, time_ms=n / 100) for n in LENGTHS])
    _edit(run, 2, "seq_len", "abc")
    _edit(run, 3, "time_ms", "fast")
    with pytest.warns(DamagedRowWarning):
        text = build_report(run)
    assert "Rows by status: ok 2" in text


@pytest.fixture
def sweep_config():
    from bench.engine.testing import unregister_test_variants

    yield lambda: load_run({
        "name": "damaged", "passes": ["fwd"], "seq_len": [16, 32], "heads": 1, "head_dim": 8,
        "repeats": 2, "timeout_s": 30, "plugins": ["bench.engine.testing"], "peak_matmul_size": 128,
        "variants": [{"name": "bench_sleep", "seconds": 0.01}]})
    unregister_test_variants()


def test_a_damaged_row_is_measured_again_on_resume_and_its_line_kept(tmp_path, sweep_config):
    out = tmp_path / "out"
    run_sweep(sweep_config(), out)
    good = read_rows(out)
    _edit(out, 2, "time_ms", "fast")
    with pytest.warns(DamagedRowWarning, match="line 2: column 'time_ms'"):
        new = run_sweep(sweep_config(), out)
    assert [(r["case_id"], r["status"]) for r in new] == [(good[0]["case_id"], "ok")]
    after = read_rows(out)
    assert after[0] == good[1] and len(after) == 2 and after[1]["time_ms"] != "fast"
    kept = (out / f"{RESULTS_FILE}.rejected").read_text().splitlines()
    assert kept[0].startswith("case_id,") and ",fast," in kept[1]


def test_a_quality_unit_with_a_damaged_row_trains_again_whole(tmp_path):
    from bench.engine.row_schema import QUALITY_COLUMNS
    from bench.quality.grid import QUALITY_FILE

    def row(unit: str, metric: str, value: object, **extra) -> dict:
        return {"unit_id": unit, "task": "recall", "variant": "full", "params": "{}",
                "seed": 0, "split": "test", "metric": metric, "condition": "", "value": value,
                "status": "ok", "steps": 16, "timestamp": "2026-01-01T00:00:00+00:00", **extra}

    rows = [row("a", "accuracy", 0.5), row("a", "loss", "x"), row("b", "accuracy", 0.7),
            row("r", "accuracy", 0.4, role="reference", steps=None, param_count=None),
            {**row("d", "-", None), "split": "-", "status": "diverged", "steps": 3}]
    ResultsWriter(tmp_path, rows, QUALITY_FILE, QUALITY_COLUMNS)
    with pytest.warns(DamagedRowWarning, match="quality.csv line 3: column 'value': must be a number"):
        recorder = RunRecorder(tmp_path, file=QUALITY_FILE, columns=QUALITY_COLUMNS,
                               key=lambda r: (r["unit_id"], r["split"], r["metric"], r["condition"]))
    assert sorted({r["unit_id"] for r in recorder.kept}) == ["b", "d", "r"]  # all of unit a goes


def _compare(a, b) -> tuple[int, str]:
    result = runner.invoke(app, ["compare", str(a), str(b), "--fail-if-regression", "10"])
    return result.exit_code, result.output


@pytest.mark.parametrize("time_b", ["", "fast", "nan", "inf"])
def test_the_gate_fails_on_an_ok_row_without_a_finite_time(tmp_path, time_b):
    a = _run(tmp_path / "a", [_row(n) for n in LENGTHS])
    b = _run(tmp_path / "b", [_row(n) for n in LENGTHS])
    _edit(b, 2, "time_ms", time_b)
    with pytest.warns(DamagedRowWarning):
        table = classify_runs(a, b)
    assert table["class"].tolist().count("broken") == 1
    code, output = _compare(a, b)
    assert code == 1, output
    assert "broken 1," in output and "regression gate failed: 1 broken" in output
