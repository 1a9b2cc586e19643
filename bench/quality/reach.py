"""Which recall distances an attention pattern can answer at all, from its mask alone (docs/quality.md,
"Recall": one layer's flow ``A`` and ``R^l = A^l``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from attn import Attention, attention_info, create_attention
from attn.mods import MaskMod, dense_allowed
from attn.validation import invalid, require_int
from bench.quality.data import recall
from bench.quality.settings import MODEL_SIZE
from models.config import SIZES


def flow_matrix(attention: Attention | MaskMod | None, seq_len: int, *, heads: int = 1,
                causal: bool = False) -> Tensor:
    """One layer's flow ``A (N, N)`` bool, from a module, a mask_mod over ``heads`` heads, or ``None`` (all pairs)."""
    require_int("seq_len", seq_len, minimum=1)
    if isinstance(attention, Attention):
        heads = attention.num_heads or 1
        causal = causal or attention.forces_causal
        attention = attention.mask_mod()
    require_int("heads", heads, minimum=1)
    allowed = dense_allowed(attention, batch=1, heads=heads, q_len=seq_len, k_len=seq_len,
                            causal=causal, key_mask=None, device=torch.device("cpu"))
    if allowed is None:
        return torch.ones(seq_len, seq_len, dtype=torch.bool)
    flow = allowed[0].any(dim=0)  # (N, N): the union over heads
    return flow | torch.eye(seq_len, dtype=torch.bool)


def power_rows(flow: Tensor, rows: Tensor, power: int) -> Tensor:
    """Rows ``rows`` of ``A^power`` (``power >= 1``), computed from the rows alone."""
    gathered, as_float = flow[rows], flow.float()  # (R, N)
    for _ in range(power - 1):
        if bool(gathered.all()):
            break  # every position already gathered everything; A keeps i -> i, so it stays
        gathered = (gathered.float() @ as_float) > 0  # (R, N)
    return gathered


def pair_reachable(flow: Tensor, layers: int, *, keys: Tensor, values: Tensor,
                   query: int | None = None) -> Tensor:
    """Whether ``layers`` layers of ``flow`` bring each pair ``(keys[m], values[m])``, bound, to ``query`` (last)."""
    require_int("layers", layers, minimum=1)
    n = flow.shape[-1]
    query = n - 1 if query is None else query
    keys, values = torch.as_tensor(keys), torch.as_tensor(values)
    found = torch.zeros(keys.shape, dtype=torch.bool)
    if layers == 1:
        return found  # no layer is left to bind the pair before the query reads it
    to_query = torch.zeros(n, dtype=torch.bool)
    to_query[query] = True
    for rest in range(1, layers):  # rest = L - l layers from the meeting point to the query
        to_query = (to_query.float() @ flow.float()) > 0  # (N,): row `query` of A^rest
        meeting = torch.nonzero(to_query).squeeze(1)  # (P,): the p in R^rest(query)
        gathered = power_rows(flow, meeting, layers - rest)  # (P, N): R^l(p) of every such p
        found |= (gathered[:, keys] & gathered[:, values]).any(dim=0)
    return found


def answer_reachable(attention: Attention | MaskMod | None, *, layers: int, seq_len: int,
                     key: int, value: int, query: int | None = None, heads: int = 1) -> bool:
    """Whether ``layers`` layers of ``attention`` bring the pair at ``key``, ``value`` bound to ``query``."""
    for name, position in (("key", key), ("value", value), ("query", query)):
        if position is not None and not 0 <= position < seq_len:
            raise invalid(name, f"must be a position in [0, {seq_len - 1}]; got {position!r}")
    flow = flow_matrix(attention, seq_len, heads=heads)
    found = pair_reachable(flow, layers, keys=torch.tensor([key]), values=torch.tensor([value]),
                           query=query)
    return bool(found[0])


@dataclass(frozen=True)
class RecallReach:
    """Which recall distances a pattern can answer with the task's layout."""

    reachable: tuple[int, ...]  # the task's distances at which the answer is reachable
    reach: int | None  # the largest reachable d of every d in 2 .. largest; None if none is
    largest: int  # the largest distance the layout allows (seq_len - 1 - max gap)


def recall_reach(attention: Attention | MaskMod | None, *, seq_len: int, layers: int,
                 distances: Sequence[int] = (), pair_gap: int | Sequence[int] = 1,
                 heads: int = 1) -> RecallReach:
    """The recall distances ``layers`` layers of ``attention`` can answer (with several gaps: every gap)."""
    gaps = recall.pair_gaps(pair_gap)
    largest = recall.max_distance(seq_len, gaps)
    flow = flow_matrix(attention, seq_len, heads=heads)
    scan = torch.arange(2, largest + 1)  # (D,): every distance the layout allows
    keys = seq_len - 1 - scan
    ok = torch.ones(scan.shape, dtype=torch.bool)
    for gap in gaps:
        ok &= pair_reachable(flow, layers, keys=keys, values=keys - gap)
    hits = set(scan[ok].tolist())
    return RecallReach(reachable=tuple(d for d in distances if d in hits),
                       reach=max(hits) if hits else None, largest=largest)


def variant_recall_reach(variant: str, params: Mapping[str, Any],
                         settings: Mapping[str, Any]) -> RecallReach:
    """:func:`recall_reach` of ``variant(params)`` under a row's ``settings`` (:meth:`TaskSettings.to_dict`)."""
    data, model = settings.get("data", {}), {**SIZES[MODEL_SIZE], **settings.get("model", {})}
    allowed = attention_info(variant).params
    shared = {k: v for k, v in settings.get("attention", {}).items() if k in allowed}
    heads = int(model["num_heads"])
    module = create_attention(variant, num_heads=heads, head_dim=int(model["d_model"]) // heads,
                              **{**shared, **params})
    return recall_reach(module, seq_len=int(data["seq_len"]), layers=int(model["num_layers"]),
                        distances=tuple(data.get("distances", ())),
                        pair_gap=data.get("pair_gap", 1), heads=heads)
