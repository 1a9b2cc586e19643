"""``translate``: English to Spanish Bible passages of one chapter (chapters never straddle splits), a shared BPE
of the training passages; selection on validation loss, test BLEU of greedy and beam-search decoding."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bench.quality.data import bible
from bench.quality.data.splits import split_indices
from bench.quality.tasks.base import DataSettings, Metric, Split, Task, as_tensors, to_model_device
from bench.quality.tasks.registration import ConditionView, register_task

PAD, BOS, EOS = 0, 1, 2


def passages(verses: list[tuple[str, str, str]], size: int) -> list[tuple[str, str, str]]:
    """Consecutive verses of one chapter joined ``size`` at a time: ``(first ref, en, es)``."""
    out, group = [], []
    for ref, en, es in verses:
        if group and group[0][0].rsplit(":", 1)[0] != ref.rsplit(":", 1)[0]:
            group = []  # a new chapter: drop the unfinished passage of the last one
        group.append((ref, bible.clean(en, "en"), bible.clean(es, "es")))
        if len(group) == size:
            out.append((group[0][0], " ".join(g[1] for g in group), " ".join(g[2] for g in group)))
            group = []
    return out


PRESETS = {
    "tiny": {
        "data": {"passage_verses": 1, "max_passages": 400, "bpe_vocab": 300, "src_len": 48,
                 "tgt_len": 48, "bleu_examples": 8, "beam_width": 2, "length_penalty": 0.6,
                 "data_seed": 0},
    },
    "small": {
        "note": "single verses, 64 BPE tokens a side (LRA has no translation task).",
        "data": {"passage_verses": 1, "max_passages": 20000, "bpe_vocab": 600, "src_len": 64,
                 "tgt_len": 64, "bleu_examples": 600, "beam_width": 4, "length_penalty": 0.6,
                 "data_seed": 0},
        "train": {"steps": 500},
    },
    "lra": {
        "data": {"passage_verses": 4, "max_passages": None, "bpe_vocab": 8000, "src_len": 256,
                 "tgt_len": 256, "bleu_examples": 1000, "beam_width": 4, "length_penalty": 0.6,
                 "data_seed": 0},
    },
}


@register_task(
    "translate",
    order=8,
    presets=PRESETS,
    metric_title="BLEU",
    conditions=(ConditionView("bleu", "decoding=", "BLEU by decoding (test)", numeric=False),),
)
class Translate(Task):
    @dataclass(frozen=True)
    class Data(DataSettings):
        passage_verses: int = 4
        max_passages: int | None = None  # the first passages in canon order (None: all)
        bpe_vocab: int = 2000
        src_len: int = 256
        tgt_len: int = 256
        bleu_examples: int | str = 64  # test passages decoded ("all": every one)
        beam_width: int = 4
        length_penalty: float = 0.6
        data_seed: int = 0

    model_kind = "encoder_decoder"
    metric = "bleu"
    selection_metric = "loss"
    causal_self_attention = True

    def prepare(self) -> None:
        d = self.data
        items = passages(bible.load_parallel(), d.passage_verses)
        items = items[: d.max_passages] if d.max_passages else items
        refs = [ref for ref, _, _ in items]
        parts = split_indices(len(items), seed=d.data_seed, groups=bible.chapter_groups(refs))
        train_text = [text for i in parts["train"] for text in items[i][1:]]
        self.tokenizer = bible.train_bpe(train_text, d.bpe_vocab)
        self.references: dict[str, list[str]] = {}  # cleaned Spanish, per split
        self.sources: dict[str, list[str]] = {}  # cleaned English, per split
        self.verse_refs: dict[str, list[str]] = {}  # the first verse of each passage
        order = np.random.default_rng([d.data_seed, 0xB1E0])
        for split, index in parts.items():
            if split != "train":  # a seeded order: the first passages sample every chapter
                index = order.permutation(index)
            chosen = [items[i] for i in index]
            self.verse_refs[split] = [c[0] for c in chosen]
            arrays = bible.encode_pairs(self.tokenizer, [c[1] for c in chosen], [c[2] for c in chosen],
                                        d.src_len, d.tgt_len)
            keep = {k: arrays[k] for k in ("src_ids", "src_mask", "tgt_ids", "tgt_mask")}
            self.splits[split] = as_tensors(keep, np.arange(len(chosen)))
            self.references[split] = [c[2] for c in chosen]
            self.sources[split] = [c[1] for c in chosen]

    @property
    def seq_len(self) -> int:
        return self.data.src_len

    def model_overrides(self) -> dict[str, Any]:
        return {"vocab_size": self.tokenizer.get_vocab_size(), "bos_id": BOS,
                "max_len": max(self.data.src_len, self.data.tgt_len) + 8}

    def _nll(self, model: nn.Module, batch: Split, reduction: str) -> tuple[Tensor, int]:
        batch = to_model_device(batch, model)
        tgt, mask = batch["tgt_ids"], batch["tgt_mask"]
        logits = model(batch["src_ids"], tgt[:, :-1], batch["src_mask"], mask[:, :-1])  # (B, T-1, V)
        labels = tgt[:, 1:].masked_fill(~mask[:, 1:], -100)  # padding ignored
        nll = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100,
                              reduction=reduction)
        return nll, int(mask[:, 1:].sum())

    def loss(self, model: nn.Module, batch: Split) -> tuple[Tensor, int]:
        loss, _ = self._nll(model, batch, "mean")
        return loss, int(batch["src_mask"].sum() + batch["tgt_mask"].sum())

    @torch.no_grad()
    def _loss_metric(self, model: nn.Module, split: str, limit: int | None,
                     batch_size: int) -> Metric:
        total, count, tokens = 0.0, 0, 0
        start = time.perf_counter()
        for batch in self.batches(split, batch_size, limit):
            nll, n = self._nll(model, batch, "sum")
            total, count = total + float(nll), count + n
            tokens += int(batch["src_mask"].sum() + batch["tgt_mask"].sum())
        return Metric("loss", total / max(count, 1), "", tokens, time.perf_counter() - start)

    def bleu_count(self) -> int:
        """How many passages BLEU scores: the first ``bleu_examples`` of a split (``all``: every one)."""
        count = self.data.bleu_examples
        return 10**9 if count == "all" else int(count)

    @torch.no_grad()
    def bleu(self, model: nn.Module, split: str, strategy: str, batch_size: int) -> Metric:
        """Corpus BLEU of decoded test passages against the cleaned references."""
        import sacrebleu  # the tasks extra: imported where BLEU is scored

        limit = self.bleu_count()
        hypotheses, start = [], time.perf_counter()
        tokens = 0
        for batch in self.batches(split, batch_size, limit):
            batch = to_model_device(batch, model)
            out = model.generate(batch["src_ids"], self.data.tgt_len - 1, strategy=strategy,
                                 beam_width=self.data.beam_width, length_penalty=float(self.data.length_penalty),
                                 eos_id=EOS, src_key_mask=batch["src_mask"])
            hypotheses += [bible.clean(bible.decode(self.tokenizer, row[1:].tolist()), "es")
                           for row in out]
            tokens += int(batch["src_mask"].sum()) + int(out.numel())
        references = self.references[split][: len(hypotheses)]
        score = sacrebleu.corpus_bleu(hypotheses, [references]).score
        return Metric("bleu", score, f"decoding={strategy}", tokens, time.perf_counter() - start)

    def evaluate(self, model: nn.Module, split: str, *, limit: int | None, batch_size: int,
                 final: bool) -> list[Metric]:
        metrics = [self._loss_metric(model, split, limit, batch_size)]
        if final:
            greedy = self.bleu(model, split, "greedy", batch_size)
            beam = self.bleu(model, split, "beam", max(1, batch_size // 4))
            headline = Metric("bleu", beam.value, "", beam.tokens, beam.seconds)
            metrics += [headline, greedy, beam]
        return metrics
