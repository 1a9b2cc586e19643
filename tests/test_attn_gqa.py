"""Grouped-query attention (k, v with H_kv < H heads): the contract, the helpers, every CPU
kernel against the reference with k, v repeated per group, what the paths say, and plug-ins
that declare no support."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from attn import AttentionCall, PlainModuleAttention, create_attention
from attn.conformance.grouped import check_grouped_query
from attn.gqa import expand_kv, grouped_scores, grouped_values
from attn.kernels.reference import dense_attention

CPU = torch.device("cpu")


def qkv(heads: int = 4, kv_heads: int = 2, nq: int = 37, nk: int = 37, dtype=torch.float64):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, heads, nq, 8, generator=gen, dtype=dtype)
    k = torch.randn(2, kv_heads, nk, 8, generator=gen, dtype=dtype)
    v = torch.randn(2, kv_heads, nk, 8, generator=gen, dtype=dtype)
    return q, k, v


def repeated(x: Tensor, heads: int) -> Tensor:
    return x.repeat_interleave(heads // x.shape[1], dim=1)


# ---- the contract ---------------------------------------------------------------------------


def test_kv_heads_must_divide_the_query_heads() -> None:
    att = create_attention("sliding_window", window=2)
    q, k, v = qkv(heads=4, kv_heads=3)
    pattern = (r"sliding_window: arguments 'k', 'v' must have q's batch B and H_kv heads dividing q's H "
               r"\(H % H_kv == 0\); got q \(B, H\) = \(2, 4\), k/v \(B, H_kv\) = \(2, 3\)")
    with pytest.raises(ValueError, match=pattern):
        att(q, k, v)
    q, k, v = qkv(heads=4, kv_heads=2)
    with pytest.raises(ValueError, match=r"'k' and 'v' must share batch and key heads \(B, H_kv\); "
                                         r"got \(2, 2\) and \(2, 1\)"):
        att(q, k, v[:, :1])
    with pytest.raises(ValueError, match=r"got q \(B, H\) = \(2, 4\), k/v \(B, H_kv\) = \(1, 2\)"):
        att(q, k[:1], v[:1])


def test_call_description_counts_query_heads_per_key_head() -> None:
    q, k, v = qkv(heads=8, kv_heads=2)
    call = AttentionCall.from_tensors(q, k, v)
    assert call.kv_groups == 4
    assert "4 query heads per key head (GQA)" in call.describe()
    assert AttentionCall.from_tensors(q, q, q).kv_groups == 1


# ---- the helpers ----------------------------------------------------------------------------


def test_expand_is_a_view_for_mqa_and_a_copy_otherwise() -> None:
    _, k, _ = qkv(heads=4, kv_heads=1)
    view = expand_kv(k, 4)  # (B, 4, N, D)
    assert view.data_ptr() == k.data_ptr() and view.stride(1) == 0
    torch.testing.assert_close(view, repeated(k, 4), rtol=0, atol=0)
    _, k2, _ = qkv(heads=4, kv_heads=2)
    copy = expand_kv(k2, 4)
    assert copy.data_ptr() != k2.data_ptr()
    torch.testing.assert_close(copy, repeated(k2, 4), rtol=0, atol=0)  # head h reads key head h // 2


def test_grouped_products_equal_the_repeated_ones() -> None:
    q, k, v = qkv(heads=6, kv_heads=2)
    scores = grouped_scores(q, k)  # (B, 6, Nq, Nk)
    torch.testing.assert_close(scores, q @ repeated(k, 6).transpose(-1, -2), rtol=0, atol=1e-12)
    probs = scores.softmax(-1)
    torch.testing.assert_close(grouped_values(probs, v), probs @ repeated(v, 6), rtol=0, atol=1e-12)


# ---- every CPU kernel against the repeated reference ----------------------------------------

CASES = [
    ("full", {}, "reference", "grouped"),
    ("full", {}, "sdpa", "native enable_gqa"),
    ("full", {}, "chunked", "grouped"),
    ("sliding_window", {"window": 3}, "blocked", "native (the streams of a group read its key head"),
    ("sliding_window", {"window": 3}, "sdpa", "native enable_gqa"),
    ("dilated", {"window": 2, "dilation": (1, 2)}, "blocked", "native"),
    ("global_tokens", {"num_global": 2, "window": 3}, "blocked", "native"),
    ("relative", {"bias": "learned", "max_distance": 8}, "chunked", "grouped"),
    ("relative", {"bias": "alibi"}, "sdpa", "native enable_gqa"),
    ("nystrom", {"num_landmarks": 4}, "native", "grouped (q folded per key head, keys read once)"),
]


@pytest.mark.parametrize(("name", "params", "kernel", "how"), CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("kv_heads", [2, 1], ids=["gqa", "mqa"])
def test_kernel_matches_the_reference_with_repeated_heads(name, params, kernel, how, kv_heads) -> None:
    torch.manual_seed(0)
    att = create_attention(name, kernel=kernel, num_heads=4, **params).double()
    for p in att.parameters():
        p.data.normal_()
    q, k, v = (t.requires_grad_() for t in qkv(kv_heads=kv_heads, nq=35, nk=37))
    key_mask = torch.rand(2, 37, generator=torch.Generator().manual_seed(1)) > 0.2
    causal = att.supports_causal
    out = att(q, k, v, causal=causal, key_mask=key_mask if att.exact else None)  # (B, 4, Nq, Dv)
    path = att.last_path.path
    ref_q, ref_k, ref_v = (t.detach().requires_grad_() for t in (q, k, v))
    if att.exact:
        ref = dense_attention(ref_q, repeated(ref_k, 4), repeated(ref_v, 4), mask_mod=att.mask_mod(),
                              score_mod=att.score_mod(), causal=causal, key_mask=key_mask)
    else:  # an approximation: itself on the repeated heads
        ref = att(ref_q, repeated(ref_k, 4), repeated(ref_v, 4))
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)
    weight = torch.randn(out.shape, dtype=out.dtype)
    (out * weight).sum().backward()
    (ref * weight).sum().backward()
    for got, expected in ((q.grad, ref_q.grad), (k.grad, ref_k.grad), (v.grad, ref_v.grad)):
        assert got.shape == expected.shape  # k, v gradients (B, H_kv, Nk, D): summed over the group
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-9)
    kind = "GQA 4/2" if kv_heads == 2 else "MQA 4/1"
    assert f"{kind} heads: {how}" in path


@pytest.mark.parametrize("kv_heads", [2, 1], ids=["gqa", "mqa"])
@pytest.mark.parametrize("n", [37, 3], ids=["landmarks", "dense"])
def test_nystrom_reads_grouped_key_heads_under_padding(kv_heads: int, n: int) -> None:
    """Nystrom's masked path (padded keys, Nq == Nk) and its exact dense path (N <= m) with
    grouped key heads equal the same module on the heads repeated, values and gradients."""
    torch.manual_seed(0)
    att = create_attention("nystrom", num_landmarks=4, num_heads=4).double()
    q, k, v = (t.requires_grad_() for t in qkv(kv_heads=kv_heads, nq=n, nk=n))
    key_mask = torch.ones(2, n, dtype=torch.bool)
    key_mask[1, -2:] = False
    out = att(q, k, v, key_mask=key_mask)
    path = att.last_path.path
    ref_q, ref_k, ref_v = (t.detach().requires_grad_() for t in (q, k, v))
    ref = att(ref_q, repeated(ref_k, 4), repeated(ref_v, 4), key_mask=key_mask)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)
    weight = torch.randn(out.shape, dtype=out.dtype)
    (out * weight).sum().backward()
    (ref * weight).sum().backward()
    for got, expected in ((q.grad, ref_q.grad), (k.grad, ref_k.grad), (v.grad, ref_v.grad)):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-9)
    how = "grouped (q folded per key head" if n > 4 else "k/v"
    assert how in path


def test_blocked_reads_the_key_heads_in_place_across_chunks() -> None:
    """Long enough for interior (view) and edge (copied) chunks of several streams per key head,
    dilated residues and global columns: forward and gradients against the repeated reference."""
    att = create_attention("global_tokens", num_global=3, window=8, kernel="blocked").double()
    q, k, v = (t.requires_grad_() for t in qkv(heads=4, kv_heads=1, nq=160, nk=160))
    out = att(q, k, v, causal=True)
    ref_k, ref_v = (t.detach().requires_grad_() for t in (k, v))
    ref = dense_attention(q.detach(), repeated(ref_k, 4), repeated(ref_v, 4), mask_mod=att.mask_mod(),
                          causal=True)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)
    out.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(k.grad, ref_k.grad, rtol=0, atol=1e-9)
    torch.testing.assert_close(v.grad, ref_v.grad, rtol=0, atol=1e-9)


# ---- plug-ins: declared support, and the kit ------------------------------------------------


class EqualHeadsOnly(nn.Module):
    """Full attention written for k, v with q's heads (declares nothing about GQA)."""

    exact = True

    def forward(self, q, k, v, *, causal=False, key_mask=None):
        return dense_attention(q, k, v, causal=causal, key_mask=key_mask)


