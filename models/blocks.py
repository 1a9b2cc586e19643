"""The transformer block shared by every model: attention (or a recurrent mixer) + FFN,
post-LN or pre-LN."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from attn.validation import require_choice
from models.attention import KVCache, MultiHeadAttention, StateCache
from models.config import MIXERS, ModelConfig
from models.recurrent import RecurrentCache, RecurrentMixer


class FeedForward(nn.Module):
    """Position-wise FFN: Linear(D, F) -> ReLU/GELU -> dropout -> Linear(F, D)."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "gelu", dropout: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.act = nn.GELU() if activation == "gelu" else nn.ReLU()
        self.drop = nn.Dropout(dropout)
        self.fc2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.drop(self.act(self.fc1(x))))  # (B, N, D)


class TransformerBlock(nn.Module):
    """Self-attention (or a recurrent ``mixer``, unidirectional when ``causal``), optional cross-attention, FFN;
    each sublayer with a residual, ``norm="post"`` (``LayerNorm(x + f(x))``) or ``"pre"`` (``x + f(LayerNorm(x))``).
    A recurrent block refuses the step-wise seams (they need per-token keys and values); ``rope`` rotates
    self-attention only."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        *,
        attention: str = "full",
        attention_params: dict[str, Any] | None = None,
        kernel: str = "auto",
        cross_attention: str | None = None,
        activation: str = "gelu",
        norm: str = "post",
        dropout: float = 0.0,
        mixer: str = "attention",
        causal: bool = False,
        rope: bool = False,
        num_kv_heads: int | None = None,
    ) -> None:
        super().__init__()
        require_choice("mixer", mixer, MIXERS)
        self.pre_norm = norm == "pre"
        self.mixer = mixer
        self.self_attn: MultiHeadAttention | None = None
        self.recurrent: RecurrentMixer | None = None
        if mixer == "attention":
            self.self_attn = MultiHeadAttention(
                d_model, num_heads, attention, attention_params, kernel, rope=rope, num_kv_heads=num_kv_heads
            )
        else:
            self.recurrent = RecurrentMixer(d_model, mixer, causal=causal)
        self.norm1 = nn.LayerNorm(d_model)
        self.cross_attn: MultiHeadAttention | None = None
        if cross_attention is not None:
            self.cross_attn = MultiHeadAttention(d_model, num_heads, cross_attention, None, kernel,
                                                 num_kv_heads=num_kv_heads)
            self.norm_cross = nn.LayerNorm(d_model)
        self.ffn = FeedForward(d_model, d_ff, activation, dropout)
        self.norm2 = nn.LayerNorm(d_model)
        self.drop = nn.Dropout(dropout)

    def new_cache(self) -> KVCache | StateCache | RecurrentCache:
        """An empty cache for this block's self-attention, or its recurrent state."""
        return self.self_attn.new_cache() if self.recurrent is None else self.recurrent.new_cache()

    def _attention_only(self, method: str, cross: bool = True) -> MultiHeadAttention:
        """The self-attention, for step-wise ``method`` (``cross=False``: in a block without cross-attention)."""
        if self.self_attn is None:
            raise ValueError(
                f"mixer: {method}() needs a self-attention block; this block has mixer={self.mixer!r}"
            )
        if not cross and self.cross_attn is not None:
            raise ValueError(f"cross_attention: {method}() runs blocks without cross-attention only")
        return self.self_attn

    def new_cross_cache(self) -> KVCache:
        """An empty static cache for the cross-attention, filled once from the memory."""
        if self.cross_attn is None:
            raise ValueError("cross_attention: this block has no cross-attention to cache")
        return self.cross_attn.new_cache(static=True)

    def sublayer_input(self, norm: nn.LayerNorm, x: Tensor) -> Tensor:
        return norm(x) if self.pre_norm else x

    def residual(self, norm: nn.LayerNorm, x: Tensor, out: Tensor) -> Tensor:
        x = x + self.drop(out)
        return x if self.pre_norm else norm(x)

    def ffn_sublayer(self, x: Tensor) -> Tensor:
        return self.residual(self.norm2, x, self.ffn(self.sublayer_input(self.norm2, x)))

    # the seams of step-wise inference (streaming, single-output blocks)
    def self_attention_inputs(
        self, x: Tensor, query_x: Tensor | None = None, *, positions: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Per-head ``q`` of ``query_x`` (default ``x``, its last tokens) and ``k, v`` of ``x``: ``(B, H, N, Dh)``,
        per token so a caller may cache them; rotated by ``positions (B|1, N)`` with RoPE."""
        self_attn = self._attention_only("self_attention_inputs")
        h = self.sublayer_input(self.norm1, x)
        query_h = h if query_x is None else self.sublayer_input(self.norm1, query_x)
        return self_attn.project(query_h, h, positions=positions)

    def finish(
        self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False,
        key_mask: Tensor | None = None,
    ) -> Tensor:
        """The block's output ``(B, Nq, D)`` from per-head ``q, k, v`` and the block input ``x (B, Nq, D)``."""
        self_attn = self._attention_only("finish", cross=False)
        out = self_attn.attend(q, k, v, causal=causal, key_mask=key_mask)  # (B, Nq, D)
        return self.ffn_sublayer(self.residual(self.norm1, x, out))

    def finish_heads(self, x: Tensor, heads: Tensor) -> Tensor:
        """As :meth:`finish`, from per-head attention outputs ``heads (B, H, Nq, Dh)`` computed elsewhere."""
        self_attn = self._attention_only("finish_heads", cross=False)
        return self.ffn_sublayer(self.residual(self.norm1, x, self_attn.merge(heads)))

    def forward(
        self,
        x: Tensor,
        *,
        causal: bool = False,
        key_mask: Tensor | None = None,
        context: Tensor | None = None,
        context_mask: Tensor | None = None,
        cache: KVCache | StateCache | RecurrentCache | None = None,
        cross_cache: KVCache | None = None,
        positions: Tensor | None = None,
        document_ids: Tensor | None = None,
    ) -> Tensor:
        """``x (B, N, D)`` -> ``(B, N, D)``; ``context (B, M, D)`` feeds the cross-attention;
        ``document_ids (B, N)`` packs documents (attention blocks only)."""
        h = self.sublayer_input(self.norm1, x)  # (B, N, D)
        if self.recurrent is not None and document_ids is not None:
            raise ValueError(f"document_ids: packed sequences need self-attention blocks; this block "
                             f"has mixer={self.mixer!r} (allowed: mixer='attention')")
        if self.recurrent is not None:
            if cache is not None and not isinstance(cache, RecurrentCache):
                raise ValueError(f"cache: a block with mixer={self.mixer!r} needs its RecurrentCache")
            out = self.recurrent(h, causal=causal, key_mask=key_mask, cache=cache)  # (B, N, D)
        else:
            out = self.self_attn(h, causal=causal, key_mask=key_mask, cache=cache, positions=positions,
                                 document_ids=document_ids)
        x = self.residual(self.norm1, x, out)
        if self.cross_attn is not None:
            if context is None and (cross_cache is None or cross_cache.k is None):
                raise ValueError("context: a block with cross-attention needs the encoder memory")
            h = self.sublayer_input(self.norm_cross, x)
            out = self.cross_attn(h, context, key_mask=context_mask, cache=cross_cache)
            x = self.residual(self.norm_cross, x, out)
        return self.ffn_sublayer(x)

    def forward_last(
        self, x: Tensor, *, causal: bool = False, key_mask: Tensor | None = None,
        positions: Tensor | None = None,
    ) -> Tensor:
        """Single-output block (Hedegaard et al.): only the last position's output, ``(B, N, D) -> (B, 1, D)``."""
        self._attention_only("forward_last")
        q, k, v = self.self_attention_inputs(x, x[:, -1:], positions=positions)  # q (B, H, 1, Dh)
        return self.finish(x[:, -1:], q, k, v, causal=causal, key_mask=key_mask)

def make_blocks(
    config: ModelConfig,
    num_layers: int,
    attention: str,
    attention_params: dict[str, Any],
    cross_attention: str | None = None,
    *,
    causal: bool | None = None,
) -> nn.ModuleList:
    """``num_layers`` blocks of ``config``'s sizes and style with self-attention ``attention(**attention_params)``
    and optionally cross-attention. ``causal`` (None: ``config.needs_causal``) sets a recurrent mixer's direction."""
    causal = config.needs_causal if causal is None else causal
    return nn.ModuleList(
        TransformerBlock(
            config.d_model,
            config.num_heads,
            config.d_ff,
            attention=attention,
            attention_params=attention_params,
            kernel=config.attention_kernel,
            cross_attention=cross_attention,
            activation=config.activation,
            norm=config.norm,
            dropout=config.dropout,
            mixer=config.mixer,
            causal=causal,
            rope=config.position == "rope",
            num_kv_heads=config.num_kv_heads,
        )
        for _ in range(num_layers)
    )
