"""Decoding (docs/models.md): greedy, beam search and sampling over a :class:`DecodeSession` that a model builds
in ``start_decoding``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from torch import Tensor

from attn.validation import invalid
from models.embeddings import first_real


class DecodeSession(Protocol):
    """``next_logits(tokens (B, T)) -> (B, V)`` of the whole sequence so far; ``reorder(index)`` for beams."""

    def next_logits(self, tokens: Tensor) -> Tensor: ...

    def reorder(self, index: Tensor) -> None: ...


def left_pad(prompts: Sequence[Tensor], pad_id: int = 0) -> tuple[Tensor, Tensor]:
    """Prompts ``(T_b,)`` as one left-padded batch ``ids (B, max T_b)`` and ``key_mask`` (True at real tokens),
    what ``generate(ids, n, key_mask=key_mask)`` takes."""
    if not prompts:
        raise invalid("prompts", "must be a non-empty list of 1-D token id tensors; got none")
    for b, prompt in enumerate(prompts):
        if not isinstance(prompt, Tensor) or prompt.dim() != 1 or prompt.numel() == 0:
            got = tuple(prompt.shape) if isinstance(prompt, Tensor) else type(prompt).__name__
            raise invalid("prompts", f"must be 1-D token id tensors of length >= 1; prompt {b} is {got}")
    width = max(len(p) for p in prompts)
    ids = prompts[0].new_full((len(prompts), width), pad_id)  # (B, T)
    key_mask = torch.zeros(len(prompts), width, dtype=torch.bool, device=ids.device)  # (B, T)
    for b, prompt in enumerate(prompts):
        ids[b, width - len(prompt) :] = prompt
        key_mask[b, width - len(prompt) :] = True
    return ids, key_mask


def check_left_padded(key_mask: Tensor, ids: Tensor) -> None:
    """``ValueError`` unless ``key_mask`` is a bool mask of ``ids``' shape, each row False then True (>= 1)."""
    if not isinstance(key_mask, Tensor) or key_mask.dtype != torch.bool or key_mask.shape != ids.shape:
        got = f"{key_mask.dtype} of shape {tuple(key_mask.shape)}" if isinstance(key_mask, Tensor) \
            else type(key_mask).__name__
        raise invalid("key_mask", f"must be a bool tensor of the prompts' shape {tuple(ids.shape)}, "
                                  f"True at real tokens; got {got}")
    empty = (~key_mask.any(dim=1)).nonzero()
    if len(empty):
        raise invalid("key_mask", f"every prompt needs at least one real token (True); row "
                                  f"{int(empty[0])} has none")
    columns = torch.arange(key_mask.shape[1], device=key_mask.device)  # (T,)
    start = first_real(key_mask)  # (B,)
    bad = (key_mask != (columns[None, :] >= start[:, None])).any(dim=1).nonzero()
    if len(bad):
        raise invalid("key_mask", f"prompts of different lengths must be left-padded (each row "
                                  f"False then True, the prompt ending at the last column: "
                                  f"models.generation.left_pad); row {int(bad[0])} is not")


def length_penalty(length: Tensor, alpha: float) -> Tensor:
    """GNMT length penalty ``((5 + len) / 6) ** alpha`` (Wu et al. 2016), ``len`` counting tokens through EOS."""
    return ((5.0 + length.to(torch.float32)) / 6.0) ** alpha


def _extend(
    session: DecodeSession,
    tokens: Tensor,
    max_new_tokens: int,
    eos_id: int | None,
    pick: Callable[[Tensor], Tensor],
) -> Tensor:
    """Append ``pick(next_logits) -> (B,)`` up to ``max_new_tokens`` times; after EOS a row repeats EOS."""
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
    """Beam search: the best sequence per row ``(B, T')`` and its score ``(B,)``, log-probability over
    :func:`length_penalty`; a finished beam is extended only by EOS at no cost; ``k = 1`` is greedy search."""
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

        Returns the prefix then the new tokens, ``(B, T + new)`` (shorter if every row ended in ``eos_id``).
        ``length_penalty``: the GNMT alpha for beam search. ``inputs`` go to ``start_decoding``: ``key_mask``
        for left-padded prompts (:func:`left_pad`), ``src_key_mask`` for an encoder-decoder's source.
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
