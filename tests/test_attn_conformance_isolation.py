"""A plug-in can stop neither the kit nor a sweep silently: each check runs in a child process
under a time limit, so a variant that exits, crashes or hangs gives a FAIL line naming the
check and the cause; in a sweep, a variant whose output is NaN gets ``nonfinite`` rows,
never ``ok`` ones."""

from __future__ import annotations

import importlib
import sys
import textwrap
import time
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from attn.conformance import check_attention
from attn.conformance.isolation import Job
from attn.registry import unregister_attention
from bench.cli import app
from bench.speed.config import parse_config
from bench.speed.sweep import run_sweep

runner = CliRunner()

PLUGIN = '''
"""Hostile variants for the reliability tests."""
import os
import signal
import time

from attn import Attention, KernelPath, register_attention


class _Base(Attention):
    exact = False
    supports_causal = False

    def native_path(self):
        return KernelPath("native", self.name)


@register_attention("reliability_exit", overwrite=True)
class Exits(_Base):
    def native_forward(self, q, k, v, causal, key_mask):
        os._exit(3)


@register_attention("reliability_segfault", overwrite=True)
class Crashes(_Base):
    def native_forward(self, q, k, v, causal, key_mask):
        os.kill(os.getpid(), signal.SIGSEGV)


@register_attention("reliability_hang", overwrite=True)
class Hangs(_Base):
    def native_forward(self, q, k, v, causal, key_mask):
        time.sleep(10**6)


@register_attention("reliability_nan", overwrite=True)
class NaNs(_Base):
    def native_forward(self, q, k, v, causal, key_mask):
        return v * float("nan") + 0 * q
'''
NAMES = ("reliability_exit", "reliability_segfault", "reliability_hang", "reliability_nan")


@pytest.fixture
def hostile(tmp_path, monkeypatch):
    """The hostile plug-in module, importable here and in every child process."""
    (tmp_path / "reliability_plugin.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("reliability_plugin")
    yield "reliability_plugin"
    for name in NAMES:
        unregister_attention(name)
    sys.modules.pop("reliability_plugin", None)


def _failures(report) -> dict[str, str]:
    return {r.check: r.message for r in report.results if r.status == "fail"}


@pytest.mark.parametrize(("name", "cause"), [
    ("reliability_exit", "the check's process exited with code 3 before the check finished"),
    ("reliability_segfault", "the check's process was killed by SIGSEGV"),
])
def test_a_variant_that_ends_the_process_fails_each_check_with_the_cause(hostile, name, cause):
    report = check_attention(name, isolate=True)
    failed = _failures(report)
    assert {"shape_dtype_finite", "gradients", "key_mask", "batch_independence"} <= set(failed)
    assert all(message == cause or message.startswith(cause) for message in failed.values())


def test_a_variant_that_hangs_fails_its_first_check_and_the_kit_calls_that_kernel_no_more(hostile):
    start = time.monotonic()
    report = check_attention("reliability_hang", timeout_s=1, isolate=True)
    assert _failures(report) == {"shape_dtype_finite": "did not finish within 1 s (the per-check limit); "
                                                      "its process was killed"}
    not_run = {r.check for r in report.results if r.message.startswith("not run: check shape_dtype_finite "
                                                                       "timed out on kernel 'native'")}
    assert {"gradients", "key_mask", "batch_independence", "causal_no_leak"} <= not_run
    assert all(r.status == "skip" for r in report.results if r.check in not_run)
    assert time.monotonic() - start < 30


def test_after_two_time_outs_the_kit_calls_the_variant_no_more():
    job = Job("x", None, {}, None, "cpu", 0, True)
    assert job.not_run("sdpa") is None
    once = replace(job, timed_out=(("sdpa", "gradients"),))
    assert once.not_run("sdpa") == ("not run: check gradients timed out on kernel 'sdpa'; "
                                    "the kit calls that kernel no more")
    assert once.not_run("reference") is None
    twice = replace(once, timed_out=(*once.timed_out, ("reference", "key_mask")))
    assert twice.not_run("chunked") == ("not run: 2 checks timed out (gradients on sdpa, key_mask on reference); "
                                        "the kit calls this variant no more")


def test_the_check_command_says_which_check_failed_and_why(hostile):
    result = runner.invoke(app, ["check", "reliability_exit", "--plugin", hostile,
                                 "--timeout-s", "30"])
    assert result.exit_code == 1
    assert ("FAIL: [FAIL] shape_dtype_finite kernel=native params={}: the check's process "
            "exited with code 3") in result.output


def test_a_variant_with_nan_outputs_gets_nonfinite_rows_in_a_sweep(hostile, tmp_path):
    config = parse_config({"name": "nan", "passes": ["fwd", "bwd"], "seq_len": [16], "heads": 1,
                           "head_dim": 8, "repeats": 2, "timeout_s": 60, "plugins": [hostile],
                           "peak_matmul_size": 128, "variants": [{"name": "reliability_nan"}]})
    rows = run_sweep(config, tmp_path / "out")
    assert [(r["pass"], r["status"]) for r in rows] == [("fwd", "nonfinite"), ("bwd", "nonfinite")]
    assert all("the output has 128 NaN and 0 inf values of 128" in r["reason"] for r in rows)
    assert all(r.get("time_ms") is None for r in rows)
