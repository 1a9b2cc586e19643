"""bench.quality.data.listops: LRA ListOps generation, evaluation and encoding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.quality.data import listops


def _reference_value(tokens: list[str]) -> int:
    """Independent evaluator (recursive descent, numpy median as in LRA)."""
    toks = [t for t in tokens if t not in "()"]

    def parse(i: int) -> tuple[int, int]:
        tok = toks[i]
        if tok.isdigit():
            return int(tok), i + 1
        args, i = [], i + 1
        while toks[i] != "]":
            value, i = parse(i)
            args.append(value)
        fn = {"[MAX": max, "[MIN": min, "[MED": lambda a: int(np.median(a)), "[SM": lambda a: int(np.sum(a) % 10)}
        return fn[tok](args), i + 1

    value, end = parse(0)
    assert end == len(toks)
    return value


def test_vocab() -> None:
    assert listops.VOCAB[0] == "<pad>"
    assert len(set(listops.VOCAB)) == len(listops.VOCAB)
    for tok in ("[MAX", "[MIN", "[MED", "[SM", "]", "(", ")", *map(str, range(10))):
        assert tok in listops.VOCAB


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("7", 7),
        ("[MAX 2 9 4 ]", 9),
        ("[MIN 2 9 4 ]", 2),
        ("[MED 1 2 ]", 1),  # int(np.median([1, 2])) = int(1.5) = 1
        ("[MED 3 9 1 ]", 3),
        ("[SM 5 7 9 ]", 1),
        ("[MAX 2 [MIN 4 7 ] 0 [SM 9 9 ] ]", 8),
        ("( ( ( [MAX 2 ) 9 ) ] )", 9),  # LRA's string form, parentheses ignored
    ],
)
def test_evaluate_tokens_examples(expr: str, value: int) -> None:
    assert listops.evaluate_tokens(expr.split()) == value


@pytest.mark.parametrize("expr", ["[MAX 1 2", "] 1", "[MAX ]", "1 2", "[FOO 1 ]", ""])
def test_evaluate_tokens_rejects_malformed(expr: str) -> None:
    with pytest.raises(ValueError):
        listops.evaluate_tokens(expr.split())


def test_generate_labels_lengths_and_determinism() -> None:
    tokens, labels = listops.generate(300, seed=0, max_depth=8, max_args=8, min_length=20, max_length=200)
    assert labels.dtype == np.int64 and labels.shape == (300,)
    assert len({tuple(t) for t in tokens}) == 300  # distinct, as in LRA
    for toks, label in zip(tokens, labels):
        assert 20 <= len(toks) <= 200
        assert listops.evaluate_tokens(toks) == label == _reference_value(toks)
    again, labels2 = listops.generate(300, seed=0, max_depth=8, max_args=8, min_length=20, max_length=200)
    assert again == tokens and np.array_equal(labels, labels2)
    other, _ = listops.generate(300, seed=1, max_depth=8, max_args=8, min_length=20, max_length=200)
    assert other != tokens


def test_generate_with_lra_parentheses() -> None:
    tokens, labels = listops.generate(100, seed=2, max_depth=6, max_args=5, min_length=10, max_length=150, parens=True)
    for toks, label in zip(tokens, labels):
        assert toks.count("(") == toks.count(")")
        assert listops.evaluate_tokens(toks) == label
        plain = [t for t in toks if t not in "()"]
        # Each operator application adds (number of arguments + 1) parenthesis pairs.
        assert toks.count("(") == sum(1 for t in plain if t.isdigit() or t.startswith("[")) - 1 + plain.count("]")


def test_generate_impossible_range_raises() -> None:
    with pytest.raises(ValueError, match="max_length"):
        listops.generate(5, seed=0, max_depth=2, max_args=2, min_length=50, max_length=60, max_attempts=2000)
    with pytest.raises(ValueError, match="min_length"):
        listops.generate(5, seed=0, min_length=10, max_length=5)


def test_encode_pads_and_masks() -> None:
    tokens = [["[MAX", "1", "2", "]"], ["3"]]
    ids, mask = listops.encode(tokens, 6)
    assert ids.dtype == np.int64 and mask.dtype == bool and ids.shape == mask.shape == (2, 6)
    assert [listops.VOCAB[i] for i in ids[0, :4]] == tokens[0]
    assert mask.sum(axis=1).tolist() == [4, 1]
    assert np.all(ids[~mask] == 0)
    with pytest.raises(ValueError, match="seq_len"):
        listops.encode(tokens, 3)


def test_load_or_generate_caches(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ATTN_BENCH_CACHE", str(tmp_path))
    ids, mask, labels = listops.load_or_generate(50, seed=0, seq_len=64, max_depth=5, max_args=5)
    assert ids.shape == mask.shape == (50, 64) and labels.shape == (50,)
    monkeypatch.setattr(listops, "generate", lambda *a, **k: pytest.fail("cache miss"))
    ids2, _, labels2 = listops.load_or_generate(50, seed=0, seq_len=64, max_depth=5, max_args=5)
    assert np.array_equal(ids, ids2) and np.array_equal(labels, labels2)
