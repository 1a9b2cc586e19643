"""Decoding: greedy, beam search and sampling over a "session" that yields next-token logits.

A session has ``next_logits(tokens (B, T)) -> (B, V)`` (``tokens`` is the whole sequence so
far; a cached session feeds only the tokens it has not seen) and ``reorder(index)`` (select
/ repeat batch rows, for beams). Models build one in ``start_decoding``; tests can pass a
hand-made session to :func:`greedy_search` / :func:`beam_search` directly.

Beam score: the sum of token log-probabilities divided by the GNMT length penalty
``lp(len) = ((5 + len) / 6) ** alpha`` (Wu et al. 2016), where ``len`` counts generated
tokens up to and including EOS. ``alpha = 0`` (the default) ranks by plain log-probability.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from torch import Tensor


class DecodeSession(Protocol):
    def next_logits(self, tokens: Tensor) -> Tensor: ...

    def reorder(self, index: Tensor) -> None: ...


def length_penalty(length: Tensor, alpha: float) -> Tensor:
    """GNMT length penalty ``((5 + len) / 6) ** alpha``."""
    return ((5.0 + length.to(torch.float32)) / 6.0) ** alpha


def _extend(
    session: DecodeSession,
    tokens: Tensor,
    max_new_tokens: int,
    eos_id: int | None,
    pick: Callable[[Tensor], Tensor],
) -> Tensor:
    """Append ``pick(next_logits) -> (B,)`` tokens ``max_new_tokens`` times; after EOS a row
    repeats EOS, and decoding stops once every row has ended."""
    done = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    for _ in range(max_new_tokens):
        nxt = pick(session.next_logits(tokens))  # (B,)
        if eos_id is not None:
            nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)
            done |= nxt == eos_id
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)  # (B, T + 1)
        if eos_id is not None and bool(done.all()):
            break
    return tokens


@torch.no_grad()
def greedy_search(
    session: DecodeSession, tokens: Tensor, max_new_tokens: int, eos_id: int | None = None
) -> Tensor:
    """Append the argmax token ``max_new_tokens`` times; after EOS a row repeats EOS."""
    return _extend(session, tokens, max_new_tokens, eos_id, lambda logits: logits.argmax(dim=-1))


@torch.no_grad()
def sample(
    session: DecodeSession,
    tokens: Tensor,
    max_new_tokens: int,
    eos_id: int | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Ancestral sampling with temperature and optional top-k truncation."""
    if temperature <= 0:
        raise ValueError(f"temperature: must be > 0; got {temperature}")

    def pick(logits: Tensor) -> Tensor:
        logits = logits.float() / temperature  # (B, V)
        if top_k is not None:
            kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)[:, 0]

    return _extend(session, tokens, max_new_tokens, eos_id, pick)


@torch.no_grad()
def beam_search(
    session: DecodeSession,
    tokens: Tensor,
    max_new_tokens: int,
    beam_width: int = 4,
    alpha: float = 0.0,
    eos_id: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Beam search; returns the best sequence per row ``(B, T')`` and its score ``(B,)``.

    Each step extends every beam by every token, ranks the ``k * V`` candidates by
    ``logprob_sum / lp(len)`` and keeps the top ``k``; a finished beam (ended in EOS) can
    only be extended by EOS at no cost, so it keeps its score and length. With ``k = 1``
    this is exactly greedy search.
    """
    if beam_width < 1:
        raise ValueError(f"beam_width: must be >= 1; got {beam_width}")
    batch, k, device = tokens.shape[0], beam_width, tokens.device
    rows = torch.arange(batch, device=device)
    session.reorder(rows.repeat_interleave(k))
    tokens = tokens.repeat_interleave(k, dim=0)  # (B*k, T)
    scores = torch.full((batch, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start identical: keep one
    lengths = torch.zeros(batch, k, device=device)
    finished = torch.zeros(batch, k, dtype=torch.bool, device=device)
    for _ in range(max_new_tokens):
        logp = torch.log_softmax(session.next_logits(tokens).float(), dim=-1)  # (B*k, V)
        vocab = logp.shape[-1]
        logp = logp.view(batch, k, vocab)
        if eos_id is not None:
            frozen = torch.full((vocab,), float("-inf"), device=device)
            frozen[eos_id] = 0.0
            logp = torch.where(finished[..., None], frozen, logp)
        cand = scores[..., None] + logp  # (B, k, V)
        cand_len = lengths + (~finished).float()  # (B, k)
        rank = cand / length_penalty(cand_len, alpha)[..., None]
        _, idx = rank.view(batch, k * vocab).topk(k, dim=-1)  # (B, k)
        beam, tok = idx // vocab, idx % vocab
        scores = cand.view(batch, k * vocab).gather(1, idx)
        lengths = cand_len.gather(1, beam)
        finished = finished.gather(1, beam)
        if eos_id is not None:
            finished |= tok == eos_id
        flat = (rows[:, None] * k + beam).view(-1)  # (B*k,)
        tokens = torch.cat([tokens.index_select(0, flat), tok.view(-1, 1)], dim=1)
        session.reorder(flat)
        if eos_id is not None and bool(finished.all()):
            break
    final = scores / length_penalty(lengths, alpha)  # (B, k)
    best = final.argmax(dim=-1)  # (B,)
    return tokens.view(batch, k, -1)[rows, best], final[rows, best]


class GenerationMixin:
    """``generate`` for models with ``start_decoding(inputs, use_cache, **kw) -> (session, prefix)``."""

    @torch.no_grad()
    def generate(
        self,
        ids: Tensor,
        max_new_tokens: int,
        strategy: str = "greedy",
        beam_width: int = 4,
        length_penalty: float = 0.0,
        eos_id: int | None = None,
        use_cache: bool = True,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        **inputs,
    ) -> Tensor:
        """Decode ``max_new_tokens`` tokens after ``ids`` (decoder) or for source ``ids``.

        Returns the prefix followed by the new tokens, ``(B, T + new)`` (shorter if every
        row ended in ``eos_id``). ``length_penalty`` is the GNMT alpha for beam search.
        """
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens: must be >= 0; got {max_new_tokens}")
        was_training = self.training
        self.eval()
        try:
            session, prefix = self.start_decoding(ids, use_cache=use_cache, **inputs)
            if strategy == "greedy":
                return greedy_search(session, prefix, max_new_tokens, eos_id)
            if strategy == "beam":
                out, _ = beam_search(session, prefix, max_new_tokens, beam_width, length_penalty, eos_id)
                return out
            if strategy == "sample":
                return sample(session, prefix, max_new_tokens, eos_id, temperature, top_k, generator)
            raise ValueError(f"strategy: must be 'greedy', 'beam' or 'sample'; got {strategy!r}")
        finally:
            self.train(was_training)