class TiledHeads(nn.Module):
    """Declares GQA but gives query head h the key head h % H_kv (tiled, not grouped): wrong."""

    exact = True
    supports_gqa = True

    def forward(self, q, k, v, *, causal=False, key_mask=None):
        groups = q.shape[1] // k.shape[1]
        return dense_attention(q, k.repeat(1, groups, 1, 1), v.repeat(1, groups, 1, 1), causal=causal,
                               key_mask=key_mask)


class GroupedHeads(TiledHeads):
    """Declares GQA and groups the heads as the contract says."""

    def forward(self, q, k, v, *, causal=False, key_mask=None):
        return dense_attention(q, expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1]), causal=causal,
                               key_mask=key_mask)


def test_a_plain_module_without_gqa_support_is_refused_before_it_runs() -> None:
    att = PlainModuleAttention(EqualHeadsOnly(), name="equal_heads")
    q, k, v = qkv(heads=4, kv_heads=2)
    with pytest.raises(NotImplementedError, match=r"equal_heads: arguments 'k', 'v' must have q's 4 heads; "
                                                  r"got 2: equal_heads does not support grouped-query"):
        att(q, k, v)
    call = AttentionCall.from_tensors(q, k, v)
    assert att.not_supported_reasons(call) == [
        "equal_heads does not support grouped-query attention (k, v with fewer heads than q)"]
    [result] = check_grouped_query(att, "native", {}, CPU, 0)
    assert result.status == "skip" and result.message.startswith("GQA: not supported")


def test_the_kit_fails_a_module_that_groups_the_heads_wrongly_and_passes_the_right_one() -> None:
    [wrong] = check_grouped_query(PlainModuleAttention(TiledHeads(), name="tiled", num_heads=4), "native",
                                  {}, CPU, 0)
    assert wrong.status == "fail"
    assert "differ from the reference with k, v repeated per group" in wrong.message
    assert "H_kv=2" in wrong.message
    [right] = check_grouped_query(PlainModuleAttention(GroupedHeads(), name="grouped", num_heads=4), "native",
                                  {}, CPU, 0)
    assert right.status == "pass", right.message
