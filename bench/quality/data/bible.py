"""Parallel English-Spanish Bible verses: King James Version and Reina-Valera 1909, public domain SWORD modules
packaged by Debian (``sword-text-kjv``, ``sword-text-sparv``) read with ``pysword``; both use the KJV
versification, so verses align by reference."""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from attn.validation import require_choice, require_int, require_optional_int
from bench.quality.data.errors import DataMissingError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

SWORD_PATH = Path("/usr/share/sword")
ENGLISH_MODULE = "engKJV2006eb"
SPANISH_MODULE = "spaRV1909eb"
MODULES_INSTALL_COMMAND = "apt-get install -y sword-text-kjv sword-text-sparv"
PYSWORD_INSTALL_COMMAND = "pip install pysword"
TESTAMENTS = ("ot", "nt")
LANGUAGES = ("en", "es")

#: Special tokens of :func:`train_bpe` tokenizers, at ids 0..3 in this order.
SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<bos>", "<eos>", "<unk>")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3

_NOTE = re.compile(r"<note\b.*?</note>", re.DOTALL | re.IGNORECASE)
_TAG = re.compile(r"<[^<>]*>")
_USFM = re.compile(r"\\\+?[a-z]+\d*\*?")  # stray USFM character markers such as "\nd" or "\+nd*"
_SPACE = re.compile(r"\s+")
_QUOTES = str.maketrans({"’": "'", "‘": "'", "“": '"', "”": '"', "¶": " ", "[": "", "]": ""})
_LONE_ACCENTED = re.compile(r"(?<!\w)([áéóúÁÉÓÚ])(?!\w)")
_UNACCENT = {"á": "a", "é": "e", "ó": "o", "ú": "u", "Á": "A", "É": "E", "Ó": "O", "Ú": "U"}


def strip_markup(text: str) -> str:
    """One raw SWORD verse without OSIS markup: ``<note>`` footnotes dropped, other tags unwrapped (so KJV Psalm
    superscriptions, inline in the Spanish, stay), USFM markers removed, whitespace collapsed."""
    text = _NOTE.sub(" ", text)
    text = _TAG.sub("", text)
    text = _USFM.sub("", text)
    return _SPACE.sub(" ", text).strip()


def clean(text: str, language: str) -> str:
    """One verse normalised (idempotent): :func:`strip_markup`, NFC, pilcrows and square brackets (KJV marks of
    supplied words) removed, quotes straightened, and in Spanish a lone accented one-letter word unaccented."""
    require_choice("language", language, LANGUAGES)
    text = unicodedata.normalize("NFC", strip_markup(text)).translate(_QUOTES)
    if language == "es":
        text = _LONE_ACCENTED.sub(lambda m: _UNACCENT[m.group(1)], text)
    return _SPACE.sub(" ", text).strip()


def _open_modules(sword_path: Path) -> tuple[object, object]:
    """The English and Spanish pysword bibles (decompressed blocks cached for speed)."""
    try:
        from pysword.modules import SwordModules  # the tasks extra: imported where used
    except ImportError:
        what = "bible: the SWORD module reader (PyPI package pysword)"
        raise DataMissingError(what, PYSWORD_INSTALL_COMMAND) from None
    what = f"bible: the SWORD modules {ENGLISH_MODULE} and {SPANISH_MODULE} (Debian sword-text-kjv, sword-text-sparv)"
    if not (sword_path / "mods.d").is_dir():
        raise DataMissingError(what, MODULES_INSTALL_COMMAND, detail=f"no {sword_path / 'mods.d'}")
    modules = SwordModules(str(sword_path))
    found = modules.parse_modules()
    missing = [name for name in (ENGLISH_MODULE, SPANISH_MODULE) if name not in found]
    if missing:
        raise DataMissingError(what, MODULES_INSTALL_COMMAND, detail=f"missing {', '.join(missing)} in {sword_path}")
    bibles = []
    for name in (ENGLISH_MODULE, SPANISH_MODULE):
        bible = modules.get_bible_from_module(name)
        # pysword decompresses a whole book block per verse: cached, reading takes <1 s instead of ~1 min
        if hasattr(bible, "_decompressed_text"):
            bible._decompressed_text = functools.lru_cache(maxsize=4)(bible._decompressed_text)
        bibles.append(bible)
    return bibles[0], bibles[1]


def _book_layout(bible: object) -> list[tuple[str, str, tuple[int, ...]]]:
    """(pysword book name, lower-case OSIS abbreviation, verses per chapter) in canon order."""
    books = bible.get_structure().get_books()
    return [
        (book.name, book.osis_name.lower(), tuple(book.chapter_lengths))
        for testament in TESTAMENTS
        for book in books.get(testament, [])
    ]


