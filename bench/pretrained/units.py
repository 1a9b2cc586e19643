"""The units of a pretrained-model run (a pattern's perplexity, passkey cells at one length or decoding steps;
a streaming policy; every pattern's prefill at one length; the unigram floor), each in a worker of its own."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from bench.engine.process import Worker, WorkerGone
from bench.pretrained import cost, passkey, streaming
from bench.pretrained.config import PatternEntry, PretrainedConfig
from bench.pretrained.scoring import greedy_matches, hidden_states, next_token_nll, unigram_nll, wilson_interval
from bench.pretrained.texts import Document, document, user_document
from models.pretrained import place_attention, placed_attention

Row = dict[str, Any]


@dataclass(frozen=True)
class PretrainedUnit:
    """One unit: its task, what it runs (a pattern, a length, a policy) and the run's config."""

    task: str
    config: PretrainedConfig
    entry: PatternEntry | None = None
    seq_len: int | None = None
    policy: streaming.CachePolicy | None = None
    positions: str | None = None

    device = "cpu"

    @property
    def label(self) -> str:
        if self.entry is not None:
            return self.entry.name
        if self.policy is not None:
            return f"{self.policy.label} [{self.positions} positions]"
        return "unigram (floor)" if self.task == "perplexity" else "every pattern"

    @property
    def unit_id(self) -> str:
        return ":".join(str(p) for p in (self.task, self.label, self.seq_len) if p is not None)

    def describe(self) -> str:
        at = f" at {self.seq_len} tokens" if self.seq_len else ""
        return f"{self.task} {self.label}{at}"

    def _identity(self) -> Row:
        entry = self.entry
        return {"cell_id": self.unit_id, "task": self.task, "label": self.label,
                "variant": entry.variant if entry else "",
                "params": json.dumps(entry.params, sort_keys=True) if entry else "",
                "layers": "" if entry is None or entry.layers is None else json.dumps(list(entry.layers)),
                "model": self.config.model, "threads": self.config.threads}

    def failure_rows(self, status: str, reason: str) -> list[Row]:
        return [{**self._identity(), "metric": "-", "status": status, "reason": reason[:500],
                 "seq_len": self.seq_len}]

    def run(self, cuda_visible: str | None = None) -> list[Row]:
        """Run in a fresh worker; a death or a timeout becomes a row."""
        from bench.pretrained.worker import unit_worker_main  # lazy: transformers loads in workers only

        worker = Worker(unit_worker_main, (self, TASKS[self.task]))
        try:
            kind, payload = worker.receive(self.config.timeout_s)
        except TimeoutError:
            return self.failure_rows("timeout", f"timed out after {self.config.timeout_s:g} s")
        except WorkerGone as gone:
            return self.failure_rows(gone.status, gone.reason)
        finally:
            worker.kill()
        if kind == "failed":
            return self.failure_rows(payload[0], payload[1])
        identity = self._identity()
        return [{**identity, "status": "ok", "reason": "", **row} for row in payload]


def documents(config: PretrainedConfig) -> list[Document]:
    """The perplexity documents, the user's text last."""
    found = [document(name) for name in config.perplexity.documents] if config.perplexity else []
    return [*found, *([user_document(config.text)] if config.text else [])]


def tokens_of(doc: Document, encode: Any, needed: int) -> list[int]:
    """The first ``needed`` tokens of ``doc`` (``ValueError`` naming it when it is shorter)."""
    ids = encode(doc.text())
    if len(ids) < needed:
        raise ValueError(f"document {doc.name!r}: {len(ids)} tokens; the run needs {needed}")
    return ids[:needed]


def _place(unit: PretrainedUnit, model: Any) -> None:
    entry = unit.entry
    place_attention(model, entry.variant, entry.params, layers=entry.layers, kernel=unit.config.kernel)


def _kernel_path(unit: PretrainedUnit, model: Any) -> str:
    """What the swapped attention ran in its last call (``kernel: path``)."""
    chosen = unit.entry.layers[0] if unit.entry.layers else 0
    path = placed_attention(model)[chosen].last_path
    return "" if path is None else f"{path.kernel}: {path.path}"


