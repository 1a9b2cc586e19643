"""Near-duplicate documents (docs/quality.md, "Tasks"): texts linked by the exact Jaccard resemblance of their
shingle sets or equal titles, grouped by connected components (under two seconds for the BBC articles)."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from attn.validation import invalid, require_int

if TYPE_CHECKING:
    import scipy.sparse

#: Resemblance at or above which two texts are one story, chosen by reading BBC pairs: no clean gap
#: (56 pairs >= 0.9, 16 in [0.5, 0.9), 13 in [0.3, 0.5), 28 in [0.2, 0.3)). Just above 0.3: the same
#: story filed again ("Bush website blocked outside US" / "Attack prompts Bush site block", 0.32);
#: just below: one news thread repeating a background paragraph ("Blair rejects Iraq advice calls" /
#: "Goldsmith denies war advice claim", 0.29). Misses both ways exist ("US top of supercomputing
#: charts" / "Supercomputer breaks speed record", 0.27, is one story). Equal titles all resemble >= 0.33.
DEFAULT_THRESHOLD = 0.3
#: Words per shingle.
DEFAULT_SHINGLE_SIZE = 3

_SEPARATORS = re.compile(r"[\W_]+")


def normalise(text: str) -> str:
    """``text`` NFKC-normalised, case-folded, each run of non-alphanumerics one space, stripped."""
    return _SEPARATORS.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


def title_of(text: str) -> str:
    """The normalised first non-empty line of ``text`` (``""`` when there is none)."""
    for line in text.splitlines():
        if line.strip():
            return normalise(line)
    return ""


def word_shingles(text: str, size: int = DEFAULT_SHINGLE_SIZE) -> list[str]:
    """The ``size``-word shingles of the normalised ``text``, in order; a shorter text is one shingle."""
    require_int("shingle_size", size, minimum=1)
    words = normalise(text).split()
    if len(words) <= size:
        return [" ".join(words)]
    return [" ".join(words[start : start + size]) for start in range(len(words) - size + 1)]


def shingle_matrix(texts: Sequence[str], size: int = DEFAULT_SHINGLE_SIZE) -> scipy.sparse.csr_matrix:
    """The binary int32 text-by-shingle CSR matrix, columns in order of first appearance (no hashing)."""
    import scipy.sparse as sp  # the tasks extra: imported where used

    require_int("shingle_size", size, minimum=1)
    vocabulary: dict[str, int] = {}
    columns: list[int] = []
    indptr = [0]
    for text in texts:
        columns.extend(sorted({vocabulary.setdefault(s, len(vocabulary)) for s in word_shingles(text, size)}))
        indptr.append(len(columns))
    data = np.ones(len(columns), dtype=np.int32)
    return sp.csr_matrix((data, np.asarray(columns, dtype=np.int64), np.asarray(indptr, dtype=np.int64)),
                         shape=(len(texts), len(vocabulary)))


def resemblance_pairs(
    texts: Sequence[str], min_resemblance: float, *, shingle_size: int = DEFAULT_SHINGLE_SIZE
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(first, second, resemblance)`` of every pair at or above ``min_resemblance``, ``first < second``, sorted."""
    import scipy.sparse as sp  # the tasks extra: imported where used

    _check_threshold("min_resemblance", min_resemblance)
    require_int("shingle_size", shingle_size, minimum=1)
    shingles = shingle_matrix(texts, shingle_size)  # (n, distinct shingles), 0/1
    sizes = np.diff(shingles.indptr).astype(np.int64)  # (n,) distinct shingles per text
    shared = sp.triu(shingles @ shingles.T, k=1).tocoo()  # (n, n) shared shingles, first < second
    first, second = shared.row.astype(np.int64), shared.col.astype(np.int64)
    inter = shared.data.astype(np.int64)
    resemblance = inter / (sizes[first] + sizes[second] - inter)
    keep = resemblance >= min_resemblance
    first, second, resemblance = first[keep], second[keep], resemblance[keep]
    order = np.lexsort((second, first))
    return first[order], second[order], resemblance[order]


def near_duplicate_groups(
    texts: Sequence[str],
    threshold: float = DEFAULT_THRESHOLD,
    *,
    shingle_size: int = DEFAULT_SHINGLE_SIZE,
    match_titles: bool = True,
) -> np.ndarray:
    """An int64 group id per text, numbered by each group's first text; near-duplicates share one."""
    from scipy.sparse import coo_matrix  # the tasks extra: imported where used
    from scipy.sparse.csgraph import connected_components  # the tasks extra: imported where used

    _check_threshold("threshold", threshold)
    n = len(texts)
    first, second, _ = resemblance_pairs(texts, threshold, shingle_size=shingle_size)
    rows, cols = first.tolist(), second.tolist()
    if match_titles:
        first_with_title: dict[str, int] = {}
        for index, text in enumerate(texts):
            title = title_of(text)
            if title:
                rows.append(first_with_title.setdefault(title, index))
                cols.append(index)
    graph = coo_matrix((np.ones(len(rows), dtype=np.int8), (np.asarray(rows, dtype=np.int64),
                                                           np.asarray(cols, dtype=np.int64))), shape=(n, n))
    _, labels = connected_components(graph, directed=False)
    _, first_seen, inverse = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty(first_seen.size, dtype=np.int64)
    rank[np.argsort(first_seen)] = np.arange(first_seen.size)
    return rank[inverse.reshape(-1)]


def _check_threshold(subject: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) or not 0 < value <= 1:
        raise invalid(subject, f"must be a number in (0, 1]; got {value!r}")
    return float(value)