def load_parallel(
    max_verses: int | None = None, *, sword_path: str | Path = SWORD_PATH
) -> list[tuple[str, str, str]]:
    """Aligned verses ``(reference, english, spanish)`` in canon order, e.g. ``("gen 1:1", ...)``, markup-stripped
    only; a verse is kept when :func:`clean` leaves both sides non-empty (31,084 of 31,102)."""
    require_optional_int("max_verses", max_verses, minimum=0)
    english, spanish = _open_modules(Path(sword_path))
    layout = _book_layout(english)
    if layout != _book_layout(spanish):
        raise ValueError(f"{ENGLISH_MODULE} and {SPANISH_MODULE} use different versifications; cannot align")

    pairs: list[tuple[str, str, str]] = []
    for name, abbreviation, chapter_lengths in layout:
        en_verses = list(english.get_iter(books=[name], clean=False))
        es_verses = list(spanish.get_iter(books=[name], clean=False))
        if not len(en_verses) == len(es_verses) == sum(chapter_lengths):
            raise ValueError(f"book {name}: verse counts differ ({len(en_verses)} vs {len(es_verses)})")
        position = 0
        for chapter, num_verses in enumerate(chapter_lengths, start=1):
            for verse in range(1, num_verses + 1):
                en, es = strip_markup(en_verses[position] or ""), strip_markup(es_verses[position] or "")
                position += 1
                if clean(en, "en") and clean(es, "es"):
                    pairs.append((f"{abbreviation} {chapter}:{verse}", en, es))
                    if max_verses is not None and len(pairs) >= max_verses:
                        return pairs
    return pairs


def chapter_groups(refs: Sequence[str]) -> np.ndarray:
    """One int64 group id per reference (``"gen 1:1"``), shared by the verses of one chapter."""
    ids: dict[str, int] = {}
    out = np.empty(len(refs), dtype=np.int64)
    for i, ref in enumerate(refs):
        book_chapter, sep, verse = ref.rpartition(":")
        if not sep or not book_chapter or not verse.isdigit():
            raise ValueError(f"refs[{i}] = {ref!r} is not of the form '<book> <chapter>:<verse>'")
        out[i] = ids.setdefault(book_chapter, len(ids))
    return out


def _tokenizers():
    try:
        import tokenizers  # the tasks extra: imported where used
    except ImportError:
        raise DataMissingError("bible: the BPE library (PyPI package tokenizers)", "pip install tokenizers") from None
    return tokenizers


def train_bpe(texts: Sequence[str], vocab_size: int, *, min_frequency: int = 2) -> Tokenizer:
    """A shared byte-level BPE tokenizer trained on ``texts``: a space prefixed to each text, so a word has one form
    wherever it stands; every byte covered, so ``<unk>`` never occurs; no special tokens added when encoding."""
    tk = _tokenizers()
    minimum = len(SPECIAL_TOKENS) + 256
    require_int("vocab_size (specials + 256 bytes)", vocab_size, minimum=minimum)
    require_int("min_frequency", min_frequency, minimum=1)
    tokenizer = tk.Tokenizer(tk.models.BPE(unk_token="<unk>"))
    tokenizer.normalizer = tk.normalizers.NFC()
    tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=True)
    tokenizer.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(texts), trainer=trainer, length=len(texts))
    for expected, token in enumerate(SPECIAL_TOKENS):
        if tokenizer.token_to_id(token) != expected:
            raise RuntimeError(f"special token {token!r} got id {tokenizer.token_to_id(token)}, expected {expected}")
    return tokenizer


def encode_pairs(
    tokenizer: Tokenizer, sources: Sequence[str], targets: Sequence[str], src_len: int, tgt_len: int
) -> dict[str, np.ndarray]:
    """Right-padded ``src_ids``/``src_mask`` and ``tgt_ids``/``tgt_mask`` (``<bos>`` pieces ``<eos>``), cut to
    length and kept (a cut target has no ``<eos>``), with ``truncated`` per example and ``num_truncated``."""
    if len(sources) != len(targets):
        raise ValueError(f"sources and targets must have the same length, got {len(sources)} and {len(targets)}")
    for name, value, minimum in (("src_len", src_len, 1), ("tgt_len", tgt_len, 2)):
        require_int(name, value, minimum=minimum)
    n = len(sources)
    out = {
        "src_ids": np.full((n, src_len), PAD_ID, dtype=np.int64),
        "src_mask": np.zeros((n, src_len), dtype=bool),
        "tgt_ids": np.full((n, tgt_len), PAD_ID, dtype=np.int64),
        "tgt_mask": np.zeros((n, tgt_len), dtype=bool),
        "truncated": np.zeros(n, dtype=bool),
    }
    src_enc = tokenizer.encode_batch(list(sources), add_special_tokens=False)
    tgt_enc = tokenizer.encode_batch(list(targets), add_special_tokens=False)
    for i, (src, tgt) in enumerate(zip(src_enc, tgt_enc, strict=True)):
        s = src.ids
        t = [BOS_ID, *tgt.ids, EOS_ID]
        out["truncated"][i] = len(s) > src_len or len(t) > tgt_len
        s, t = s[:src_len], t[:tgt_len]
        out["src_ids"][i, : len(s)] = s
        out["src_mask"][i, : len(s)] = True
        out["tgt_ids"][i, : len(t)] = t
        out["tgt_mask"][i, : len(t)] = True
    out["num_truncated"] = np.asarray(int(out["truncated"].sum()), dtype=np.int64)
    return out


def decode(tokenizer: Tokenizer, ids: Sequence[int] | np.ndarray) -> str:
    """Text of one id sequence: after a leading ``<bos>``, up to the first ``<eos>``, specials dropped, stripped."""
    sequence = [int(i) for i in np.asarray(ids).reshape(-1)]
    if sequence and sequence[0] == BOS_ID:
        sequence = sequence[1:]
    if EOS_ID in sequence:
        sequence = sequence[: sequence.index(EOS_ID)]
    sequence = [i for i in sequence if i >= len(SPECIAL_TOKENS)]
    return tokenizer.decode(sequence, skip_special_tokens=True).strip()
