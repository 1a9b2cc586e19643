"""Variant semantics against hand-written rules (docs/variants.md), at the exact boundary indices.

The dense reference is itself checked against a per-query loop that builds each softmax
from an explicit list of allowed keys, so the ground truth is not taken on trust.
"""

from __future__ import annotations

import math

import pytest
import torch

from attn import create_attention
from attn.mods import dense_allowed


def rule(name: str, params: dict, i: int, j: int, causal: bool) -> bool:
    """The rules of docs/variants.md, written out literally."""
    if name in ("full", "relative"):
        ok = True
    elif name == "causal":
        ok, causal = True, True
    elif name == "sliding_window":
        ok = abs(i - j) <= params["window"]
    elif name == "dilated":
        r, w = params["dilation"], params["window"]
        ok = (i - j) % r == 0 and abs(i - j) <= r * w
    elif name == "global_tokens":
        g, w = params["num_global"], params["window"]
        ok = i < g or j < g or abs(i - j) <= w
    else:
        raise AssertionError(name)
    return ok and (j <= i if causal else True)


PATTERNS = [
    ("full", {}),
    ("causal", {}),
    ("sliding_window", {"window": 0}),
    ("sliding_window", {"window": 1}),
    ("sliding_window", {"window": 4}),
    ("dilated", {"window": 2, "dilation": 2}),
    ("dilated", {"window": 1, "dilation": 3}),
    ("dilated", {"window": 3, "dilation": 1}),
    ("global_tokens", {"num_global": 2, "window": 1}),
    ("global_tokens", {"num_global": 0, "window": 2}),
]


@pytest.mark.parametrize(("name", "params"), PATTERNS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("q_len", "k_len"), [(11, 11), (4, 11), (1, 9), (13, 7)])
def test_mask_matches_literal_rule(name, params, causal, q_len, k_len) -> None:
    att = create_attention(name, **params)
    allowed = dense_allowed(
        att.mask_mod(), batch=1, heads=1, q_len=q_len, k_len=k_len,
        causal=causal or att.forces_causal, key_mask=None, device=torch.device("cpu"),
    )
    allowed = torch.ones(q_len, k_len, dtype=torch.bool) if allowed is None else allowed[0, 0]
    for row in range(q_len):
        i = k_len - q_len + row  # bottom-right alignment
        for j in range(k_len):
            assert bool(allowed[row, j]) == rule(name, params, i, j, causal), (row, i, j)


def test_window_boundary_is_inclusive() -> None:
    """|i - j| == w is allowed and w + 1 is not: where '<=' and '<' differ."""
    mod = create_attention("sliding_window", window=3).mask_mod()
    t = torch.tensor
    assert bool(mod(t(0), t(0), t(10), t(7))) and bool(mod(t(0), t(0), t(7), t(10)))
    assert not bool(mod(t(0), t(0), t(10), t(6))) and not bool(mod(t(0), t(0), t(6), t(10)))


def test_dilation_boundary() -> None:
    """Dilated w=2, r=3: offsets 0, 3, 6 allowed; 9 (= r*w + r) and non-multiples are not."""
    mod = create_attention("dilated", window=2, dilation=3).mask_mod()
    t = torch.tensor
    allowed = [d for d in range(-12, 13) if bool(mod(t(0), t(0), t(20), t(20 - d)))]
    assert allowed == [-6, -3, 0, 3, 6]


def test_global_boundary() -> None:
    """g=2: positions 0 and 1 are global, position 2 is not."""
    mod = create_attention("global_tokens", num_global=2, window=1).mask_mod()
    t = torch.tensor
    assert bool(mod(t(0), t(0), t(1), t(30))) and bool(mod(t(0), t(0), t(30), t(1)))
    assert not bool(mod(t(0), t(0), t(2), t(30))) and not bool(mod(t(0), t(0), t(30), t(2)))


def loop_attention(q, k, v, allowed_fn, key_mask) -> torch.Tensor:
    """Per (b, h, row): softmax over an explicit list of allowed keys; zeros when none."""
    batch, heads, q_len, dim = q.shape
    k_len = k.shape[2]
    out = torch.zeros(batch, heads, q_len, v.shape[-1], dtype=q.dtype)
    for b in range(batch):
        for h in range(heads):
            for row in range(q_len):
                i = k_len - q_len + row
                keys = [j for j in range(k_len) if allowed_fn(i, j) and (key_mask is None or key_mask[b, j])]
                if not keys:
                    continue
                scores = torch.stack([q[b, h, row] @ k[b, h, j] / math.sqrt(dim) for j in keys])
                weights = torch.softmax(scores, dim=0)
                out[b, h, row] = sum(w * v[b, h, j] for w, j in zip(weights, keys))
    return out


@pytest.mark.parametrize(("name", "params"), PATTERNS[:6] + PATTERNS[8:9])
@pytest.mark.parametrize("causal", [False, True])
def test_reference_equals_per_query_loop(name, params, causal) -> None:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, 5, 4, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 2, 9, 4, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 2, 9, 3, generator=gen, dtype=torch.float64)
    key_mask = torch.tensor([[True] * 9, [True, False, True, True, False, True, True, False, False]])
    att = create_attention(name, kernel="reference", **params).double()
    out = att(q, k, v, causal=causal, key_mask=key_mask)
    expected = loop_attention(q, k, v, lambda i, j: rule(name, params, i, j, causal), key_mask)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("kernel", ["reference", "sdpa"])
def test_rows_without_keys_are_zero_not_nan(kernel) -> None:
    """Causal with Nq > Nk: the first rows sit before every key; an all-padding batch row too."""
    q = torch.randn(2, 2, 7, 4, requires_grad=True)
    k = torch.randn(2, 2, 4, 4, requires_grad=True)
    v = torch.randn(2, 2, 4, 4, requires_grad=True)
    key_mask = torch.tensor([[True, True, True, True], [False, False, False, False]])
    att = create_attention("sliding_window", window=1, kernel=kernel)
    out = att(q, k, v, causal=True, key_mask=key_mask)
    assert torch.isfinite(out).all()
    assert out[:, :, :3].abs().max() == 0  # positions -3..-1 have no key
    assert out[1].abs().max() == 0
    assert out[0, :, 3:].abs().max() > 0
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_causal_variant_forces_causal() -> None:
    q, k, v = (torch.randn(1, 2, 6, 4) for _ in range(3))
    forced = create_attention("causal")(q, k, v, causal=False)
    explicit = create_attention("full")(q, k, v, causal=True)
    torch.testing.assert_close(forced, explicit)


def test_sdpa_flags_mask_emulation() -> None:
    q, k, v = (torch.randn(1, 2, 6, 4) for _ in range(3))
    full = create_attention("full", kernel="sdpa")
    full(q, k, v, causal=True)
    assert full.last_path is not None and not full.last_path.mask_emulated
    assert "is_causal" in full.last_path.path
    window = create_attention("sliding_window", window=2, kernel="sdpa")
    window(q, k, v)
    assert window.last_path.mask_emulated
    # bottom-right causal with Nq < Nk cannot use SDPA's top-left is_causal
    full(q[:, :, :2], k, v, causal=True)
    assert full.last_path.mask_emulated
