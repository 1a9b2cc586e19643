"""Near-duplicate documents: groups of texts that tell the same story in slightly different words.

Two texts are near-duplicates when either

- the *resemblance* of their normalised contents is at least ``threshold``: the Jaccard
  similarity ``|S(a) ∩ S(b)| / |S(a) ∪ S(b)|`` of their sets of word shingles (``w``
  consecutive words, here ``w = 3``), after Broder 1997, "On the resemblance and containment
  of documents"; or
- their title lines (the first non-empty line) are equal after normalisation.

Normalisation: Unicode NFKC, case folding, every run of punctuation, symbols and whitespace
collapsed to one space (so ``"Labour's  'EU propaganda'"`` reads ``"labour s eu propaganda"``).
A text shorter than ``w`` words has one shingle, all of its words. Groups are the connected
components of the near-duplicate graph, so a chain ``a ~ b ~ c`` is one group even when ``a``
and ``c`` are not similar themselves. Resemblance is computed exactly (no min-hash sketch, no
hashed features): one binary text-by-shingle sparse matrix multiplied by its transpose gives
every pair's shared-shingle count at once, under two seconds for the 2,225 BBC News articles;
the components come from scipy's ``connected_components``.

The threshold (:data:`DEFAULT_THRESHOLD` = 0.3) was chosen by reading the BBC News corpus
(:mod:`bench.quality.data.bbc`). Among pairs of articles that are not byte-identical (a pair with an
exactly duplicated article counts once per copy), the 3-shingle resemblance has no clean gap: 56
pairs lie at 0.9 or above (the same article with a few words, the title or a sentence edited),
16 in [0.5, 0.9) (the same article updated, a paragraph added or cut), 13 in [0.3, 0.5) and 28
in [0.2, 0.3). Just above 0.3 the pairs are the same story written again, usually hours apart,
with a reworded lead and shared paragraphs: "UK needs tax cuts, Tories insist" / "Tories urge
'change at the top'" (0.32, one speech at the Tory spring forum), "Bush website blocked outside
US" / "Attack prompts Bush site block" (0.32), "Levy tipped for Whitbread prize" / "Levy takes
Whitbread novel prize" (0.32), "Stars gear up for Bafta ceremony" / "Bafta to hand out movie
honours" (0.33), two "Chancellor rallies Labour voters" and two "Wolves appoint Hoddle as
manager" (0.33, before and after the announcement), "Winter freeze keeps oil above $50" / "Crude
oil prices back above $50" (0.38). Just below 0.3 most pairs are different stories of one
running news thread that repeat a background paragraph: "Blair rejects Iraq advice calls" /
"Goldsmith denies war advice claim" (0.29), "WorldCom director admits lying" / "Worldcom
director ends evidence" (0.28, two days of one trial), "Civil servants in strike ballot" /
"Stalemate in pension strike talks" (0.28), "Lords wrong on detainees - Straw" / "Terror
detainees win Lords appeal" (0.28), "Tory backing for ID cards" / "Howard denies split over ID
cards" (0.26), "Reboot ordered for EU patent law" / "'No re-draft' for EU patent law" (0.24).
The cut is not perfect either way: "Kennedy begins pre-election tour" / "Lib Dems highlight
problem debt" (0.33) are different stories sharing one paragraph, while "US top of
supercomputing charts" / "Supercomputer breaks speed record" (0.27) and the two tobacco-ruling
articles (0.23) are one story told twice. Every pair of articles with equal normalised titles
(32 pairs that are not byte-identical) has resemblance 0.33 or more, so the title rule adds no
link at this threshold; it keeps same-titled rewrites together at a stricter one.

Counts at the defaults: over all 2,225 articles, 181 groups hold more than one article (363
articles, exact duplicates included; at most 3 per group). After a task's exact deduplication of
its inputs (:func:`bench.quality.data.bbc.distinct_rows`), 63 groups of 2 remain among the 2,106
distinct articles at ``seq_len`` 256, and 83 groups of 2 among 2,126 at ``seq_len`` 4,000. Split
article by article (data seed 0, ``seq_len`` 256), 11 of the 210 ``text`` test articles and 9 of
the 210 validation articles had a near-duplicate in training (11 and 17 at ``seq_len`` 4,000).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from attn.validation import invalid, require_int

if TYPE_CHECKING:
    import scipy.sparse

#: Resemblance (3-word-shingle Jaccard similarity) at or above which two texts are one story.
DEFAULT_THRESHOLD = 0.3
#: Words per shingle.
DEFAULT_SHINGLE_SIZE = 3

_SEPARATORS = re.compile(r"[\W_]+")


def normalise(text: str) -> str:
    """``text`` NFKC-normalised, case-folded, with every run of non-alphanumeric characters
    (punctuation, symbols, whitespace) replaced by one space and no space at either end."""
    return _SEPARATORS.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


def title_of(text: str) -> str:
    """The normalised first non-empty line of ``text`` (``""`` when there is none)."""
    for line in text.splitlines():
        if line.strip():
            return normalise(line)
    return ""


def word_shingles(text: str, size: int = DEFAULT_SHINGLE_SIZE) -> list[str]:
    """The ``size``-word shingles of the normalised ``text``, in order (with repeats).

    A text of fewer than ``size`` words gives one shingle, all its words (``""`` for a text
    without any word), so that short texts still compare by their content.
    """
    require_int("shingle_size", size, minimum=1)
    words = normalise(text).split()
    if len(words) <= size:
        return [" ".join(words)]
    return [" ".join(words[start : start + size]) for start in range(len(words) - size + 1)]


def shingle_matrix(texts: Sequence[str], size: int = DEFAULT_SHINGLE_SIZE) -> scipy.sparse.csr_matrix:
    """The binary text-by-shingle matrix of ``texts``: a ``scipy.sparse.csr_matrix`` of shape
    ``(len(texts), distinct shingles)`` and dtype int32, 1 where the text holds the shingle.

    Columns are numbered in order of first appearance; the vocabulary is exact (no hashing).
    """
    import scipy.sparse as sp

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
    """Every pair of ``texts`` whose shingle resemblance is at least ``min_resemblance``.

    Returns ``(first, second, resemblance)``: int64, int64 and float64 arrays of one shape
    ``(pairs,)``, with ``first < second`` (positions in ``texts``), ordered by ``(first,
    second)``. Resemblance is the Jaccard similarity of the two sets of ``shingle_size``-word
    shingles (module docstring). ``min_resemblance`` must lie in ``(0, 1]``.
    """
    import scipy.sparse as sp

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
    """A group id per text: near-duplicates (module docstring) share one, transitively.

    Returns an int64 array of shape ``(len(texts),)``; ids run ``0, 1, ...`` in order of each
    group's first text, so a text without near-duplicates has a group of its own. Texts whose
    shingle resemblance is at least ``threshold`` (in ``(0, 1]``) are linked, and, with
    ``match_titles``, texts whose normalised title lines are equal and not empty.
    """
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

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
    # Number the groups by their first text (whatever order scipy labelled them in).
    _, first_seen, inverse = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty(first_seen.size, dtype=np.int64)
    rank[np.argsort(first_seen)] = np.arange(first_seen.size)
    return rank[inverse.reshape(-1)]


def _check_threshold(subject: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) or not 0 < value <= 1:
        raise invalid(subject, f"must be a number in (0, 1]; got {value!r}")
    return float(value)
