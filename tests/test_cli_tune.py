"""``attn-bench tune``: a real quick run writes a tuning file ``auto`` then reads, ``--show`` says what it reads,
``--evaluate`` judges both tables on the same rounds, and bad options are one line naming the option."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from attn import AttentionCall, create_attention
from attn.kernels.auto import choose_kernel
from attn.kernels.tuning import TUNING_ENV, KindOrder, TuningFile, TuningTable, device_name, machine_identity, to_json
from bench.engine.threads import torch_threads

runner = CliRunner()


def cli(*args: str):
    from bench.cli import app

    return runner.invoke(app, ["tune", *args])


def test_every_exact_variant_of_the_quick_sweep_is_measured_in_its_kind() -> None:
    """A kind's tuned order serves every variant of that kind; one measured on ``full`` alone chose
    ``chunked`` for causal calls at 256 keys, 1.8x slower there than ``sdpa``."""
    from attn.kernels.auto import kernel_kind
    from bench.runner import load_run
    from bench.speed.tune import TUNED_KINDS, WORKLOAD

    measured = {(v.name, v.params) for v in WORKLOAD}
    for variant in load_run("quick").variants:
        pattern = create_attention(variant.name, num_heads=8, **dict(variant.params)).pattern()
        if kernel_kind(pattern) in TUNED_KINDS:
            assert (variant.name, tuple(sorted(dict(variant.params).items()))) in measured, variant.name


def test_a_quick_tune_writes_a_file_auto_reads(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "cache" / "tuning.json"
    monkeypatch.setenv(TUNING_ENV, str(out))
    result = cli("--quick", "--seq-len", "32", "--seq-len", "64", "--threads", "1", "--out", str(out))
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["identity"] == machine_identity()  # the machine the suite records for rows, and torch
    [table] = data["tables"]
    assert (table["device"], table["dtype"], table["threads"]) == ("cpu", "float32", 1)
    assert set(table["orders"]) == {"plain", "biased", "banded"} and set(table["orders"]["plain"]) == {"fwd", "fwd_bwd"}
    timed = {(t["variant"], t["pass"], t["seq_len"], t["kernel"]) for t in table["times"]}
    # interleaved rounds of every candidate at both lengths and passes (quick: one variant per kind)
    for pass_name in ("fwd", "fwd_bwd"):
        assert {("full", pass_name, n, k) for n in (32, 64) for k in ("sdpa", "chunked")} <= timed
        assert {("relative", pass_name, 32, k) for k in ("relative", "chunked", "sdpa")} <= timed
        assert {("sliding_window", pass_name, 32, k) for k in ("blocked", "sdpa")} <= timed
    assert not any(kernel == "flex" for *_, kernel in timed)  # compiles per shape: not timed on the CPU
    assert all(len(t["times_ms"]) >= 5 and t["time_ms"] > 0 for t in table["times"])
    for kind, kernels in (("plain", {"sdpa", "chunked"}), ("biased", {"sdpa", "chunked", "relative"}),
                          ("banded", {"sdpa", "blocked", "flex"})):  # the fixed table's kernels, reference never
        for order in table["orders"][kind].values():
            assert set(order["long"]) == kernels and set(order["short"]) <= kernels
    for order in table["orders"]["banded"].values():  # flex, never timed, keeps its fixed slot
        assert order["long"][1] == "flex" and (not order["short"] or order["short"][2] == "flex")
    assert "auto's tuned orders (cpu, float32, 1 threads)" in result.output and f"wrote {out}" in result.output
    shown = cli("--show", "--threads", "1", "--out", str(out))
    assert shown.exit_code == 0 and "tuned:" in shown.output and "plain" in shown.output
    # auto follows the file: its long plain order's first kernel for a long call without gradients
    call = AttentionCall("cpu", torch.float32, False, False, 4096, 4096)
    with torch_threads(1):  # the file's table is for one thread
        expected = table["orders"]["plain"]["fwd"]["long"][0]
        assert choose_kernel(create_attention("full").pattern(), call) == expected


def write_file(path: Path, orders: dict[tuple[str, str], KindOrder]) -> None:
    table = TuningTable("cpu", device_name("cpu"), "float32", torch.get_num_threads(), orders)
    path.write_text(json.dumps(to_json(TuningFile(machine_identity(), (table,)))))


def test_evaluate_judges_the_fixed_and_the_tuned_choice_on_the_same_rounds(tmp_path: Path) -> None:
    tuned = tmp_path / "t.json"
    write_file(tuned, {("plain", "fwd"): KindOrder(("chunked", "sdpa"))})  # forward full attention on chunked
    report = tmp_path / "eval" / "evaluation.json"
    result = cli("--evaluate", "--out", str(tuned), "--variant", "full", "--seq-len", "32", "--pass", "fwd",
                 "--quick", "--eval-out", str(report))
    assert result.exit_code == 0, result.output
    data = json.loads(report.read_text())
    [case] = data["cases"]
    assert (case["label"], case["seq_len"], case["pass_name"]) == ("full", 32, "fwd")
    assert case["default_pick"] == "sdpa" and case["tuned_pick"] == "chunked"
    assert {"sdpa", "chunked", "reference"} <= set(case["times_ms"]) and "flex" not in case["times_ms"]
    fastest = min(case["times_ms"].values())
    within = case["times_ms"]["chunked"] <= 1.05 * fastest
    assert data["share_within"]["tuned"] == (1.0 if within else 0.0)
    assert "auto within 5% of the fastest kernel in 1 cases" in result.output


@pytest.mark.parametrize(("args", "message"), [
    (["--variant", "full"], "--variant: only with --evaluate"),
    (["--kind", "approximate"], "--kind: unknown value 'approximate'; allowed values are ['banded', 'biased', "),
    (["--dtype", "int8"], "--dtype: unknown value 'int8'"),
    (["--repeats", "3"], "--repeats"),
    (["--evaluate", "--show"], "--show: not with --evaluate"),
])
def test_bad_options_are_one_line_naming_the_option(args, message, tmp_path) -> None:
    result = cli(*args, "--out", str(tmp_path / "t.json"))
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_evaluate_without_a_file_for_this_machine_names_out(tmp_path: Path) -> None:
    result = cli("--evaluate", "--out", str(tmp_path / "none.json"), "--variant", "full", "--seq-len", "32")
    assert result.exit_code == 2 and "--out: no tuning file at" in result.output
    result = cli("--evaluate", "--out", str(tmp_path / "none.json"), "--variant", "nope")
    assert result.exit_code == 2 and "--variant: unknown value 'nope'" in result.output


def test_show_says_why_a_file_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    write_file(path, {("plain", "fwd"): KindOrder(("chunked", "sdpa"))})
    data = json.loads(path.read_text())
    data["identity"]["torch_version"] = "0.0.1"
    path.write_text(json.dumps(data))
    result = cli("--show", "--out", str(path))
    assert result.exit_code == 0 and "ignored: measured elsewhere: torch_version '0.0.1' there" in result.output


def test_help() -> None:
    result = cli("--help")
    assert result.exit_code == 0 and "--evaluate" in result.output and "--quick" in result.output
