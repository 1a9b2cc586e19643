"""Reference rows: what a task's test split gives without attention, from the very splits the variants train and
are scored on (docs/quality.md, "References without attention")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from bench.quality.reference import counts, translation
from bench.quality.reference.bytes_model import compressed_bits_per_byte, ngram_bits_per_byte, scored_windows
from bench.quality.reference.per_frame import per_frame_predictions
from bench.quality.tasks import ClassificationTask, Metric, Task
from bench.quality.tasks.bytelm import ByteLM
from bench.quality.tasks.image import ImagePatches, ImagePixels
from bench.quality.tasks.mqar import MQAR
from bench.quality.tasks.retrieval import Retrieval
from bench.quality.tasks.text import Text
from bench.quality.tasks.translate import Translate
from bench.quality.tasks.video import Video


@dataclass(frozen=True)
class Outcome:
    """A reference's test metrics and the settings it chose on validation."""

    metrics: list[Metric]
    chosen: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Reference:
    """One reference row: its id, its report title, which tasks it applies to, how it scores one."""

    name: str
    title: str
    applies: Callable[[Task], bool]
    compute: Callable[[Task], Outcome]


def _arrays(task: Task, split: str) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in task.splits[split].items()}


def _token_task(task: Task) -> bool:
    """A classification of one token sequence per example (not a pair, not per-token labels)."""
    if not isinstance(task, ClassificationTask) or isinstance(task, Retrieval):
        return False
    return task.model_kind == "encoder_classifier" and getattr(task, "pooling", "") != "tokens"


def classification_outcome(task: ClassificationTask, fitted: counts.Fitted) -> Outcome:
    """Test predictions scored as the task scores a model's (headline and per-condition metrics)."""
    labels = task.splits["test"]["labels"]
    preds = torch.as_tensor(np.asarray(fitted.predictions), dtype=labels.dtype)
    accuracy = float((preds == labels).float().mean())
    return Outcome([Metric("accuracy", accuracy), *task.condition_metrics("test", preds, labels)],
                   fitted.chosen)


def _features(task: Task, split: str, words: bool) -> Any:
    """Count features of a split: bag of tokens, or bag of words of the bytes it holds."""
    a = _arrays(task, split)
    if words:
        return counts.bytes_to_text(a["ids"], a.get("key_mask"))
    return counts.token_counts(a["ids"], int(task.vocab_size), a.get("key_mask"))


def _naive_bayes(words: bool) -> Callable[[Task], Outcome]:
    def compute(task: Task) -> Outcome:
        assert isinstance(task, ClassificationTask)
        split = {s: _features(task, s, words) for s in ("train", "val", "test")}
        if words:
            split["train"], split["val"], split["test"] = counts.word_counts(
                split["train"], split["val"], split["test"])
        y = {s: _arrays(task, s)["labels"] for s in ("train", "val")}
        fitted = counts.naive_bayes((split["train"], y["train"]), (split["val"], y["val"]),
                                    split["test"])
        return classification_outcome(task, fitted)
    return compute


def _category_match(words: bool) -> Callable[[Task], Outcome]:
    """Retrieval: same category by naive Bayes on each article (:func:`counts.category_match`)."""
    def compute(task: Task) -> Outcome:
        assert isinstance(task, Retrieval)
        articles = {k: v.numpy() for k, v in task.articles.items()}
        sides = {s: _arrays(task, s) for s in ("val", "test")}
        if words:
            texts = [counts.bytes_to_text(articles["ids"], articles["key_mask"])]
            for s in ("val", "test"):
                texts += [counts.bytes_to_text(sides[s]["ids"], sides[s]["key_mask"]),
                          counts.bytes_to_text(sides[s]["pair_ids"], sides[s]["pair_key_mask"])]
            train, va, vb, ta, tb = counts.word_counts(*texts)
        else:
            vocab = int(task.vocab_size)
            train = counts.token_counts(articles["ids"], vocab, articles["key_mask"])
            va, vb, ta, tb = (counts.token_counts(sides[s][k], vocab, sides[s][m])
                              for s in ("val", "test")
                              for k, m in (("ids", "key_mask"), ("pair_ids", "pair_key_mask")))
        fitted = counts.category_match((train, articles["category"]),
                                       (va, vb, sides["val"]["labels"]), (ta, tb))
        return classification_outcome(task, fitted)
    return compute


def _pixels(task: Task, split: str) -> np.ndarray:
    a = _arrays(task, split)
    images = a["images"] * 255.0 if "images" in a else a["ids"]
    return images.reshape(len(images), -1).astype(np.float64)  # (n, pixels), grey 0..255


def _nearest(kind: str) -> Callable[[Task], Outcome]:
    def compute(task: Task) -> Outcome:
        assert isinstance(task, ClassificationTask)
        x = {s: _pixels(task, s) for s in ("train", "val", "test")}
        y = {s: _arrays(task, s)["labels"] for s in ("train", "val")}
        if kind == "mean":
            fitted = counts.nearest_class_mean((x["train"], y["train"]), x["test"])
        else:
            fitted = counts.nearest_neighbours((x["train"], y["train"]), (x["val"], y["val"]),
                                               x["test"])
        return classification_outcome(task, fitted)
    return compute


