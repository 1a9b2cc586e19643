"""Streaming (continual) inference for an encoder over a sliding window of the last n tokens (Hedegaard et al.
2023, "Continual Transformers"; docs/models.md, "Streaming")."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attn.validation import require_choice
from models.retroactive import RetroactiveSoftmax, retroactive_reason

#: the first block's paths (:class:`StreamPath`)
SINGLE_OUTPUT, RETROACTIVE_UPDATE, RETROACTIVE_RECOMPUTE = (
    "single-output", "retroactive-update", "retroactive-recompute")
#: ``update``: ``auto`` takes the O(n d) update where it is exact, ``recompute`` never does
UPDATES = ("auto", "recompute")


@dataclass(frozen=True)
class StreamPath:
    """What the last :meth:`StreamingEncoder.step` ran in its first block: ``first_layer`` (a path name),
    ``fallback`` (why the update does not apply) and ``refreshed_rows`` (rows recomputed after cancellation)."""

    first_layer: str
    fallback: str | None = None
    refreshed_rows: int = 0


def _push(buffer: Tensor | None, new: Tensor, dim: int, size: int) -> Tensor:
    out = new if buffer is None else torch.cat([buffer, new], dim=dim)
    return out.narrow(dim, max(out.shape[dim] - size, 0), min(out.shape[dim], size))


class StreamingEncoder:
    """Step-wise encoder over the last ``window`` tokens of a model with ``token_emb`` and ``encoder``;
    ``update="auto"``: the O(n * d) retroactive update where exact, ``"recompute"``: always recompute."""

    def __init__(self, model: nn.Module, window: int, update: str = "auto") -> None:
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"window: must be an int >= 1; got {window!r}")
        require_choice("update", update, UPDATES)
        mixer = getattr(model.config, "mixer", "attention")
        if mixer != "attention":
            raise ValueError(
                f"mixer: streaming caches per-token keys and values of a self-attention; the "
                f"model has mixer={mixer!r} (a bidirectional recurrent encoder has none)"
            )
        position = getattr(model.config, "position", "none")
        if position not in ("none", "rope"):
            raise ValueError(
                f"position: streaming needs position='none' or 'rope' (a token's keys must not "
                f"depend on its place in the window); the model has {position!r}"
            )
        self.model = model
        self.window = window
        self.embed = model.token_emb
        self.blocks = model.encoder.blocks
        self.norm = model.encoder.norm
        first = self.blocks[0].self_attn
        self.fallback = None if len(self.blocks) == 1 else retroactive_reason(first.attention)
        if self.fallback is None and len(self.blocks) > 1 and update == "recompute":
            self.fallback = "update='recompute' was asked for"
        self.retro = (RetroactiveSoftmax(window, first.head_dim)
                      if len(self.blocks) > 1 and self.fallback is None else None)
        self.last_path: StreamPath | None = None
        self.reset()

    def reset(self) -> None:
        self.x: Tensor | None = None  # (B, T, D) first-block inputs (b >= 2 only)
        # first-block per-head q / k / v (B, H, T, Dh); q for b >= 2 only, none of them on
        # the retroactive-update path (its RetroactiveSoftmax keeps them)
        self.q: Tensor | None = None
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.seen = 0  # tokens stepped since the reset: the next token's absolute position (RoPE)
        if self.retro is not None:
            self.retro.clear()  # the softmax sums of the first block's queries

    @property
    def length(self) -> int:
        if self.x is not None:  # b >= 2
            return self.x.shape[1]
        return 0 if self.k is None else self.k.shape[2]

    @torch.no_grad()
    def prefill(self, ids: Tensor) -> None:
        """Start over with ``ids (B, T)`` in the window, projected in one batch, computing no outputs."""
        self.reset()
        ids = ids[:, -self.window :]
        x = self.embed(ids)  # (B, T, D)
        first = self.blocks[0]
        self.q, self.k, self.v = first.self_attention_inputs(x)  # (B, H, T, Dh), positions 0 .. T-1
        self.seen = ids.shape[1]
        if len(self.blocks) == 1:
            self.q = None
        else:
            self.x = x
            if self.retro is not None:  # it keeps the window's q / k / v itself
                self.retro.fill(self.q, self.k, self.v)
                self.q = self.k = self.v = None

    @torch.no_grad()
    def step(self, ids: Tensor) -> Tensor:
        """One new token per row, ``ids (B,)`` -> output of the newest position ``(B, D)``."""
        n = self.window
        x_t = self.embed(ids[:, None])  # (B, 1, D)
        first = self.blocks[0]
        position = torch.full((1, 1), self.seen, dtype=torch.long, device=x_t.device)  # (1, 1)
        q, k, v = first.self_attention_inputs(x_t, positions=position)  # (B, H, 1, Dh)
        self.seen += 1
        if len(self.blocks) == 1:
            self.k, self.v = _push(self.k, k, 2, n), _push(self.v, v, 2, n)  # (B, H, T, Dh)
            self.last_path = StreamPath(SINGLE_OUTPUT)
            y = first.finish(x_t, q, self.k, self.v)  # single output: (B, 1, D)
            return self.norm(y)[:, 0]
        self.x = _push(self.x, x_t, 1, n)  # (B, T, D)
        if self.retro is not None:  # O(n d): the retroactive update keeps its own q / k / v
            heads = self.retro.step(q, k, v)  # (B, H, T, Dh)
            h = first.finish_heads(self.x, heads)  # (B, T, D)
            self.last_path = StreamPath(RETROACTIVE_UPDATE, refreshed_rows=self.retro.refreshed)
        else:
            self.q, self.k, self.v = (_push(a, b, 2, n) for a, b in ((self.q, q), (self.k, k), (self.v, v)))
            h = first.finish(self.x, self.q, self.k, self.v)  # retroactive recompute: (B, T, D)
            self.last_path = StreamPath(RETROACTIVE_RECOMPUTE, fallback=self.fallback)
        for block in self.blocks[1:-1]:
            h = block(h)
        y = self.blocks[-1].forward_last(h)  # (B, 1, D)
        return self.norm(y)[:, 0]

    @torch.no_grad()
    def batch_forward(self, ids: Tensor) -> Tensor:
        """The reference: the full encoder on ``ids (B, N)`` (a window) -> last output ``(B, D)``."""
        return self.model.encoder(self.embed(ids))[:, -1]
