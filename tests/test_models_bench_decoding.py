"""bench.decoding.benchmark at tiny sizes: it runs, writes CSV + summary + env, and reports speedups."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from bench.cli import app
from bench.decoding import benchmark
from bench.decoding.options import DecodingOptions


def test_decoding_benchmark_writes_results(tmp_path):
    args = [
        "decoding", "--out", str(tmp_path), "--context", "64", "--context", "128", "--new-tokens", "4",
        "--attention", "full", "--attention", "sliding_window", "--window", "8",
        "--d-model", "32", "--num-heads", "2", "--num-layers", "1", "--d-ff", "64",
        "--vocab-size", "32", "--stream-window", "16", "--stream-layers", "1",
        "--stream-layers", "2", "--stream-steps", "3", "--repeats", "1", "--threads", "1",
    ]
    threads = torch.get_num_threads()
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert torch.get_num_threads() == threads  # --threads 1 held for the run only
    assert f"page: {tmp_path / 'report.html'}" in result.output and (tmp_path / "report.html").is_file()
    assert '"command": "' in (tmp_path / "env.json").read_text()  # the command line, for the page
    table = pd.read_csv(tmp_path / "results.csv")
    decoding = table[table.benchmark == "decoding"]
    assert len(decoding) == 2 * 2 * 2  # attentions x contexts x cache on/off
    assert set(decoding.use_cache) == {True, False}
    assert (decoding.tokens_per_s > 0).all()
    streaming = table[table.benchmark == "streaming"]
    assert (streaming.step_ms > 0).all()
    paths = sorted(zip(streaming.num_layers, streaming.path, strict=True))
    assert paths == [(1, "single-output"), (2, "retroactive-recompute"), (2, "retroactive-update")]
    assert (streaming.speedup_q25 <= streaming.speedup).all() and (streaming.speedup <= streaming.speedup_q75).all()
    assert all(len(json.loads(t)) == 1 for t in streaming.step_times_ms)  # one kept round per repeat
    assert "| 16 | 2 | retroactive-update |" in (tmp_path / "summary.md").read_text()
    summary = (tmp_path / "summary.md").read_text()
    assert "| full | 2 | 128 |" in summary and "goal >= 5x" in summary and "## Streaming" in summary
    assert (decoding.num_kv_heads == 2).all()  # --num-heads 2, no --num-kv-heads: multi-head
    on = decoding.use_cache.astype(bool)
    assert (decoding[on].cache_bytes > 0).all() and (decoding[~on].cache_bytes == 0).all()
    (env,) = json.loads((tmp_path / "env.json").read_text())["segments"]
    assert {"torch_version", "threads", "git_sha", "timestamp"} <= set(env)


def test_decoding_options_hold_the_defaults_and_check_each_option():
    """One frozen options object: arguments not given take its defaults; each bad value is
    named by its command-line option (also when called from Python, without typer's checks)."""
    from bench.decoding.options import DecodingOptions

    options = DecodingOptions.from_given(context=[64, 128], attention=None, threads=None, new_tokens=4)
    assert options.context == (64, 128) and options.attention == ("full",) and options.new_tokens == 4
    assert options.max_len == 132 and options.sizes["d_model"] == 256
    for bad, option in ((dict(window=-1), "--window"), (dict(context=(16, 0)), "--context"),
                        (dict(vocab_size=1), "--vocab-size"), (dict(threads=0), "--threads"),
                        (dict(stream_layers=()), "--stream-layers"), (dict(d_model=30), "--d-model")):
        with pytest.raises(ValueError, match=f"^{option}: "):
            DecodingOptions(**bad)


def test_benchmark_option_runs_streaming_alone_and_names_bad_values(tmp_path):
    args = ["decoding", "--out", str(tmp_path), "--benchmark", "streaming", "--d-model", "16",
            "--num-heads", "2", "--d-ff", "32", "--vocab-size", "16", "--stream-window", "8",
            "--stream-layers", "2", "--stream-steps", "2", "--repeats", "2", "--threads", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    table = pd.read_csv(tmp_path / "results.csv")
    assert set(table.benchmark) == {"streaming"} and len(table) == 2
    assert all(len(json.loads(t)) == 2 for t in table.recompute_times_ms)  # 2 kept rounds
    assert "## Decoding" not in (tmp_path / "summary.md").read_text()
    result = CliRunner().invoke(app, ["decoding", "--out", str(tmp_path), "--benchmark", "prefill"])
    assert result.exit_code == 2
    assert "--benchmark: unknown value 'prefill'; allowed values are ['decoding', 'streaming']" in result.output


# `attn-bench decoding --device` runs and times the models on the device it names.
def test_decoding_options_take_a_device() -> None:
    assert DecodingOptions().device == "cpu"
    with pytest.raises(ValueError, match="--device.*allowed values are"):
        DecodingOptions(device="tpu")


def test_decoding_cli_device_option() -> None:
    runner = CliRunner()
    bad = runner.invoke(app, ["decoding", "--device", "tpu"])
    assert bad.exit_code == 2 and "--device" in bad.output
    if not torch.cuda.is_available():
        no_gpu = runner.invoke(app, ["decoding", "--device", "cuda"])
        assert no_gpu.exit_code == 2 and "cuda" in no_gpu.output.lower()


def test_decoding_runs_and_times_on_the_device_it_names(monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[torch.device] = []
    monkeypatch.setattr(benchmark, "synchronize", synced.append)
    moved: list[torch.device] = []
    real_to = torch.nn.Module.to

    def recording_to(self: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
        moved.extend(a for a in args if isinstance(a, torch.device))
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "to", recording_to)
    sizes = dict(d_model=16, num_heads=2, num_layers=1, d_ff=32, vocab_size=16)
    rows = benchmark.bench_decoding("full", {}, 24, 2, sizes, repeats=1, device="cpu")
    assert [r["device"] for r in rows] == ["cpu", "cpu"]
    assert torch.device("cpu") in moved
    assert synced and set(synced) == {torch.device("cpu")}  # each timing starts and ends synced


def test_timings_synchronise_on_cuda_only(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(torch.cuda, "synchronize", calls.append)
    benchmark.synchronize(torch.device("cpu"))
    assert calls == []
    benchmark.synchronize(torch.device("cuda"))
    assert calls == [torch.device("cuda")]
