"""Translation references: the source copied, and the target of the most similar training source (translation
memory, Nagao 1984)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Corpus BLEU (sacrebleu's default 13a tokenisation, as the translate task scores)."""
    import sacrebleu  # the tasks extra

    if len(hypotheses) != len(references):
        raise ValueError(f"hypotheses: {len(hypotheses)} sentences for {len(references)} references")
    return float(sacrebleu.corpus_bleu(list(hypotheses), [list(references)]).score)


def nearest_source(train_sources: Sequence[str], queries: Sequence[str]) -> np.ndarray:
    """``(Q,)``: the training source nearest each query by the cosine of TF-IDF word vectors (the first of equals)."""
    from sklearn.feature_extraction.text import TfidfVectorizer  # the tasks extra: imported where used

    vectorizer = TfidfVectorizer(lowercase=True, sublinear_tf=True)
    train = vectorizer.fit_transform(train_sources)  # (T, V), rows L2-normalised
    query = vectorizer.transform(queries)  # (Q, V)
    similarity = (query @ train.T).toarray()  # (Q, T) cosines
    return similarity.argmax(axis=1)


def retrieved_translations(train_sources: Sequence[str], train_targets: Sequence[str],
                           queries: Sequence[str]) -> list[str]:
    """For each query, the target side of its :func:`nearest_source` training pair."""
    return [train_targets[i] for i in nearest_source(train_sources, queries)]