def _bytes_reference(score: Callable[[ByteLM, np.ndarray], float]) -> Callable[[Task], Outcome]:
    def compute(task: Task) -> Outcome:
        assert isinstance(task, ByteLM)
        budget = task.data.eval_bytes
        windows = scored_windows(task.splits["test"]["bytes"].numpy(), task.seq_len, budget)
        return Outcome([Metric("bits_per_byte", score(task, windows), "", windows[:, 1:].size)])
    return compute


def _ngram(order: int) -> Callable[[Task], Outcome]:
    return _bytes_reference(lambda task, windows: ngram_bits_per_byte(
        task.splits["train"]["bytes"].numpy(), windows, order))


def _compressor(name: str) -> Callable[[Task], Outcome]:
    return _bytes_reference(lambda task, windows: compressed_bits_per_byte(windows, name))


def _translation(kind: str) -> Callable[[Task], Outcome]:
    def compute(task: Task) -> Outcome:
        assert isinstance(task, Translate)
        count = min(task.bleu_count(), len(task.references["test"]))
        sources, references = task.sources["test"][:count], task.references["test"][:count]
        if kind == "copy":
            hypotheses = list(sources)
        else:
            hypotheses = translation.retrieved_translations(
                task.sources["train"], task.references["train"], sources)
        return Outcome([Metric("bleu", translation.corpus_bleu(hypotheses, references))])
    return compute


def _present_value(task: Task) -> Outcome:
    assert isinstance(task, MQAR)
    return Outcome(task.present_value_guess("test"))


def _majority(task: Task) -> Outcome:
    """Always the most frequent training label."""
    assert isinstance(task, ClassificationTask)
    labels = task.splits["test"]["labels"]
    common = int(torch.bincount(task.splits["train"]["labels"]).argmax())
    fitted = counts.Fitted(np.full(len(labels), common), {"label": common})
    return classification_outcome(task, fitted)


def _per_frame(task: Task) -> Outcome:
    """A classifier of single frames, its log-probabilities averaged over a clip's frames."""
    assert isinstance(task, Video)
    train, test = task.splits["train"], task.splits["test"]
    preds = per_frame_predictions(train["videos"], train["labels"], test["videos"], task.num_classes)
    return classification_outcome(task, counts.Fitted(preds, {}))


def _is(*classes: type) -> Callable[[Task], bool]:
    return lambda task: isinstance(task, classes)


def list_references() -> list[Reference]:
    """Every reference, in the order the report lists them."""
    return [
        Reference("naive_bayes_tokens", "naive Bayes (token counts)", _token_task,
                  _naive_bayes(words=False)),
        Reference("naive_bayes_words", "naive Bayes (word counts)", _is(Text),
                  _naive_bayes(words=True)),
        Reference("category_match_tokens", "same category by naive Bayes (token counts)",
                  _is(Retrieval), _category_match(words=False)),
        Reference("category_match_words", "same category by naive Bayes (word counts)",
                  _is(Retrieval), _category_match(words=True)),
        Reference("nearest_class_mean", "nearest class mean (pixels)",
                  _is(ImagePixels, ImagePatches), _nearest("mean")),
        Reference("nearest_neighbours", "k nearest neighbours (pixels; k chosen on val)",
                  _is(ImagePixels, ImagePatches), _nearest("neighbours")),
        *(Reference(f"ngram_{k}", f"n-gram ({k} byte{'s' * (k > 1)} of context, Witten-Bell)",
                    _is(ByteLM), _ngram(k)) for k in (1, 2, 3, 4)),
        Reference("gzip", "gzip -9 (test bytes alone)", _is(ByteLM), _compressor("gzip")),
        Reference("xz", "xz -9e (test bytes alone)", _is(ByteLM), _compressor("xz")),
        Reference("present_value", "a value the sequence holds, at random (expected)", _is(MQAR),
                  _present_value),
        Reference("majority_class", "the most frequent training label", _is(Video), _majority),
        Reference("per_frame", "a classifier of single frames, averaged over time (MLP on pixels)",
                  _is(Video), _per_frame),
        Reference("copy_source", "copy the source sentence", _is(Translate), _translation("copy")),
        Reference("nearest_training_pair", "target of the nearest training source (TF-IDF)",
                  _is(Translate), _translation("nearest")),
    ]


def reference_names() -> list[str]:
    """The names a grid's ``references`` key accepts."""
    return [r.name for r in list_references()]


def get_reference(name: str) -> Reference:
    """The reference ``name``; ``ValueError`` lists the known ones."""
    for reference in list_references():
        if reference.name == name:
            return reference
    raise ValueError(f"references: unknown reference {name!r}; references are {reference_names()}")
