"""A tuning file for ``auto`` (docs/kernels.md, "Tuning `auto` for this machine"): orders derived from times,
the file's round trip, when it is ignored, that without one ``auto`` keeps its fixed table, what a tuned
table may change, and the sweep row's ``auto_source``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attn import AttentionCall, attention_info, create_attention
from attn.kernels.auto import auto_order, auto_source, choose_kernel, short_keys
from attn.kernels.tuning import (
    TUNING_ENV,
    KernelTime,
    KindOrder,
    Tuning,
    TuningFile,
    TuningFileError,
    TuningLoader,
    TuningTable,
    device_name,
    from_json,
    machine_identity,
    read_tuning_file,
    to_json,
)
from bench.engine.row_schema import SPEED, row_problem
from bench.speed.cases import Case
from bench.speed.rows import path_columns
from bench.speed.tune import write_tuning
from bench.speed.tune_orders import crossover_keys, derive_order, derive_orders, place

BANDED_LONG, BANDED_SHORT = ("blocked", "flex", "sdpa"), ("sdpa", "blocked", "flex")


def times(kind: str, pass_name: str, table: dict[int, dict[str, float]], variant: str = "v") -> list[KernelTime]:
    """KernelTimes from ``{length: {kernel: ms}}``."""
    return [KernelTime(kind, variant, pass_name, n, k, ms, 0.0) for n, row in table.items() for k, ms in row.items()]


# --- deriving orders from times (pure) ---

def test_the_long_winner_its_crossover_and_the_short_order_follow_the_times() -> None:
    # sdpa wins up to 512 keys, blocked from 1024 on (the fixed table's shape, crossover moved)
    measured = times("banded", "fwd_bwd", {256: {"blocked": 4.0, "sdpa": 1.0}, 512: {"blocked": 2.0, "sdpa": 1.0},
                                           1024: {"blocked": 0.5, "sdpa": 1.0}, 2048: {"blocked": 0.3, "sdpa": 1.0}})
    order = derive_order(measured, BANDED_LONG, BANDED_SHORT)
    assert order.long == ("blocked", "flex", "sdpa")  # flex never measured: keeps its slot
    assert order.short == ("sdpa", "blocked", "flex")
    assert order.crossover == 1024
    # blocked / sdpa is 2 at 512 and 0.5 at 1024: 1 at their geometric midpoint, 724, rounded to 64s
    assert order.short_keys == 704 == crossover_keys(512, 1024, 2.0, 0.5)
    assert order.is_short(703) and not order.is_short(704) and not order.is_short(None)


def test_a_kernel_that_wins_everywhere_leaves_no_short_order() -> None:
    measured = times("plain", "fwd", {256: {"sdpa": 1.0, "chunked": 3.0}, 4096: {"sdpa": 2.0, "chunked": 9.0}})
    order = derive_order(measured, ("sdpa", "chunked"))
    assert order == KindOrder(("sdpa", "chunked"), (), None, 256)
    assert order.order(10) == order.order(None) == ("sdpa", "chunked")


def test_the_crossover_is_where_the_long_winner_wins_at_every_longer_length() -> None:
    # relative wins at 256 (noise), loses at 512, wins from 1024: the short order holds below 1024
    measured = times("biased", "fwd_bwd", {256: {"relative": 0.9, "sdpa": 1.0}, 512: {"relative": 1.2, "sdpa": 1.0},
                                           1024: {"relative": 0.8, "sdpa": 1.0}, 2048: {"relative": 0.7, "sdpa": 1.0}})
    order = derive_order(measured, ("relative", "chunked", "sdpa"), ("sdpa", "relative", "chunked"))
    assert order.crossover == 1024 and 512 < order.short_keys <= 1024
    assert order.long[0] == "relative" and order.short[0] in ("sdpa", "relative")


def test_scores_are_geometric_means_over_variants() -> None:
    # a is 2x faster for one variant, b 1.5x for the other: a wins (geomean 1.22 against 1.41)
    measured = [*times("banded", "fwd", {512: {"a": 1.0, "b": 2.0}}, "v1"),
                *times("banded", "fwd", {512: {"a": 1.5, "b": 1.0}}, "v2")]
    assert derive_order(measured, ("b", "a")).long == ("a", "b")


def test_a_win_within_noise_does_not_move_the_fixed_order() -> None:
    # relative 2% faster than sdpa at 256 keys (noise), 10% slower from 1024: sdpa everywhere, no short order
    measured = times("biased", "fwd_bwd", {256: {"relative": 113.0, "sdpa": 116.0, "chunked": 146.0},
                                           1024: {"relative": 456.0, "sdpa": 420.0, "chunked": 1300.0}})
    order = derive_order(measured, ("relative", "chunked", "sdpa"), ("sdpa", "relative", "chunked"))
    assert order == KindOrder(("sdpa", "relative", "chunked"), (), None, 256)
    # 4% is past the tie: then relative's win at 256 makes a short order
    measured[0] = KernelTime("biased", "v", "fwd_bwd", 256, "relative", 111.0, 0.0)
    moved = derive_order(measured, ("relative", "chunked", "sdpa"), ("sdpa", "relative", "chunked"))
    assert moved.short[0] == "relative" and moved.long[0] == "sdpa"


def test_a_kernel_left_unmeasured_at_long_lengths_ranks_after_the_measured_ones() -> None:
    # chunked, 3.5x and 5x relative's, was not timed at 2048 (pruned): it ranks last, not in its fixed slot
    measured = times("biased", "fwd", {512: {"chunked": 3.5, "relative": 1.0, "sdpa": 1.2},
                                       1024: {"chunked": 5.0, "relative": 1.0, "sdpa": 1.5},
                                       2048: {"relative": 1.0, "sdpa": 2.0}})
    assert derive_order(measured, ("relative", "chunked", "sdpa")).long == ("relative", "sdpa", "chunked")
    # one never timed in this pass at all (flex on the CPU) keeps its fixed slot
    assert derive_order(measured, ("relative", "flex", "chunked", "sdpa")).long == (
        "relative", "flex", "sdpa", "chunked")


def test_place_keeps_unmeasured_kernels_in_their_slot() -> None:
    assert place(["sdpa", "blocked"], ("blocked", "flex", "sdpa")) == ("sdpa", "flex", "blocked")
    assert place(["x", "sdpa"], ("sdpa",)) == ("x", "sdpa")  # a measured kernel the table lacks is kept


def test_crossover_keys_stay_between_the_two_lengths() -> None:
    assert crossover_keys(512, 1024, 1.001, 0.1) == 513  # just past 512: rounds to 512, kept above it
    assert crossover_keys(512, 1024, 50.0, 0.999) == 1024
    assert crossover_keys(512, 1024, 0.9, 0.5) == 1024  # no bracket: the measured crossover
    assert crossover_keys(64, 128, 2.0, 0.5) == 91  # between close lengths: whole keys (90.5), not 64s


def test_derive_orders_keys_each_kind_and_pass() -> None:
    measured = [*times("plain", "fwd", {256: {"sdpa": 1.0, "chunked": 2.0}}),
                *times("plain", "fwd_bwd", {256: {"sdpa": 3.0, "chunked": 2.0}})]
    orders = derive_orders(measured, {"plain": (("sdpa", "chunked"), None)})
    assert set(orders) == {("plain", "fwd"), ("plain", "fwd_bwd")}
    assert orders["plain", "fwd"].long[0] == "sdpa" and orders["plain", "fwd_bwd"].long[0] == "chunked"
    with pytest.raises(ValueError, match="times"):
        derive_order([], ("sdpa",))


# --- the file ---

def table(orders: dict[tuple[str, str], KindOrder], *, dtype: str = "float32", threads: int | None = None,
          device: str = "cpu") -> TuningTable:
    return TuningTable(device, device_name(device), dtype, threads or torch.get_num_threads(), orders,
                       (KernelTime("banded", "sliding_window", "fwd", 256, "sdpa", 1.5, 0.1, (1.4, 1.5, 1.6)),),
                       {"repeats": 5})


def write(path: Path, orders: dict[tuple[str, str], KindOrder], *, identity: dict[str, str] | None = None,
          **kwargs) -> str:
    """A tuning file at ``path`` (this machine's unless ``identity``); its short hash."""
    path.write_text(json.dumps(to_json(TuningFile(identity or machine_identity(), (table(orders, **kwargs),)))))
    return read_tuning_file(path)[1]


SDPA_FOR_BANDED_GRAD = {("banded", "fwd_bwd"): KindOrder(("sdpa", "blocked", "flex"))}


def test_the_file_round_trips(tmp_path: Path) -> None:
    orders = {("banded", "fwd_bwd"): KindOrder(("blocked", "sdpa"), ("sdpa", "blocked"), 640, 1024),
              ("plain", "fwd"): KindOrder(("sdpa", "chunked"), (), None, 256)}
    original = TuningFile(machine_identity(), (table(orders), table(orders, dtype="float64")))
    assert from_json(json.loads(json.dumps(to_json(original)))) == original
    written = write_tuning(tmp_path / "t.json", table(orders))
    parsed, sha = read_tuning_file(tmp_path / "t.json")
    assert parsed == written and len(sha) == 12
    # a second table of another dtype joins the first; one of the same key replaces it
    write_tuning(tmp_path / "t.json", table(orders, dtype="float64"))
    write_tuning(tmp_path / "t.json", table({("plain", "fwd"): KindOrder(("chunked", "sdpa"))}))
    tables = read_tuning_file(tmp_path / "t.json")[0].tables
    assert sorted(t.dtype for t in tables) == ["float32", "float64"]
    assert next(t for t in tables if t.dtype == "float32").orders == {("plain", "fwd"): KindOrder(("chunked", "sdpa"))}


def test_reference_is_dropped_from_a_file_and_bad_files_say_why() -> None:
    data = to_json(TuningFile(machine_identity(), (table({("plain", "fwd"): KindOrder(("sdpa",))}),)))
    data["tables"][0]["orders"]["plain"]["fwd"]["long"] = ["reference", "chunked", "chunked", "sdpa"]
    assert from_json(data).tables[0].orders["plain", "fwd"].long == ("chunked", "sdpa")
    for edit, message in ((lambda d: d.update(version=99), "version 99"),
                          (lambda d: d["tables"][0]["orders"].update(weird={}), "unknown kind 'weird'"),
                          (lambda d: d["tables"][0]["orders"]["plain"]["fwd"].update(short_keys=0), "short_keys"),
                          (lambda d: d["tables"][0]["orders"]["plain"]["fwd"].update(short_keys=512), "short"),
                          (lambda d: d.update(format="other"), "not a tuning file")):
        broken = json.loads(json.dumps(data))
        edit(broken)
        with pytest.raises(TuningFileError, match=message):
            from_json(broken)


@pytest.mark.parametrize(("change", "reason"), [
    ({"identity": {**machine_identity(), "cpu_model": "Another CPU"}}, "cpu_model 'Another CPU' there"),
    ({"identity": {**machine_identity(), "torch_version": "1.0.0"}}, "torch_version '1.0.0' there"),
    ({"identity": {**machine_identity(), "cpu_flags": "avx512f"}}, "cpu_flags"),
    ({"dtype": "float64"}, "no table for cpu/float32"),
    ({"threads": torch.get_num_threads() + 1}, "no table for cpu/float32"),
])
def test_a_file_of_another_machine_torch_dtype_or_thread_count_is_ignored(tmp_path, change, reason) -> None:
    path = tmp_path / "t.json"
    write(path, SDPA_FOR_BANDED_GRAD, **change)
    tuning = TuningLoader().tuning(path, "cpu", torch.float32)
    assert tuning.orders == {} and tuning.source == "default" and reason in tuning.reason
    pattern = create_attention("sliding_window", window=16).pattern()
    call = AttentionCall("cpu", torch.float32, False, True, 4096, 4096)
    assert choose_kernel(pattern, call, tuning=tuning) == "blocked"  # the fixed table's choice


def test_a_corrupt_or_missing_file_is_ignored(tmp_path) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    corrupt = TuningLoader().tuning(tmp_path / "bad.json", "cpu", torch.float32)
    assert corrupt.orders == {} and "invalid JSON" in corrupt.reason
    missing = TuningLoader().tuning(tmp_path / "none.json", "cpu", torch.float32)
    assert missing.orders == {} and missing.reason == "" and missing.source_for("banded") == "default"
    assert TuningLoader().tuning(None, "cpu", torch.float32) == Tuning()


def test_the_loader_sees_a_rewritten_file(tmp_path) -> None:
    path, loader = tmp_path / "t.json", TuningLoader()
    first = write(path, SDPA_FOR_BANDED_GRAD)
    assert loader.tuning(path, "cpu", torch.float32).source == f"tuned:{first}"
    fresh = tmp_path / "fresh.json"  # replaced atomically, as attn-bench tune writes: a new inode
    second = write(fresh, {("banded", "fwd_bwd"): KindOrder(("blocked", "sdpa"))})
    os.replace(fresh, path)
    again = loader.tuning(path, "cpu", torch.float32)
    assert again.source == f"tuned:{second}" != f"tuned:{first}"
    assert again.orders["banded", "fwd_bwd"].long == ("blocked", "sdpa")


# --- what auto does with and without a file ---

GRID_VARIANTS = [("sliding_window", {"window": 16}), ("dilated", {"window": 8, "dilation": 2}),
                 ("global_tokens", {"num_global": 2, "window": 8}), ("relative", {"bias": "alibi", "num_heads": 2}),
                 ("full", {}), ("causal", {}), ("nystrom", {})]


def fixed_rule(name: str, device: str, k_len: int | None) -> str:
    """The fixed table as docs/kernels.md states it (unpacked calls without a key mask)."""
    if name == "nystrom":
        return "native"
    if name in ("full", "causal"):
        return "sdpa"
    banded = name in ("sliding_window", "dilated", "global_tokens")
    if device == "cuda":
        return "flex"
    limit = 768 if banded else 1024
    return "sdpa" if k_len is not None and k_len < limit else ("blocked" if banded else "relative")


@pytest.mark.parametrize("setting", ["off", "missing", "foreign"])
def test_without_a_file_that_holds_auto_keeps_its_fixed_table(tmp_path, monkeypatch, setting) -> None:
    path = tmp_path / "t.json"
    if setting == "foreign":  # a file that would change every banded and biased choice, for another CPU
        orders = {(kind, p): KindOrder(("chunked", "sdpa")) for kind in ("banded", "biased", "plain")
                  for p in ("fwd", "fwd_bwd")}
        write(path, orders, identity={**machine_identity(), "cpu_model": "elsewhere"})
    monkeypatch.setenv(TUNING_ENV, "off" if setting == "off" else str(path))
    for name, params in GRID_VARIANTS:
        module = create_attention(name, **params)
        for device in ("cpu", "cuda"):
            for k_len in (64, 767, 768, 1023, 1024, 4096, None):
                for grad in (False, True):
                    call = AttentionCall(torch.device(device), torch.float32, name == "causal", grad, k_len, k_len)
                    chosen = choose_kernel(module.pattern(), call, module.preferred_kernels)
                    assert chosen == fixed_rule(name, device, k_len), (name, device, k_len, grad)


def test_a_tuned_file_changes_the_choice_for_its_pass_and_length(tmp_path, monkeypatch) -> None:
    path = tmp_path / "t.json"
    sha = write(path, {**SDPA_FOR_BANDED_GRAD,
                       ("biased", "fwd"): KindOrder(("relative", "sdpa"), ("sdpa", "relative"), 256, 256)})
    monkeypatch.setenv(TUNING_ENV, str(path))
    window = create_attention("sliding_window", window=16).pattern()
    alibi = create_attention("relative", bias="alibi", num_heads=2).pattern()

    def pick(pattern, grad, n, dtype=torch.float32):
        return choose_kernel(pattern, AttentionCall("cpu", dtype, False, grad, n, n))

    assert pick(window, True, 4096) == "sdpa"  # tuned: fixed table says blocked
    assert pick(window, False, 4096) == "blocked"  # the fwd order was not tuned
    assert pick(window, True, 4096, torch.float64) == "blocked"  # no float64 table
    assert pick(alibi, False, 512) == "relative"  # the short-call limit moved from 1024 to 256
    assert pick(alibi, False, 255) == "sdpa"
    assert pick(alibi, True, 512) == "sdpa"  # fwd_bwd keeps the fixed limit, 1024
    assert short_keys(alibi, torch.device("cpu"), torch.float32, False) == 256
    assert short_keys(alibi, torch.device("cpu"), torch.float32, True) == 1024
    assert short_keys(alibi, torch.device("cpu")) == 1024  # no dtype: the fixed table
    assert auto_source(window, "cpu", torch.float32) == f"tuned:{sha}"


def test_a_module_remembers_its_short_call_limit_per_pass(tmp_path, monkeypatch) -> None:
    # forward keeps the fixed limit (768); with gradients calls under 2048 keys are short
    path = tmp_path / "t.json"
    write(path, {("banded", "fwd_bwd"): KindOrder(("blocked", "sdpa", "flex"), ("sdpa", "blocked", "flex"), 2048)})
    monkeypatch.setenv(TUNING_ENV, str(path))
    module = create_attention("sliding_window", window=4)

    def run(n: int, grad: bool) -> str:
        q = torch.randn(1, 2, n, 8, requires_grad=grad)
        with torch.set_grad_enabled(grad):
            module(q, q, q)
        return module.last_path.kernel

    assert run(900, False) == "blocked"  # long for the forward's limit
    assert run(900, True) == "sdpa"  # short for the tuned one: a limit remembered from the forward would
    assert run(2100, True) == "blocked"  # file both under one "long" choice and run sdpa here


def test_a_tuned_order_never_runs_an_unsupported_kernel_and_keeps_reference_last(tmp_path, monkeypatch) -> None:
    path = tmp_path / "t.json"
    hostile = ("reference", "xformers", "relative", "factorised", "no_such_kernel", "sdpa")
    write(path, {(kind, p): KindOrder(hostile, hostile, 512) for kind in ("banded", "plain", "biased")
                 for p in ("fwd", "fwd_bwd")})
    monkeypatch.setenv(TUNING_ENV, str(path))
    for name, params in GRID_VARIANTS[:-1]:
        module = create_attention(name, **params)
        pattern = module.pattern()
        for n, grad in ((256, False), (4096, True)):
            call = AttentionCall("cpu", torch.float32, name == "causal", grad, n, n)
            order = auto_order(pattern, call.device, n, dtype=call.dtype, grad=grad)
            assert order[-1] == "reference" and order.count("reference") == 1, (name, order)
            assert "no_such_kernel" not in order and set(order) <= set(attention_info(name).kernels), (name, order)
            chosen = choose_kernel(pattern, call)
            assert chosen not in ("xformers", "reference"), (name, chosen)  # no CUDA; reference only last
            assert not module.not_supported_reasons(call, chosen)


# --- the sweep row ---

def case(kernel: str) -> Case:
    return Case(variant="sliding_window", label="sw", params=(("window", 16),), kernel=kernel, seq_len=64, batch=1,
                heads=2, head_dim=8, dtype="float32", device="cpu", causal=False, passes=("fwd",), repeats=5,
                warmup=1, timeout_s=60, max_memory_gb=None, threads=None, time_budget_s=1, plugins=())


def test_a_row_says_where_autos_choice_came_from(tmp_path, monkeypatch) -> None:
    path = tmp_path / "t.json"
    sha = write(path, SDPA_FOR_BANDED_GRAD)
    monkeypatch.setenv(TUNING_ENV, str(path))
    assert path_columns([], case("auto"))["auto_source"] == f"tuned:{sha}"
    assert path_columns([], case("blocked"))["auto_source"] == ""
    monkeypatch.setenv(TUNING_ENV, "off")
    assert path_columns([], case("auto"))["auto_source"] == "default"
    write(path, SDPA_FOR_BANDED_GRAD, identity={**machine_identity(), "torch_version": "0.1"})
    monkeypatch.setenv(TUNING_ENV, str(path))
    ignored = path_columns([], case("auto"))["auto_source"]
    assert ignored.startswith("default: ") and "torch_version '0.1' there" in ignored
    for good in (f"tuned:{sha}", "default", ignored, ""):
        assert row_problem({"auto_source": good}, SPEED) is None
    assert "auto_source" in (row_problem({"auto_source": "sdpa"}, SPEED) or "")


def test_a_nystrom_row_is_default_under_a_tuned_file(tmp_path, monkeypatch) -> None:
    path = tmp_path / "t.json"
    write(path, SDPA_FOR_BANDED_GRAD)
    monkeypatch.setenv(TUNING_ENV, str(path))
    nystrom = Case(**{**case("auto").to_dict(), "variant": "nystrom", "params": ()})
    assert path_columns([], nystrom)["auto_source"] == "default"  # no tuned order for its kind


def test_no_file_is_read_at_import() -> None:
    code = ("import sys, attn, attn.kernels.auto, attn.kernels.tuning as t; "
            "assert t.default_loader.cache_info().currsize == 0; "
            "assert t.machine_identity.cache_info().currsize == 0")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, TUNING_ENV: "/nonexistent/t.json"})
    assert done.returncode == 0, done.stderr
