"""Relative position biases: learned (clipped offsets) and ALiBi, alone and composed with masks."""

from __future__ import annotations

import math

import torch

from attn import create_attention
from attn.kernels.reference import dense_attention
from attn.mods import dense_allowed
from attn.position_bias import alibi_slopes


def test_learned_bias_has_one_scalar_per_head_per_clipped_offset() -> None:
    att = create_attention("relative", bias="learned", max_distance=5, num_heads=3)
    assert sum(p.numel() for p in att.parameters()) == 3 * (2 * 5 + 1)


def test_learned_bias_values_and_clipping() -> None:
    heads, m = 2, 3
    att = create_attention("relative", bias="learned", max_distance=m, num_heads=heads).double()
    with torch.no_grad():
        att.position_bias.table.copy_(torch.arange(heads * (2 * m + 1), dtype=torch.float64).view(heads, -1))
    q = torch.zeros(1, heads, 10, 4, dtype=torch.float64)  # zero scores: softmax of the bias alone
    k = torch.zeros(1, heads, 10, 4, dtype=torch.float64)
    v = torch.eye(10, dtype=torch.float64).expand(1, heads, 10, 10)
    probs = att(q, k, v)  # (1, H, N, N): the attention weights themselves
    table = att.position_bias.table
    for h in range(heads):
        for i in range(10):
            bias = torch.stack([table[h, max(-m, min(m, j - i)) + m] for j in range(10)])
            torch.testing.assert_close(probs[0, h, i], torch.softmax(bias, 0), atol=1e-12, rtol=0)
    # offsets beyond M share the clipped value
    assert probs[0, 0, 0, 5] == probs[0, 0, 0, 9]


def test_alibi_slopes_are_geometric() -> None:
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(k + 1) for k in range(8)]))
    slopes = alibi_slopes(6)  # not a power of two: 4 from the 4-head set, 2 interleaved from the 8-head set
    torch.testing.assert_close(slopes[:4], alibi_slopes(4))
    torch.testing.assert_close(slopes[4:], alibi_slopes(8)[0::2][:2])


def test_alibi_bias_value() -> None:
    heads = 4
    att = create_attention("relative", bias="alibi", num_heads=heads).double()
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, 7, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    slopes = alibi_slopes(heads).double().view(1, heads, 1, 1)
    pos = torch.arange(7, dtype=torch.float64)
    scores = q @ k.transpose(-1, -2) / 2.0 - slopes * (pos.view(-1, 1) - pos.view(1, -1)).abs()
    expected = torch.softmax(scores, -1) @ v
    torch.testing.assert_close(att(q, k, v), expected, atol=1e-12, rtol=0)


def test_bias_composes_with_a_mask_variant() -> None:
    """sliding_window + ALiBi = the window mask and the ALiBi term together."""
    heads = 2
    att = create_attention("sliding_window", window=2, position_bias="alibi", num_heads=heads, kernel="sdpa")
    att = att.double()
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, heads, 9, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(9, dtype=torch.float64)
    dist = (pos.view(-1, 1) - pos.view(1, -1)).abs()
    scores = q @ k.transpose(-1, -2) / math.sqrt(4) - alibi_slopes(heads).double().view(1, heads, 1, 1) * dist
    scores = scores.masked_fill(dist > 2, float("-inf"))
    torch.testing.assert_close(att(q, k, v), torch.softmax(scores, -1) @ v, atol=1e-12, rtol=0)
    assert att.last_path.mask_emulated


def test_learned_bias_gets_gradients() -> None:
    att = create_attention("relative", bias="learned", max_distance=2, num_heads=2)
    q, k, v = (torch.randn(1, 2, 6, 4) for _ in range(3))
    att(q, k, v, causal=True).square().sum().backward()
    grad = att.position_bias.table.grad
    assert grad is not None and torch.isfinite(grad).all()
    # causal: offsets j - i > 0 are never used, so their entries get no gradient
    assert grad[:, 3:].abs().max() == 0 and grad[:, :3].abs().max() > 0


def test_dense_reference_with_score_mod_only() -> None:
    att = create_attention("relative", bias="alibi", num_heads=2)
    assert dense_allowed(att.mask_mod(), batch=1, heads=2, q_len=3, k_len=3, causal=False,
                         key_mask=None, device=torch.device("cpu")) is None
    q, k, v = (torch.randn(1, 2, 3, 4) for _ in range(3))
    out = dense_attention(q, k, v, score_mod=att.score_mod())
    torch.testing.assert_close(out, att(q, k, v))