def perplexity_rows(unit: PretrainedUnit, model: Any, encode: Any) -> list[Row]:
    """The perplexity of tokens N/2..N-1 for every N, read from one forward of the longest per document."""
    lengths = unit.config.perplexity.lengths
    rows = []
    for doc in documents(unit.config):
        ids = torch.tensor([tokens_of(doc, encode, max(lengths))])
        first = min(lengths) // 2
        if unit.entry is None:
            rows += [_unigram_row(doc, ids[0].tolist(), n, model.config.vocab_size) for n in lengths]
            continue
        started = time.perf_counter()
        _place(unit, model)
        nll = next_token_nll(model, hidden_states(model, ids), ids, first)[0]
        elapsed = (time.perf_counter() - started) * 1e3
        for n in lengths:
            mean = float(nll[n // 2 - first:n - first].mean())
            rows.append({"document": doc.name, "seq_len": n, "metric": "perplexity",
                         "value": math.exp(mean), "count": n - n // 2, "time_ms": elapsed,
                         "kernel_path": _kernel_path(unit, model)})
    return rows


def _unigram_row(doc: Document, ids: list[int], n: int, vocab: int) -> Row:
    """The unigram floor of tokens N/2..N-1, fitted on tokens 0..N/2-1."""
    scored = ids[n // 2:n]
    return {"document": doc.name, "seq_len": n, "metric": "perplexity", "count": len(scored),
            "value": math.exp(unigram_nll(scored, ids[:n // 2], vocab))}


def passkey_rows(unit: PretrainedUnit, model: Any, encode: Any) -> list[Row]:
    """Every depth's keys at one length, batched per depth."""
    settings = unit.config.passkey
    _place(unit, model)
    rows = []
    for depth in settings.depths:
        keys = passkey.keys_for(unit.seq_len, depth, settings.keys, settings.seed)
        prompts = [passkey.build_prompt(encode, unit.seq_len, depth, key) for key in keys]
        right = 0
        for answer in {(p.answer.start, p.answer.stop) for p in prompts}:  # one batch per layout
            batch = [p for p in prompts if (p.answer.start, p.answer.stop) == answer]
            ids = torch.tensor([p.ids for p in batch])
            right += int(greedy_matches(model, hidden_states(model, ids), ids, slice(*answer)).sum())
        low, high = wilson_interval(right, len(keys))
        rows.append({"seq_len": unit.seq_len, "depth": depth, "metric": "passkey_accuracy",
                     "value": right / len(keys), "ci_low": low, "ci_high": high,
                     "count": len(keys), "kernel_path": _kernel_path(unit, model)})
    return rows


def streaming_rows(unit: PretrainedUnit, model: Any, encode: Any) -> list[Row]:
    """Perplexity along the stream, per bin of ``bin`` tokens, and the tokens per second."""
    settings = unit.config.streaming
    doc = user_document(unit.config.text) if settings.document == "text" else document(settings.document)
    ids = torch.tensor([tokens_of(doc, encode, settings.tokens)])
    nll, seconds = streaming.stream_nll(model, ids, unit.policy, unit.positions, settings.chunk,
                                        unit.config.kernel)
    rows = []
    for end in range(settings.bin, nll.shape[0] + 2, settings.bin):
        part = nll[max(0, end - settings.bin - 1):end - 1]
        rows.append({"document": settings.document, "seq_len": end, "positions": unit.positions,
                     "metric": "perplexity", "value": math.exp(float(part.mean())),
                     "count": part.numel(),
                     "kv_cache_bytes": cost.kv_cache_bytes(model, unit.policy.cache_tokens(end))})
    rows.append({"document": settings.document, "seq_len": nll.shape[0] + 1,
                 "positions": unit.positions, "metric": "tokens_per_s",
                 "value": (nll.shape[0] + 1) / seconds, "time_ms": seconds * 1e3})
    return rows


def prefill_rows(unit: PretrainedUnit, model: Any, encode: Any) -> list[Row]:
    """Every pattern's prefill at one length, timed in interleaved rounds."""
    generator = torch.Generator().manual_seed(unit.seq_len)
    ids = torch.randint(0, model.config.vocab_size, (1, unit.seq_len), generator=generator)
    patterns = [(e.variant, e.params, e.layers) for e in unit.config.patterns]
    measured = cost.timed_prefill(model, ids, patterns, unit.config.prefill.repeats, unit.config.kernel)
    rows = []
    for entry, found in zip(unit.config.patterns, measured):
        single = dataclasses.replace(unit, entry=entry)
        rows.append({**single._identity(), "cell_id": unit.unit_id, "seq_len": unit.seq_len,
                     "metric": "prefill_ms", "value": found["time_ms"], **found,
                     "times_ms": json.dumps([round(t, 2) for t in found["times_ms"]])})
    return rows


def decode_rows(unit: PretrainedUnit, model: Any, encode: Any) -> list[Row]:
    """A pattern's decoding step at every context, against the cache it needs."""
    entry = unit.entry
    rows = []
    _place(unit, model)
    for context in unit.config.decode.contexts:
        kept = cost.kv_tokens(entry.variant, entry.params, context)
        if kept is None or entry.layers is not None:
            rows.append({"seq_len": context, "metric": "decode_ms", "status": "unsupported",
                         "reason": f"{entry.variant}: no rule for the KV cache it needs"
                                   if kept is None else "a pattern in some layers only"})
            continue
        times = cost.timed_decode_step(model, context, kept, unit.config.decode.steps)
        median = sorted(times)[len(times) // 2]
        rows.append({"seq_len": context, "metric": "decode_ms", "value": median, "time_ms": median,
                     "times_ms": json.dumps([round(t, 3) for t in times]), "repeats": len(times),
                     "kv_cache_bytes": cost.kv_cache_bytes(model, kept),
                     "kernel_path": _kernel_path(unit, model)})
    return rows


TASKS = {"perplexity": perplexity_rows, "passkey": passkey_rows, "streaming": streaming_rows,
         "prefill": prefill_rows, "decode": decode_rows}


def units(config: PretrainedConfig) -> list[PretrainedUnit]:
    """Every unit of a run: the cheap floors and costs first, then quality by pattern."""
    found: list[PretrainedUnit] = []
    if config.perplexity:
        found.append(PretrainedUnit("perplexity", config))
    for n in config.prefill.lengths if config.prefill else ():
        found.append(PretrainedUnit("prefill", config, seq_len=n))
    if config.decode:
        found += [PretrainedUnit("decode", config, entry=e) for e in config.patterns]
    if config.perplexity:
        found += [PretrainedUnit("perplexity", config, entry=e) for e in config.patterns]
    if config.passkey:
        found += [PretrainedUnit("passkey", config, entry=e, seq_len=n)
                  for n in config.passkey.lengths for e in config.patterns]
    if config.streaming:
        found += [PretrainedUnit("streaming", config, policy=p, positions=pos)
                  for p in config.streaming.policies for pos in config.streaming.positions
                  if p.evicts or pos == config.streaming.positions[0]]
    return found
