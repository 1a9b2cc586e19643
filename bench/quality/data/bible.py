"""Parallel English-Spanish Bible verses for translation: King James Version and Reina-Valera 1909.

Both texts are public domain SWORD modules packaged by Debian (``sword-text-kjv`` installs
``engKJV2006eb``, ``sword-text-sparv`` installs ``spaRV1909eb``) and read with ``pysword``.
Both use the KJV versification, so verses align by reference (book, chapter, verse).

Typical use::

    pairs = load_parallel()
    refs = [r for r, _, _ in pairs]
    src = [clean(en, "en") for _, en, _ in pairs]
    tgt = [clean(es, "es") for _, _, es in pairs]
    split = split_indices(len(pairs), seed=0, groups=chapter_groups(refs))
    tokenizer = train_bpe([src[i] for i in split["train"]] + [tgt[i] for i in split["train"]], 8000)
    batch = encode_pairs(tokenizer, src, tgt, src_len=128, tgt_len=128)
"""

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
    """Remove OSIS markup from one raw SWORD verse and normalise whitespace.

    ``<note>`` elements are removed with their content (translators' footnotes); every other
    tag is removed keeping its content (so KJV Psalm superscriptions, which the Spanish text
    has inline, stay); stray USFM character markers (``\\nd``, ``\\+nd*``) are removed; runs
    of whitespace become one space; leading/trailing space is dropped.
    """
    text = _NOTE.sub(" ", text)
    text = _TAG.sub("", text)
    text = _USFM.sub("", text)
    return _SPACE.sub(" ", text).strip()


def clean(text: str, language: str) -> str:
    """Normalise one verse (raw or markup-stripped) for training and for evaluation alike.

    Steps, in order:

    1. remove OSIS markup as :func:`strip_markup` does (footnotes dropped, tags unwrapped);
    2. remove stray USFM markers (backslash codes such as ``\\nd`` or ``\\+nd*``);
    3. Unicode NFC normalisation;
    4. remove pilcrows (``¶``) and square brackets (KJV marks of supplied words), map curly
       quotes to straight ones (``’`` and ``‘`` to ``'``; ``“`` and ``”`` to ``"``);
    5. for ``language="es"`` only: a one-letter word written with an acute accent in the 1909
       orthography becomes unaccented (``á`` -> ``a``, ``é`` -> ``e``, ``ó`` -> ``o``,
       ``ú`` -> ``u``, same for capitals); accents inside longer words are kept;
    6. collapse whitespace runs to one space and strip both ends.

    Case and all other punctuation are kept. The function is idempotent.
    ``language`` is ``"en"`` or ``"es"``.
    """
    require_choice("language", language, LANGUAGES)
    text = _NOTE.sub(" ", text)
    text = _TAG.sub("", text)
    text = _USFM.sub("", text)
    text = unicodedata.normalize("NFC", text).translate(_QUOTES)
    if language == "es":
        text = _LONE_ACCENTED.sub(lambda m: _UNACCENT[m.group(1)], text)
    return _SPACE.sub(" ", text).strip()


def _open_modules(sword_path: Path) -> tuple[object, object]:
    """The English and Spanish pysword bibles (decompressed blocks cached for speed)."""
    try:
        from pysword.modules import SwordModules
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
        # pysword decompresses a whole book block for every verse it reads; caching the last
        # blocks makes reading the Bible take well under a second instead of about a minute.
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
    """Aligned verses ``(reference, english, spanish)`` in canon order (Genesis 1:1 first).

    ``reference`` is ``"<book> <chapter>:<verse>"`` with the lower-case OSIS book abbreviation,
    e.g. ``"gen 1:1"``, ``"1sam 3:4"``, ``"rev 22:21"``. Texts have their markup removed by
    :func:`strip_markup` but are otherwise as in the modules (apply :func:`clean` before use).
    A verse is kept only when it is non-empty after :func:`clean` in both languages (31,084 of
    the 31,102 KJV-versification verses). ``max_verses`` keeps only the first verses.
    Raises DataMissingError when pysword or the SWORD modules are missing.
    """
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
    """One group id per reference, shared by all verses of the same book and chapter.

    ``refs`` are references as returned by :func:`load_parallel` (``"gen 1:1"``); the result
    is an int64 array of shape ``(len(refs),)`` numbering chapters in order of first
    appearance, meant for ``split_indices(..., groups=chapter_groups(refs))``.
    """
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
        import tokenizers
    except ImportError:
        raise DataMissingError("bible: the BPE library (PyPI package tokenizers)", "pip install tokenizers") from None
    return tokenizers


def train_bpe(texts: Sequence[str], vocab_size: int, *, min_frequency: int = 2) -> Tokenizer:
    """Train a shared byte-level BPE tokenizer (``tokenizers`` package) on ``texts``.

    Pass the training split only, English and Spanish together. The tokenizer normalises with
    NFC, splits GPT-2 style with a byte-level pre-tokenizer (a space is prefixed to each text,
    so a word has one form wherever it stands) and covers every byte, so ``<unk>`` never occurs.
    Special tokens ``<pad>``, ``<bos>``, ``<eos>``, ``<unk>`` have ids 0, 1, 2, 3. No special
    tokens are added when encoding. Deterministic for the same texts and arguments.
    ``vocab_size`` must be at least 260 (4 special tokens + 256 bytes).
    """
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
    """Encode aligned sources and targets into padded id arrays (n = ``len(sources)``).

    Returns a dict of arrays:

    - ``"src_ids"`` int64 ``(n, src_len)`` and ``"src_mask"`` bool: source pieces (no special
      tokens), right-padded with ``<pad>`` (0), cut to ``src_len``;
    - ``"tgt_ids"`` int64 ``(n, tgt_len)`` and ``"tgt_mask"`` bool: ``<bos>`` pieces ``<eos>``,
      right-padded; a target longer than ``tgt_len`` keeps its first ``tgt_len`` ids and so has
      no ``<eos>`` (teacher forcing: inputs ``tgt_ids[:, :-1]``, labels ``tgt_ids[:, 1:]``);
    - ``"truncated"`` bool ``(n,)``: True where the source or the target was cut;
    - ``"num_truncated"`` int64 scalar (0-d): how many examples were cut.

    Truncated examples are kept; drop them with ``~out["truncated"]`` if wanted.
    """
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
    """Text of one id sequence: a leading ``<bos>`` is skipped, decoding stops at the first
    ``<eos>``, and other special tokens (``<pad>``, ``<unk>``) are dropped. Leading and trailing
    whitespace is stripped (the tokenizer prefixes a space)."""
    sequence = [int(i) for i in np.asarray(ids).reshape(-1)]
    if sequence and sequence[0] == BOS_ID:
        sequence = sequence[1:]
    if EOS_ID in sequence:
        sequence = sequence[: sequence.index(EOS_ID)]
    sequence = [i for i in sequence if i >= len(SPECIAL_TOKENS)]
    return tokenizer.decode(sequence, skip_special_tokens=True).strip()
