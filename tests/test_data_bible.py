"""bench.quality.data.bible: aligned KJV / Reina-Valera 1909 verses, cleaning, chapter groups, BPE."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from bench.quality.data import bible
from bench.quality.data.errors import DataMissingError
from bench.quality.data.splits import split_indices


@pytest.fixture(scope="module")
def pairs() -> list[tuple[str, str, str]]:
    return bible.load_parallel()


def test_load_parallel(pairs: list[tuple[str, str, str]]) -> None:
    assert len(pairs) == 31_084
    assert pairs[0] == (
        "gen 1:1",
        "In the beginning God created the heaven and the earth.",
        "EN el principio crió Dios los cielos y la tierra.",
    )
    assert pairs[-1][0] == "rev 22:21"
    refs = [r for r, _, _ in pairs]
    assert len(set(refs)) == len(refs)
    assert all("<" not in en and "<" not in es for _, en, es in pairs)
    assert all(bible.clean(en, "en") and bible.clean(es, "es") for _, en, es in pairs)
    by_ref = dict((r, (en, es)) for r, en, es in pairs)
    assert by_ref["ps 3:1"][0].startswith("A Psalm of David")  # canonical superscription kept
    assert by_ref["ps 3:1"][1].startswith("Salmo de David")
    assert bible.load_parallel(max_verses=5) == pairs[:5]


def test_clean() -> None:
    raw = '<w lemma="strong:H0430">¶ And God</w> <note placement="foot">a note</note>said, \\nd LORD’s  [word]'
    assert bible.clean(raw, "en") == "And God said, LORD's word"
    assert bible.clean("Y llamó Dios á la luz, ó á las tinieblas; É dijo: Ú otro está", "es") == (
        "Y llamó Dios a la luz, o a las tinieblas; E dijo: U otro está"
    )
    assert bible.clean("Vino á él", "en") == "Vino á él"  # accents kept outside Spanish
    text = bible.clean("  ¶ a \n b  ", "es")
    assert text == "a b" and bible.clean(text, "es") == text
    with pytest.raises(ValueError, match="language"):
        bible.clean("x", "fr")


def test_chapter_groups_keep_chapters_together(pairs: list[tuple[str, str, str]]) -> None:
    refs = [r for r, _, _ in pairs]
    groups = bible.chapter_groups(refs)
    assert groups.dtype == np.int64 and groups.max() + 1 == 1189  # chapters in the Protestant canon
    assert groups[0] == groups[1] and groups[refs.index("gen 2:1")] == 1
    parts = split_indices(len(refs), seed=0, fractions=(0.9, 0.05, 0.05), groups=groups)
    chapters = [{refs[i].rpartition(":")[0] for i in idx} for idx in parts.values()]
    assert not (chapters[0] & chapters[1] or chapters[0] & chapters[2] or chapters[1] & chapters[2])
    with pytest.raises(ValueError, match="refs"):
        bible.chapter_groups(["gen 1"])


def test_bpe_encode_decode(pairs: list[tuple[str, str, str]]) -> None:
    sample = pairs[:3000]
    en = [bible.clean(e, "en") for _, e, _ in sample]
    es = [bible.clean(s, "es") for _, _, s in sample]
    tokenizer = bible.train_bpe(en + es, 1000)
    assert tokenizer.get_vocab_size() == 1000
    assert [tokenizer.token_to_id(t) for t in ("<pad>", "<bos>", "<eos>", "<unk>")] == [0, 1, 2, 3]
    again = bible.train_bpe(en + es, 1000)
    assert again.to_str() == tokenizer.to_str()  # deterministic

    out = bible.encode_pairs(tokenizer, en, es, src_len=48, tgt_len=48)
    assert out["src_ids"].shape == out["src_mask"].shape == (3000, 48)
    assert out["tgt_ids"].shape == out["tgt_mask"].shape == (3000, 48)
    assert out["src_ids"].dtype == out["tgt_ids"].dtype == np.int64
    assert np.all(out["tgt_ids"][:, 0] == bible.BOS_ID)
    assert np.all((out["src_ids"] != 0) == out["src_mask"]) and np.all((out["tgt_ids"] != 0) == out["tgt_mask"])
    truncated = out["truncated"]
    assert 0 < int(out["num_truncated"]) == truncated.sum() < 3000
    lengths = out["tgt_mask"].sum(axis=1)
    last = out["tgt_ids"][np.arange(3000), lengths - 1]
    assert np.all(last[~truncated] == bible.EOS_ID)
    for i in np.flatnonzero(~truncated)[:200]:
        assert bible.decode(tokenizer, out["tgt_ids"][i]) == es[i]  # byte-level BPE round trip
        assert bible.decode(tokenizer, out["src_ids"][i]) == en[i]
    assert bible.decode(tokenizer, [bible.BOS_ID, *tokenizer.encode(" luz").ids, bible.EOS_ID, 9, 9]) == "luz"
    with pytest.raises(ValueError, match="vocab_size"):
        bible.train_bpe(en, 100)


def test_missing_modules_and_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(DataMissingError) as info:
        bible.load_parallel(sword_path=tmp_path)
    assert "\n" not in str(info.value)
    assert "`apt-get install -y sword-text-kjv sword-text-sparv`" in str(info.value)
    (tmp_path / "mods.d").mkdir()
    with pytest.raises(DataMissingError, match="engKJV2006eb"):
        bible.load_parallel(sword_path=tmp_path)
    monkeypatch.setitem(sys.modules, "pysword.modules", None)
    with pytest.raises(DataMissingError) as info:
        bible.load_parallel()
    assert "\n" not in str(info.value) and "`pip install pysword`" in str(info.value)
