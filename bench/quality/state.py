"""The bytes one layer keeps per sequence to answer at a row's length, measured on the layer's own decoding cache
(docs/quality.md, "Recall against state"; Arora et al. 2023, "Zoology")."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from models.attention import KVCache, MultiHeadAttention, StateCache, cache_policy
from models.blocks import TransformerBlock
from models.recurrent import RecurrentMixer

#: the tasks whose rows carry ``state_bytes`` and ``state_rule`` (recall: what decides them is the state)
STATE_TASKS = ("recall", "mqar")
#: how a row's bytes were found: the head of its ``state_rule``
KV_ALL, KV_BAND, DECODING_STATE, RECURRENT, NONE = (
    "kv_cache(all keys)", "kv_cache(band)", "decoding_state", "recurrent_state", "none")


@dataclass(frozen=True)
class StateSize:
    """What one layer keeps per sequence after ``seq_len`` tokens: ``nbytes`` (None: nothing to count), the
    ``rule`` that found it (one of the names above) and a line saying what was counted."""

    nbytes: int | None
    rule: str
    detail: str

    def columns(self) -> dict[str, Any]:
        """The row's ``state_bytes`` and ``state_rule``."""
        return {"state_bytes": self.nbytes, "state_rule": f"{self.rule}: {self.detail}"}


def _tensors(value: Any, depth: int = 0) -> Iterator[Tensor]:
    """The tensors a decoding state holds: its attributes, in plain containers, never a module's parameters."""
    if isinstance(value, Tensor):
        yield value
    elif isinstance(value, nn.Module) or depth > 3:
        return
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item, depth + 1)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item, depth + 1)
    elif hasattr(value, "__dict__") and not callable(value):
        for item in vars(value).values():
            yield from _tensors(item, depth + 1)


def held_bytes(state: Any) -> tuple[int, list[tuple[int, ...]]]:
    """Bytes of the distinct tensors ``state`` holds, and their shapes."""
    seen: dict[int, Tensor] = {}
    for tensor in _tensors(state):
        seen.setdefault(id(tensor), tensor)
    return (sum(t.numel() * t.element_size() for t in seen.values()),
            [tuple(t.shape) for t in seen.values()])


def _inputs(layer: MultiHeadAttention, seq_len: int) -> tuple[Tensor, Tensor, Tensor]:
    """Seeded ``q (1, H, N, Dh)``, ``k, v (1, H_kv, N, Dh)`` in the layer's dtype and device (global RNG untouched)."""
    weight = layer.q_proj.weight
    generator = torch.Generator().manual_seed(0)

    def draw(heads: int) -> Tensor:
        return torch.randn(1, heads, seq_len, layer.head_dim, generator=generator).to(weight.device, weight.dtype)

    return draw(layer.num_heads), draw(layer.num_kv_heads), draw(layer.num_kv_heads)


def _kv_why(layer: MultiHeadAttention, keep_first: int, keep_last: int | None) -> str:
    """Why the cache keeps what it keeps (``cache_policy``'s reading of the attention)."""
    attention = layer.attention
    if keep_last is not None:
        band = attention.band()
        assert band is not None
        return (f"band: {keep_first} global + window {band.window} x dilation {band.dilation} + the "
                "newest token")
    if attention.band() is not None:
        return "band with globals and a score term: every key kept, as the decoder does"
    if not getattr(attention, "exact", True):
        return "an approximation with no decoding state: its keys at full length"
    return "no band: the decoder keeps every key"


@torch.no_grad()
def attention_state(layer: MultiHeadAttention, seq_len: int) -> StateSize:
    """The state of the cache ``layer.new_cache()`` builds (a KV cache trimmed by ``cache_policy``, or the
    attention's ``new_decoding_state()``) after ``seq_len`` tokens: its tensors measured."""
    q, k, v = _inputs(layer, seq_len)
    cache = layer.new_cache()
    if isinstance(cache, StateCache):
        cache.step(q, k, v)  # causal: the state after every token, however it was fed
        nbytes, shapes = held_bytes(cache.state)
        held = ", ".join(str(s) for s in shapes) or "none"
        return StateSize(nbytes if shapes else None, DECODING_STATE,
                         f"{type(cache.state).__name__} tensors {held} after {seq_len} tokens")
    assert isinstance(cache, KVCache)
    cache.update(k, v)
    kept = (cache.k, cache.v)  # (1, H_kv, T, Dh): what is kept, not the buffer's spare capacity
    nbytes = sum(t.numel() * t.element_size() for t in kept)
    keep_first, keep_last = cache_policy(layer.attention)
    size = k.element_size()
    detail = (f"2 x {cache.length} of {seq_len} tokens x {layer.num_kv_heads} key heads x "
              f"{layer.head_dim} dims x {size} B ({_kv_why(layer, keep_first, keep_last)})")
    return StateSize(nbytes, KV_ALL if keep_last is None else KV_BAND, detail)


@torch.no_grad()
def recurrent_state(mixer: RecurrentMixer, seq_len: int) -> StateSize:
    """The final state an ``nn.LSTM`` / ``nn.GRU`` mixer holds after ``seq_len`` tokens (``h``, and ``c``)."""
    rnn = mixer.rnn
    weight = rnn.weight_ih_l0
    x = torch.randn(1, seq_len, mixer.d_model, generator=torch.Generator().manual_seed(0))
    _, final = rnn(x.to(weight.device, weight.dtype))
    nbytes, shapes = held_bytes(final)
    parts = "h and c" if isinstance(final, tuple) else "h"
    directions = 2 if rnn.bidirectional else 1
    return StateSize(nbytes, RECURRENT,
                     f"{mixer.kind} {parts} {shapes}: {directions} direction(s) x {rnn.hidden_size} "
                     f"units x {weight.element_size()} B")


def layer_state(layer: nn.Module, seq_len: int) -> StateSize:
    """The state of one self-attention or recurrent layer after ``seq_len`` tokens."""
    if isinstance(layer, RecurrentMixer):
        return recurrent_state(layer, seq_len)
    if isinstance(layer, MultiHeadAttention):
        return attention_state(layer, seq_len)
    raise TypeError(f"layer: must be a MultiHeadAttention or a RecurrentMixer; got {type(layer).__name__}")


def model_state(model: nn.Module, seq_len: int) -> StateSize:
    """The state of ``model``'s first block's token mixer (every block of a task's model has the same one)."""
    block = next((m for m in model.modules() if isinstance(m, TransformerBlock)), None)
    if block is None:
        return StateSize(None, NONE, f"{type(model).__name__} has no transformer block to ask")
    mixer = block.self_attn if block.recurrent is None else block.recurrent
    return layer_state(mixer, seq_len)


def state_columns(task: str, seq_len: int, model: nn.Module) -> dict[str, Any]:
    """A trained row's ``state_bytes`` and ``state_rule`` on a :data:`STATE_TASKS` task, else nothing."""
    return model_state(model, seq_len).columns() if task in STATE_TASKS else {}


def reference_state_columns(task: str) -> dict[str, Any]:
    """A computed reference's columns on a :data:`STATE_TASKS` task: no bytes, and why."""
    if task not in STATE_TASKS:
        return {}
    return StateSize(None, NONE, "a computed reference: no layers and no decoding state").columns()
