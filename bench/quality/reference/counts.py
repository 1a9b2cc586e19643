"""Classification references without a sequence model (scikit-learn): naive Bayes on bag-of-token or bag-of-word
counts, the nearest class mean and k nearest neighbours on the raw inputs, each setting chosen on validation."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # scipy and scikit-learn come with the tasks extra: imported where used
    from scipy import sparse

#: naive Bayes's additive smoothing, chosen on validation (Manning et al. 2008, ch. 13)
NB_ALPHAS = (0.01, 0.1, 0.3, 1.0)
#: neighbours compared, chosen on validation
NEIGHBOURS = (1, 3, 5, 9)
#: a word as the word-count features read it: letters and digits, apostrophes inside
WORD = r"(?u)\b\w[\w']*\b"


@dataclass(frozen=True)
class Fitted:
    """A reference's test predictions and the setting validation chose (``{"alpha": 0.1}``)."""

    predictions: np.ndarray
    chosen: dict[str, Any]


def token_counts(ids: np.ndarray, vocab_size: int, mask: np.ndarray | None = None) -> sparse.csr_matrix:
    """Bag of tokens: ``ids (n, L)`` -> counts ``(n, vocab_size)``, padding (``mask`` False) not counted."""
    from scipy import sparse  # the tasks extra: imported where used

    ids = np.asarray(ids, dtype=np.int64)
    keep = np.ones(ids.shape, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    rows = np.broadcast_to(np.arange(ids.shape[0])[:, None], ids.shape)[keep]
    data = np.ones(int(keep.sum()), dtype=np.float64)
    return sparse.csr_matrix((data, (rows, ids[keep])), shape=(ids.shape[0], vocab_size))


def bytes_to_text(ids: np.ndarray, mask: np.ndarray | None = None) -> list[str]:
    """Byte-level ids (``id = byte + 1``, 0 padding) back to text, a string per row (bad UTF-8 replaced)."""
    ids = np.asarray(ids, dtype=np.int64)
    keep = ids > 0 if mask is None else np.asarray(mask, dtype=bool)
    return [bytes((row[k] - 1).astype(np.uint8).tolist()).decode("utf-8", errors="replace")
            for row, k in zip(ids, keep, strict=True)]


def word_counts(train: Sequence[str], *others: Sequence[str]) -> list[sparse.csr_matrix]:
    """Bag of lower-cased words: every text set as counts in the vocabulary fitted on ``train``."""
    from sklearn.feature_extraction.text import CountVectorizer  # the tasks extra: imported where used

    vectorizer = CountVectorizer(lowercase=True, token_pattern=WORD)
    return [vectorizer.fit_transform(train), *(vectorizer.transform(o) for o in others)]


def _choose(make: Callable[[Any], Any], settings: Sequence[Any], train: tuple[Any, np.ndarray],
            score: Callable[[Any], float]) -> tuple[Any, Any]:
    """``(fitted model, setting)`` of the ``make(setting)`` fitted on ``train`` that ``score`` rates highest (first)."""
    best, best_score, best_setting = None, -np.inf, None
    for setting in settings:
        model = make(setting).fit(*train)
        found = score(model)
        if found > best_score:
            best, best_score, best_setting = model, found, setting
    return best, best_setting


def _accuracy_on(val: tuple[Any, np.ndarray]) -> Callable[[Any], float]:
    return lambda model: float((model.predict(val[0]) == val[1]).mean())


def naive_bayes(train: tuple[Any, np.ndarray], val: tuple[Any, np.ndarray], test: Any) -> Fitted:
    """Multinomial naive Bayes on count features ``(X, y)``; smoothing chosen on ``val``."""
    from sklearn.naive_bayes import MultinomialNB  # the tasks extra: imported where used

    model, alpha = _choose(lambda a: MultinomialNB(alpha=a), NB_ALPHAS, train, _accuracy_on(val))
    return Fitted(model.predict(test), {"alpha": alpha})


def nearest_class_mean(train: tuple[Any, np.ndarray], test: Any) -> Fitted:
    """Each test input gets the class whose mean training input is nearest (Euclidean)."""
    from sklearn.neighbors import NearestCentroid  # the tasks extra: imported where used

    return Fitted(NearestCentroid().fit(*train).predict(test), {})


def nearest_neighbours(train: tuple[Any, np.ndarray], val: tuple[Any, np.ndarray], test: Any) -> Fitted:
    """Majority label of the k nearest training inputs (Euclidean); k chosen on ``val``."""
    from sklearn.neighbors import KNeighborsClassifier  # the tasks extra: imported where used

    model, k = _choose(lambda n: KNeighborsClassifier(n_neighbors=n), NEIGHBOURS, train,
                       _accuracy_on(val))
    return Fitted(model.predict(test), {"k": k})


def category_match(train: tuple[Any, np.ndarray], val_pairs: tuple[Any, Any, np.ndarray],
                   test_pairs: tuple[Any, Any]) -> Fitted:
    """A pair is "same" (1) when naive Bayes gives both documents one category; smoothing chosen by pair accuracy
    on ``val_pairs (A, B, same)``."""
    from sklearn.naive_bayes import MultinomialNB  # the tasks extra: imported where used

    def pair_accuracy(model: Any) -> float:
        a, b, same = val_pairs
        return float(((model.predict(a) == model.predict(b)) == same.astype(bool)).mean())

    best, best_alpha = _choose(lambda a: MultinomialNB(alpha=a), NB_ALPHAS, train, pair_accuracy)
    a, b = test_pairs
    return Fitted((best.predict(a) == best.predict(b)).astype(np.int64), {"alpha": best_alpha})
