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
    """Self-attention, optional cross-attention, FFN; each sublayer with a residual.

    ``norm="post"`` (Vaswani et al. 2017): ``x = LayerNorm(x + Sublayer(x))``.
    ``norm="pre"``: ``x = x + Sublayer(LayerNorm(x))`` (the model adds a final LayerNorm).

    ``mixer="lstm"`` / ``"gru"`` puts a :class:`~models.recurrent.RecurrentMixer` (LSTM:
    Hochreiter & Schmidhuber 1997; GRU: Cho et al. 2014) where the self-attention would be
    (``self_attn`` is then None and ``recurrent`` holds the layer); residual, norms and FFN
    stay as they are. Its direction is fixed by ``causal``: unidirectional for a causal
    (decoder) block, bidirectional otherwise, and a call must pass the same ``causal``.
    Cross-attention stays attention: a recurrent encoder-decoder keeps attention over the
    encoder memory, the arrangement of Bahdanau et al. 2015. ``attention`` and
    ``attention_params`` are unused by a recurrent block. The step-wise seams
    (:meth:`self_attention_inputs`, :meth:`finish`, :meth:`forward_last`, which streaming
    uses) need per-token keys and values, so a recurrent block refuses them.

    ``rope=True`` rotates the self-attention's queries and keys by their absolute positions
    (RoPE, :class:`~models.attention.RotaryEmbedding`); the cross-attention is never rotated
    (encoder memory and target are not on one position axis). ``positions (B|1, N)`` in the
    calls below are the tokens' absolute positions (default ``0 .. N-1``, or the cache's
    offset onwards); without RoPE they are unused.
    """

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
        """An empty KV cache for this block's self-attention (sized by its pattern), or the
        recurrent state cache of a (causal) recurrent block."""
        if self.recurrent is not None:
            return self.recurrent.new_cache()
        return self.self_attn.new_cache()

    def _attention_only(self, method: str) -> MultiHeadAttention:
        """The self-attention, or a ValueError naming ``mixer`` for a recurrent block."""
        if self.self_attn is None:
            raise ValueError(
                f"mixer: {method}() needs a self-attention block; this block has mixer={self.mixer!r}"
            )
        return self.self_attn

    def new_cross_cache(self) -> KVCache:
        """An empty static cache for the cross-attention, filled once from the memory."""
        if self.cross_attn is None:
            raise ValueError("cross_attention: this block has no cross-attention to cache")
        return self.cross_attn.new_cache(static=True)

    # sublayer plumbing: what goes into a sublayer and how its output is added back
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
        """Per-head ``q`` of ``query_x`` (default ``x``) and ``k, v`` of ``x``, block inputs
        ``(B, N, D)`` -> ``(B, H, N, Dh)``: what the self-attention computes from each token
        alone, so a caller may cache them per token. With RoPE they are rotated by
        ``positions (B|1, N)`` of ``x``'s tokens (default ``0 .. N-1``); ``query_x`` holds the
        last tokens of ``x``. Attention blocks only."""
        self_attn = self._attention_only("self_attention_inputs")
        h = self.sublayer_input(self.norm1, x)
        query_h = h if query_x is None else self.sublayer_input(self.norm1, query_x)
        return self_attn.project(query_h, h, positions=positions)

    def finish(
        self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False,
        key_mask: Tensor | None = None,
    ) -> Tensor:
        """The block's output at the queries' positions from per-head ``q (B, H, Nq, Dh)``,
        ``k, v (B, H, Nk, Dh)`` (see :meth:`self_attention_inputs`) and the block input there,
        ``x (B, Nq, D)``: self-attention, residual, FFN -> ``(B, Nq, D)``. Blocks without
        cross-attention and with self-attention only."""
        self_attn = self._attention_only("finish")
        if self.cross_attn is not None:
            raise ValueError("cross_attention: finish() runs blocks without cross-attention only")
        out = self_attn.attend(q, k, v, causal=causal, key_mask=key_mask)  # (B, Nq, D)
        return self.ffn_sublayer(self.residual(self.norm1, x, out))

    def finish_heads(self, x: Tensor, heads: Tensor) -> Tensor:
        """As :meth:`finish`, from the self-attention's per-head outputs ``heads (B, H, Nq, Dh)``
        computed elsewhere (streaming's retroactive update): output projection, residual,
        FFN -> ``(B, Nq, D)``."""
        self_attn = self._attention_only("finish_heads")
        if self.cross_attn is not None:
            raise ValueError("cross_attention: finish_heads() runs blocks without cross-attention only")
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
        ``document_ids (B, N)`` packs documents in the self-attention (attention blocks only).

        A recurrent block needs ``causal`` to match its direction (ValueError naming
        ``mixer`` otherwise) and, with ``cache``, takes only the new tokens."""
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
        """Single-output block: only the last position's output, ``(B, N, D) -> (B, 1, D)``.

        Keys and values come from every position, the query only from the last one, and
        the FFN runs on one token (Continual single-output attention, Hedegaard et al.).
        Attention blocks only.
        """
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
    """``num_layers`` blocks of ``config``'s sizes, style and kernel, with self-attention
    ``attention(**attention_params)`` and, given ``cross_attention``, a cross-attention sublayer.
    The one builder every model kind uses.

    With a recurrent ``config.mixer`` the blocks' recurrent layer runs causally (one
    direction) when ``causal`` is True, both directions when False; None means
    ``config.needs_causal``. Attention blocks take ``causal`` per call and ignore it here.
    ``config.position == "rope"`` gives every self-attention rotary positions."""
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
