"""bench.pretrained: the training-free tasks on a randomly initialised model of the default
model's architecture (the 98 MB file is read by one slow test in test_models_pretrained)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import torch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from bench.engine.config import ConfigError  # noqa: E402
from bench.html.report import write_report_html  # noqa: E402
from bench.pretrained import cost, passkey, scoring, streaming  # noqa: E402
from bench.pretrained.config import parse_pretrained  # noqa: E402
from bench.pretrained.report import build_pretrained_report, load_pretrained, tradeoff_table  # noqa: E402
from bench.runner import dry_run, load_run, run  # noqa: E402
from models import pretrained  # noqa: E402

TEXT = " ".join(f"Line {i}: the {w} sat on the mat and looked at {i % 7} birds." for i, w in
                enumerate(["cat", "dog", "owl", "fox", "hen"] * 40))


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return pretrained.tiny_llama(layers=2, hidden=64, heads=4, kv_heads=2)


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hugging Face folder: the tiny Llama and a 300-token byte-level BPE tokenizer."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    bpe.train_from_iterator([TEXT], tokenizers.trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
    transformers.PreTrainedTokenizerFast(tokenizer_object=bpe).save_pretrained(folder)
    pretrained.tiny_llama(layers=2, hidden=64, heads=4, kv_heads=2).save_pretrained(folder)
    return folder


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 300, (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("policy", "variant", "params"), [
    (streaming.CachePolicy("sinks", sinks=3, recent=9), "global_tokens", {"num_global": 3, "window": 9}),
    (streaming.CachePolicy("window", recent=11), "sliding_window", {"window": 11}),
    (streaming.CachePolicy("full"), "causal", {}),
])
@pytest.mark.parametrize("chunk", [1, 7, 16])
def test_a_chunked_rolling_cache_equals_one_forward_with_its_pattern(
        model: torch.nn.Module, policy: streaming.CachePolicy, variant: str, params: dict,
        chunk: int) -> None:
    ids = _ids(60)
    nll, _ = streaming.stream_nll(model, ids, policy, "original", chunk)
    pretrained.place_attention(model, variant, params)
    with torch.no_grad():
        whole = scoring.next_token_nll(model, scoring.hidden_states(model, ids), ids, 1)[0]
    assert nll.shape == whole.shape
    assert (nll - whole).abs().max() < 1e-4


def test_cache_positions_rotate_kept_keys_back(model: torch.nn.Module) -> None:
    keys = torch.randn(1, 2, 5, 16)
    rotary = model.get_decoder().rotary_emb
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    keys = torch.randn(1, 2, 5, head_dim)

    def at(k: torch.Tensor, p: int) -> torch.Tensor:
        cos, sin = rotary(k, torch.tensor([[p]]))
        half = k.shape[-1] // 2
        return k * cos[:, None] + torch.cat((-k[..., half:], k[..., :half]), -1) * sin[:, None]

    back = streaming._rotate_back(model, at(keys, 40), 15)
    assert (back - at(keys, 25)).abs().max() < 1e-5
    # a stream that never evicts is the same under either positions
    ids = _ids(30, 3)
    policy = streaming.CachePolicy("sinks", sinks=2, recent=40)
    same = [streaming.stream_nll(model, ids, policy, p, 8)[0] for p in ("original", "cache")]
    assert (same[0] - same[1]).abs().max() < 1e-5
    evicting = streaming.CachePolicy("sinks", sinks=2, recent=6)
    moved = [streaming.stream_nll(model, ids, evicting, p, 8)[0] for p in ("original", "cache")]
    assert (moved[0] - moved[1]).abs().max() > 1e-4  # re-indexing changes what is past the cache


def test_perplexity_read_from_one_long_forward_equals_separate_windows(model: torch.nn.Module) -> None:
    ids = _ids(64, 4)
    pretrained.place_attention(model, "sliding_window", {"window": 5})
    with torch.no_grad():
        long = scoring.next_token_nll(model, scoring.hidden_states(model, ids), ids, 16)[0]
        short = scoring.next_token_nll(model, scoring.hidden_states(model, ids[:, :32]), ids[:, :32], 16)[0]
    assert (long[:16] - short).abs().max() < 1e-5


def test_passkey_prompts_are_exact_and_greedy_checks_are_decoding(model: torch.nn.Module) -> None:
    encode = lambda text: list(text.encode())
    for depth in (0.0, 0.5, 1.0):
        prompt = passkey.build_prompt(encode, 700, depth, "12345")
        assert len(prompt.ids) == 700
        assert bytes(prompt.ids[prompt.answer]).decode() == " 12345"
        needle = bytes(prompt.ids[prompt.needle_at:prompt.needle_at + 30]).decode()
        assert needle.startswith(" The pass key is 12345.")
        room = 700 - sum(len(encode(t)) for t in (passkey.INTRO, passkey.NEEDLE.format(key="12345"),
                                                  passkey.QUESTION, passkey.ANSWER.format(key="12345")))
        before = prompt.needle_at - len(encode(passkey.INTRO))  # filler tokens before the needle
        assert abs(before / room - depth) <= len(encode(passkey.FILLER)) / room
    with pytest.raises(ValueError, match="seq_len: a passkey prompt needs more than"):
        passkey.build_prompt(encode, 120, 0.5, "12345")
    assert passkey.keys_for(1024, 0.5, 4, 0) == passkey.keys_for(1024, 0.5, 4, 0)
    assert len(set(passkey.keys_for(1024, 0.5, 50, 0))) == 50
    # teacher-forced greedy check == greedy decoding
    prompt = _ids(20, 5)
    pretrained.place_attention(model, "full")
    with torch.no_grad():
        written = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=4,
                                 do_sample=False, pad_token_id=0)
        hidden = scoring.hidden_states(model, written)
        assert scoring.greedy_matches(model, hidden, written, slice(20, 24)).item()
        wrong = written.clone()
        wrong[0, 22] = (wrong[0, 22] + 1) % 300
        assert not scoring.greedy_matches(model, scoring.hidden_states(model, wrong), wrong, slice(20, 24)).item()


def test_kv_cache_rules_and_the_floors(model: torch.nn.Module) -> None:
    assert cost.kv_tokens("full", {}, 4096) == 4096
    assert cost.kv_tokens("sliding_window", {"window": 256}, 4096) == 256
    assert cost.kv_tokens("sliding_window", {"window": 256}, 100) == 100
    assert cost.kv_tokens("dilated", {"window": 64, "dilation": (1, 4)}, 4096) == 256
    assert cost.kv_tokens("global_tokens", {"num_global": 4, "window": 252}, 4096) == 256
    assert cost.kv_tokens("performer", {}, 4096) is None
    assert cost.kv_cache_bytes(model, 10) == 2 * 2 * 2 * 16 * 10 * 4  # K and V, layers, heads, D
    low, high = scoring.wilson_interval(0, 10)
    assert low == 0 and high == pytest.approx(0.2775, abs=1e-3)
    assert scoring.unigram_nll([1, 1], [1, 1, 1], vocab_size=1) == pytest.approx(0.0)
    assert scoring.unigram_nll([2], [1], vocab_size=2, smoothing=1.0) == pytest.approx(math.log(3))


@pytest.mark.parametrize(("raw", "said"), [
    ({"frobnicate": 1}, "frobnicate: unknown key"),
    ({"passkey": {"depths": [1.5]}}, "passkey.depths: must be a list of fractions"),
    ({"perplexity": {"lengths": [0]}}, "perplexity.lengths: must be a non-empty list of integers >= 4"),
    ({"patterns": [{"variant": "full"}, {"variant": "full"}]}, "two entries share a label"),
    ({"streaming": {"policies": [{"label": "x", "recent": 0}]}}, r"streaming.policies\[0\].recent"),
    ({"perplexity": None}, "at least one task"),
    ({"device": "cuda"}, "device: the pretrained-model tasks run on 'cpu'"),
])
def test_config_errors_name_the_key(raw: dict, said: str) -> None:
    base = {"kind": "pretrained", "name": "x", "patterns": [{"variant": "full"}], "perplexity": {}}
    with pytest.raises(ConfigError, match=said):
        parse_pretrained({**base, **raw})


def _config(folder: Path, text: Path, **extra: object) -> dict:
    return {"kind": "pretrained", "name": "tiny", "model": str(folder), "text": str(text), "threads": 1,
            "patterns": [{"variant": "full"}, {"variant": "sliding_window", "params": {"window": 8}},
                         {"variant": "global_tokens", "params": {"num_global": 2, "window": 8}}],
            "perplexity": {"documents": [], "lengths": [32, 64]},
            "passkey": {"lengths": [400], "depths": [0.5], "keys": 2},
            "streaming": {"document": "text", "tokens": 96, "chunk": 16, "bin": 32,
                          "positions": ["original", "cache"],
                          "policies": [{"label": "full"}, {"label": "sinks", "sinks": 2, "recent": 8}]},
            "prefill": {"lengths": [64], "repeats": 2}, "decode": {"contexts": [64], "steps": 2},
            **extra}


def test_prefill_is_timed_in_rounds_and_decoding_against_the_cache(model: torch.nn.Module) -> None:
    ids = _ids(48, 6)
    patterns = [("full", {}, None), ("sliding_window", {"window": 4}, (1,))]
    found = cost.timed_prefill(model, ids, patterns, repeats=3)
    assert [f["repeats"] for f in found] == [3, 3]
    assert all(f["peak_mem_bytes"] > 0 and f["time_ms"] == sorted(f["times_ms"])[1] for f in found)
    pretrained.place_attention(model, "sliding_window", {"window": 16})
    times = cost.timed_decode_step(model, context=4096, kept=16, steps=3)
    assert len(times) == 3 and all(t > 0 for t in times)


@pytest.mark.slow
@pytest.mark.timeout(900)  # a GGUF load, or a worker per unit: minutes on a busy machine
def test_a_run_records_every_task_resumes_and_reports(model_folder: Path, tmp_path: Path) -> None:
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    config = load_run(_config(model_folder, text))
    rows = run(config, tmp_path / "run")
    bad = [(r["cell_id"], r["reason"]) for r in rows if r["status"] != "ok"]
    assert not bad
    assert {r["task"] for r in rows} == {"perplexity", "passkey", "streaming", "prefill", "decode"}
    ppl = {(r["label"], r["seq_len"]): r["value"] for r in rows if r["task"] == "perplexity"}
    assert set(ppl) >= {("full", 32), ("full", 64), ("unigram (floor)", 64)}
    assert all(v > 1 for v in ppl.values())
    stream = [r for r in rows if r["task"] == "streaming" and r["metric"] == "perplexity"]
    assert {r["label"] for r in stream} == {"full [original positions]", "sinks [original positions]",
                                            "sinks [cache positions]"}
    assert all(p.state == "done" for p in dry_run(config, tmp_path / "run").items)
    assert run(config, tmp_path / "run") == []
    report = build_pretrained_report(tmp_path / "run")
    for title in ("Perplexity of tokens", "Passkey retrieval", "Streaming past", "Prefill: time",
                  "Decoding: time per token", "StreamingLLM, compared"):
        assert title in report
    assert len(load_pretrained(tmp_path / "run")) == len(rows)


@pytest.mark.slow  # an end-to-end run: in the full suite
def test_a_small_run_resumes_and_reports(model_folder: Path, tmp_path: Path) -> None:
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    raw = {**_config(model_folder, text), "decode": None, "prefill": None, "passkey": None}
    raw["streaming"] = {**raw["streaming"], "positions": ["cache"], "policies": raw["streaming"]["policies"][1:]}
    config = load_run({k: v for k, v in raw.items() if v is not None}, {"variants": ["sliding_window"]})
    rows = run(config, tmp_path / "run")
    assert [r for r in rows if r["status"] != "ok"] == []
    assert {r["cell_id"] for r in rows} == {"perplexity:unigram (floor)", "perplexity:sliding_window(window=8)",
                                            "streaming:sinks [cache positions]"}
    assert run(config, tmp_path / "run") == []
    assert "Perplexity of tokens N/2..N-1" in build_pretrained_report(tmp_path / "run")
    page = write_report_html(tmp_path / "run").read_text()
    assert "Pretrained-model report" in page and "Perplexity along the stream" in page


@pytest.mark.slow  # an end-to-end run: in the full suite
def test_a_text_shorter_than_n_is_one_line_naming_it(model_folder: Path, tmp_path: Path) -> None:
    text = tmp_path / "short.txt"
    text.write_text("Too short.")
    raw = {k: v for k, v in _config(model_folder, text).items()
           if k not in ("passkey", "streaming", "prefill", "decode")}
    rows = run(load_run(raw, {"variants": ["full"]}), tmp_path / "run")
    failed = [r for r in rows if r["status"] != "ok"]
    assert failed and all("document 'file:short.txt'" in r["reason"] and "the run needs 64" in r["reason"]
                          and "\n" not in r["reason"] for r in failed)


def test_overrides_choose_patterns_and_tasks(model_folder: Path, tmp_path: Path) -> None:
    raw = _config(model_folder, tmp_path / "t.txt")
    config = load_run(raw, {"variants": ["sliding_window"], "tasks": ["passkey"]})
    assert [e.variant for e in config.patterns] == ["sliding_window"]
    assert config.passkey is not None and config.perplexity is None and config.streaming is None
    with pytest.raises(ConfigError, match="tasks: unknown task 'nope'"):
        load_run(raw, {"tasks": ["nope"]})
    with pytest.raises(ConfigError, match="variants: none of"):
        load_run(raw, {"variants": ["dilated"]})


def test_the_tradeoff_table_puts_quality_and_cost_of_one_n_in_one_cell() -> None:
    def row(task: str, label: str, metric: str, value: float, **more) -> dict:
        return {"task": task, "label": label, "metric": metric, "value": value, "status": "ok",
                "seq_len": 64, "document": "d", **more}

    df = pd.DataFrame([
        row("perplexity", "full", "perplexity", 10.0), row("perplexity", "window", "perplexity", 25.0),
        row("perplexity", "unigram (floor)", "perplexity", 900.0),
        row("passkey", "window", "passkey_accuracy", 0.5, depth=0.1, count=4),
        row("passkey", "window", "passkey_accuracy", 1.0, depth=0.9, count=4),
        row("prefill", "full", "prefill_ms", 100.0, times_ms="[100, 110, 90]", time_iqr_ms=5.0, peak_mem_bytes=2**20),
        row("prefill", "window", "prefill_ms", 50.0, times_ms="[40, 66, 45]", time_iqr_ms=5.0, peak_mem_bytes=2**20),
    ])
    table = tradeoff_table(df).set_index("pattern")
    assert list(table.index) == ["full", "window"]  # the floor has no trade-off
    assert table.loc["window", "N=64"] == "ppl 2.50x, keys 6/8, time 0.50x"  # median of 0.4, 0.6, 0.5
    assert table.loc["full", "N=64"] == "ppl 1.00x, keys -, time 1.00x"
