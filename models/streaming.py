"""Streaming (continual) inference for an encoder over a sliding window of the last n tokens.

After Hedegaard et al. 2023, "Continual Transformers" (their Continual Transformer
Encoder). Each :meth:`StreamingEncoder.step` takes one new token and returns the encoder
output of the newest position; it equals the batch forward's last position on the same
window (the last ``n`` tokens, fewer while warming up).

- one block: Continual *single-output* attention. The key and value of every token are
  computed once and kept in a FIFO buffer of ``n``; each step projects only the new token
  and attends with one query: O(n * d) per step instead of O(n^2 * d + n * d^2).
- b >= 2 blocks: the first block is *retroactive*: its per-token q/k/v projections are
  cached, and the outputs of all ``n`` window positions are recomputed from them (they
  change when the oldest token leaves). Regular blocks follow; the last block is
  single-output (query and FFN for the newest position only). This is the paper's
  multi-block layout. The paper's O(n * d) retroactive update of the softmax sums
  (d_mem / AV_mem) is not used: it only holds for unmasked softmax without a score term,
  while this class must stay exact for every registered attention.

Exactness needs token keys and values that do not depend on where the token sits in the
window, so the encoder must not add absolute positions (``position="none"``, e.g. with
``relative`` attention or a ``position_bias``), or must use rotary positions
(``position="rope"``): a token's query and key are rotated once, by its absolute position
in the stream (the count of tokens stepped before it), and a rotated score depends only on
the offset between query and key, so it equals the batch forward's on the window (where
the oldest token sits at 0). CLS / extra global tokens are not used.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def _push(buffer: Tensor | None, new: Tensor, dim: int, size: int) -> Tensor:
    """Append ``new`` along ``dim`` and keep the last ``size`` entries (FIFO)."""
    out = new if buffer is None else torch.cat([buffer, new], dim=dim)
    return out.narrow(dim, max(out.shape[dim] - size, 0), min(out.shape[dim], size))


class StreamingEncoder:
    """Step-wise encoder over the last ``window`` tokens of a model with ``token_emb`` and
    ``encoder`` (e.g. :class:`~models.encoder.EncoderClassifier`)."""

    def __init__(self, model: nn.Module, window: int) -> None:
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"window: must be an int >= 1; got {window!r}")
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
        self.reset()

    def reset(self) -> None:
        """Forget every past token."""
        self.x: Tensor | None = None  # (B, T, D) first-block inputs (b >= 2 only)
        self.q: Tensor | None = None  # (B, H, T, Dh) first-block queries (b >= 2 only)
        self.k: Tensor | None = None  # (B, H, T, Dh)
        self.v: Tensor | None = None  # (B, H, T, Dh)
        self.seen = 0  # tokens stepped since the reset: the next token's absolute position (RoPE)

    @property
    def length(self) -> int:
        """Tokens in the window now."""
        return 0 if self.k is None else self.k.shape[2]

    @torch.no_grad()
    def prefill(self, ids: Tensor) -> None:
        """Start over with the tokens ``ids (B, T)`` in the window, without computing outputs.

        Projects the tokens in one batch (the same per-token values :meth:`step` caches).
        """
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

    @torch.no_grad()
    def step(self, ids: Tensor) -> Tensor:
        """One new token per row, ``ids (B,)`` -> output of the newest position ``(B, D)``."""
        n = self.window
        x_t = self.embed(ids[:, None])  # (B, 1, D)
        first = self.blocks[0]
        position = torch.full((1, 1), self.seen, dtype=torch.long, device=x_t.device)  # (1, 1)
        q, k, v = first.self_attention_inputs(x_t, positions=position)  # (B, H, 1, Dh)
        self.seen += 1
        self.k, self.v = _push(self.k, k, 2, n), _push(self.v, v, 2, n)  # (B, H, T, Dh)
        if len(self.blocks) == 1:
            y = first.finish(x_t, q, self.k, self.v)  # single output: (B, 1, D)
            return self.norm(y)[:, 0]
        self.q, self.x = _push(self.q, q, 2, n), _push(self.x, x_t, 1, n)
        h = first.finish(self.x, self.q, self.k, self.v)  # retroactive: (B, T, D)
        for block in self.blocks[1:-1]:
            h = block(h)
        y = self.blocks[-1].forward_last(h)  # (B, 1, D)
        return self.norm(y)[:, 0]

    @torch.no_grad()
    def batch_forward(self, ids: Tensor) -> Tensor:
        """The reference: the full encoder on ``ids (B, N)`` (a window) -> last output ``(B, D)``."""
        return self.model.encoder(self.embed(ids))[:, -1]
