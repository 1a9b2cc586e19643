"""A recurrent layer in place of self-attention, LSTM or GRU, bidirectional in encoder blocks, with a state cache
for decoding; right padding is packed away (``pack_padded_sequence``), so it reaches no real position."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

RECURRENT_MIXERS = ("lstm", "gru")


class RecurrentCache:
    """The recurrent state ``h`` (and LSTM ``c``), ``(L, B, H)``, of one layer after the tokens fed so far."""

    def __init__(self) -> None:
        self.h: Tensor | None = None  # (L, B, H)
        self.c: Tensor | None = None  # (L, B, H), LSTM only
        self.tokens = 0

    @property
    def length(self) -> int:
        return self.tokens

    @property
    def state(self) -> Tensor | tuple[Tensor, Tensor] | None:
        """The initial state for the next call: ``h`` (GRU), ``(h, c)`` (LSTM) or None."""
        if self.h is None:
            return None
        return self.h if self.c is None else (self.h, self.c)

    def update(self, state: Tensor | tuple[Tensor, Tensor], new_tokens: int) -> None:
        if isinstance(state, tuple):
            self.h, self.c = state
        else:
            self.h, self.c = state, None
        self.tokens += new_tokens

    def reorder(self, index: Tensor) -> None:
        """Select / repeat batch rows (beam search)."""
        if self.h is None:
            return
        self.h = self.h.index_select(1, index)  # (L, B', H)
        if self.c is not None:
            self.c = self.c.index_select(1, index)


def check_right_padded(key_mask: Tensor, batch: int, length: int) -> Tensor:
    """The real lengths ``(B,)`` of a right-padded bool ``key_mask (batch, length)``; ``ValueError`` otherwise."""
    if key_mask.dtype != torch.bool or tuple(key_mask.shape) != (batch, length):
        raise ValueError(
            f"key_mask: must be a bool tensor of shape ({batch}, {length}); "
            f"got {key_mask.dtype} of shape {tuple(key_mask.shape)}"
        )
    lengths = key_mask.sum(dim=1)  # (B,)
    positions = torch.arange(length, device=key_mask.device)  # (N,)
    if not torch.equal(key_mask, positions[None, :] < lengths[:, None]):
        raise ValueError(
            "key_mask: a recurrent mixer needs right padding (every row's real tokens first)"
        )
    return lengths


class RecurrentMixer(nn.Module):
    """An ``nn.LSTM`` / ``nn.GRU`` mixing tokens, ``(B, N, D) -> (B, N, D)``; calls must match its ``causal``."""

    def __init__(self, d_model: int, kind: str = "lstm", *, causal: bool = False) -> None:
        super().__init__()
        if kind not in RECURRENT_MIXERS:
            raise ValueError(
                f"mixer: unknown value {kind!r}; allowed values are {list(RECURRENT_MIXERS)}"
            )
        if not causal and d_model % 2:
            raise ValueError(
                f"d_model: must be even for a bidirectional {kind} (d_model // 2 units per "
                f"direction); got {d_model}"
            )
        self.kind = kind
        self.causal = causal
        self.d_model = d_model
        rnn_cls = nn.LSTM if kind == "lstm" else nn.GRU
        hidden = d_model if causal else d_model // 2
        self.rnn = rnn_cls(d_model, hidden, batch_first=True, bidirectional=not causal)

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, causal={self.causal}"

    def new_cache(self) -> RecurrentCache:
        if not self.causal:
            raise ValueError(
                f"mixer: a bidirectional (encoder) {self.kind} reads the whole sequence at "
                "once and has no step-wise cache"
            )
        return RecurrentCache()

    def forward(
        self,
        x: Tensor,
        *,
        causal: bool = False,
        key_mask: Tensor | None = None,
        cache: RecurrentCache | None = None,
    ) -> Tensor:
        """``x (B, N, D)`` -> ``(B, N, D)``, zero at padding; with ``cache``, ``x`` holds only the new tokens."""
        if causal != self.causal:
            built = "unidirectional (causal)" if self.causal else "bidirectional (non-causal)"
            raise ValueError(
                f"mixer: this {self.kind} layer is {built}; it cannot run with causal={causal}"
            )
        if cache is not None and not self.causal:
            self.new_cache()  # raises: a bidirectional layer has no step-wise cache
        if cache is not None and key_mask is not None:
            raise ValueError("key_mask: not supported together with a recurrent cache")
        batch, length, _ = x.shape
        state = None if cache is None else cache.state
        if key_mask is None:
            out, final = self.rnn(x, state)  # (B, N, D)
        else:
            lengths = check_right_padded(key_mask, batch, length)  # (B,)
            # an all-padding row still needs one step for packing; its output is zeroed below
            packed = pack_padded_sequence(
                x, lengths.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False
            )
            out_packed, final = self.rnn(packed, state)
            out, _ = pad_packed_sequence(out_packed, batch_first=True, total_length=length)  # (B, N, D)
            out = out * key_mask.unsqueeze(-1).to(out.dtype)  # (B, N, D), zero at padding
        if cache is not None:
            cache.update(final, length)
        return out
