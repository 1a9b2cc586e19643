"""The device probe runs every phase on this CPU (small lengths) and writes one JSON line per
phase as it goes; a budget that runs out still leaves a line for every phase."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.probe import BANDED, main, phases

ROOT = Path(__file__).resolve().parents[1]


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.compile  # compiles flex for three patterns at two lengths
@pytest.mark.timeout(900)
def test_every_phase_runs_on_the_cpu(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(ROOT / ".ci/gpu-probe"), "--device", "cpu", "--quick"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=850)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {row["phase"]: row for row in _lines(tmp_path / "probe.jsonl")}
    assert list(rows) == [name for name, _, _ in phases(quick=True)]
    assert all(row["status"] == "ok" for row in rows.values()), rows
    for name in ("full_1024", "causal_2048"):
        sdpa = rows["sdpa"][name]
        assert sdpa["steady_forward_ms"] > 0 and sdpa["steady_backward_ms"] > 0
        assert 0 <= sdpa["backward_compile_s"] < 0.5  # SDPA compiles nothing; autograd was started
    assert rows["nystrom"]["speedup_over_sdpa_median"] > 0 and rows["nystrom"]["profile_top"]
    for label, _, _ in BANDED:
        flex = rows[f"flex_{label}_2048"]
        assert flex["kernel_path"].startswith("flex_attention(compiled)") and flex["fallback"] is None
        assert 0 < flex["mask_build_s"] < 1 and flex["forward_compile_s"] > 0
        assert flex["steady_forward_ms"] > 0 and "backward_compile_s" not in flex  # no CPU backward


def test_a_spent_budget_still_writes_a_line_per_phase(tmp_path, capsys):
    out = tmp_path / "probe.jsonl"
    assert main(["--device", "cpu", "--quick", "--budget-s", "0.5", "--out", str(out)]) == 0
    rows = _lines(out)
    assert [row["phase"] for row in rows] == [name for name, _, _ in phases(quick=True)]
    assert {row["status"] for row in rows} <= {"skipped", "timeout", "ok"}
    assert rows[-1]["status"] == "skipped" and "budget" in rows[-1]["reason"]
    assert capsys.readouterr().out.count("\n") == len(rows)  # the same lines on stdout
