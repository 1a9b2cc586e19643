"""Nystromformer: convergence to full attention, exactness at m >= N, padding, pinv."""

from __future__ import annotations

import itertools

import pytest
import torch

from attn import create_attention
from attn.kernels.reference import dense_attention
from attn.variants.nystrom import iterative_pinv, segment_means


def inputs(n: int, seed: int = 0, batch: int = 2):
    gen = torch.Generator().manual_seed(seed)
    # low-rank-ish, smooth sequences (as in real data) so landmarks can summarise them
    base = torch.randn(batch, 2, 8, 16, generator=gen, dtype=torch.float64)
    mix = torch.randn(n, 8, generator=gen, dtype=torch.float64).softmax(-1)
    smooth = torch.einsum("nm,bhmd->bhnd", mix, base)  # (B, H, N, D)
    q = smooth + 0.05 * torch.randn(batch, 2, n, 16, generator=gen, dtype=torch.float64)
    k = smooth + 0.05 * torch.randn(batch, 2, n, 16, generator=gen, dtype=torch.float64)
    v = torch.randn(batch, 2, n, 16, generator=gen, dtype=torch.float64)
    return q, k, v


@pytest.mark.parametrize("n", [50, 61])  # neither divisible by most m
def test_error_falls_as_landmarks_grow_and_is_exact_at_n(n: int) -> None:
    q, k, v = inputs(n)
    full = dense_attention(q, k, v)
    errors = []
    for m in (2, 4, 8, 16, 32, n):
        att = create_attention("nystrom", num_landmarks=m).double()
        errors.append(float((att(q, k, v) - full).abs().max()))
    assert errors[-1] < 1e-12  # m >= N: exact attention
    assert att.last_path.path.startswith("exact")
    assert all(b <= a * 1.05 for a, b in itertools.pairwise(errors)), errors
    assert errors[-2] < 0.5 * errors[0], errors


def textbook_nystrom(q, k, v, m: int, iters: int = 6):
    """The paper's formula written out with materialised matrices (equal segments, no mask)."""
    b, h, n, d = q.shape
    q, k = q * d**-0.25, k * d**-0.25
    q_land = q.view(b, h, m, n // m, d).mean(3)
    k_land = k.view(b, h, m, n // m, d).mean(3)
    kernel_1 = torch.softmax(q @ k_land.transpose(-1, -2), -1)
    kernel_2 = torch.softmax(q_land @ k_land.transpose(-1, -2), -1)
    kernel_3 = torch.softmax(q_land @ k.transpose(-1, -2), -1)
    return kernel_1 @ iterative_pinv(kernel_2, iters) @ kernel_3 @ v


@pytest.mark.parametrize("n", [48, 61])  # equal segments (reshape means) and uneven ones (scatter)
def test_fused_and_masked_paths_agree_with_the_formula(n: int) -> None:
    """Unmasked calls run the N-sized products through SDPA (m keys / m queries); an all-True
    key_mask takes the materialised path. Both give the paper's formula, values and gradients."""
    q, k, v = (x.requires_grad_() for x in inputs(n))
    att = create_attention("nystrom", num_landmarks=8).double()
    fused = att(q, k, v)
    assert "via SDPA" in att.last_path.path
    masked = att(q, k, v, key_mask=torch.ones(2, n, dtype=torch.bool))
    assert "materialised" in att.last_path.path
    torch.testing.assert_close(fused, masked, atol=1e-12, rtol=0)
    if n % 8 == 0:
        torch.testing.assert_close(fused, textbook_nystrom(q, k, v, 8), atol=1e-12, rtol=0)
    weight = torch.randn_like(fused)
    grads = torch.autograd.grad((fused * weight).sum(), (q, k, v))
    ref_grads = torch.autograd.grad((masked * weight).sum(), (q, k, v))
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, atol=1e-10, rtol=0)


def grouped_inputs(kv_heads: int, q_len: int, k_len: int, dtype: torch.dtype, seed: int = 0):
    """Smooth q (2, 4, Nq, 16) and k (2, H_kv, Nk, 16) as in :func:`inputs`, v (2, H_kv, Nk, 16)."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(2, 1, 8, 16, generator=gen, dtype=torch.float64)

    def smooth(n: int, heads: int):
        mix = torch.randn(n, 8, generator=gen, dtype=torch.float64).softmax(-1)
        noise = torch.randn(2, heads, n, 16, generator=gen, dtype=torch.float64)
        return 2 * torch.einsum("nm,bhmd->bhnd", mix, base.expand(2, heads, 8, 16)) + 0.3 * noise

    v = torch.randn(2, kv_heads, k_len, 16, generator=gen, dtype=torch.float64)
    return [x.to(dtype).requires_grad_() for x in (smooth(q_len, 4), smooth(k_len, kv_heads), v)]


def previous_formulation(q, k, v, m: int, iters: int = 6):
    """The formulation the SDPA path replaces, in float64 with dense softmax matmuls:
    softmax(Q K~^T) pinv(softmax(Q~ K~^T)) softmax(Q~ K^T) V, Q and K scaled by D^-1/4, the
    landmarks the means of the m segments (position n in segment n*m // N), k and v repeated
    per group."""
    q, k, v = q.double(), k.double(), v.double()
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)  # (B, H, Nk, .)

    def landmarks(x):
        n = x.shape[2]
        member = (torch.arange(n) * m // n == torch.arange(m)[:, None]).double()  # (m, N)
        return member @ x / member.sum(-1, keepdim=True)  # (B, H, m, D)

    scale = q.shape[-1] ** -0.25
    q, k = q * scale, k * scale
    q_land, k_land = landmarks(q), landmarks(k)
    kernel_1 = torch.softmax(q @ k_land.transpose(-1, -2), -1)  # (B, H, Nq, m)
    kernel_2 = torch.softmax(q_land @ k_land.transpose(-1, -2), -1)  # (B, H, m, m)
    kernel_3 = torch.softmax(q_land @ k.transpose(-1, -2), -1)  # (B, H, m, Nk)
    return kernel_1 @ iterative_pinv(kernel_2, iters) @ kernel_3 @ v


#: largest error allowed, as a fraction of the reference's largest magnitude: float32 rounding
#: (measured ~1.5e-6), bf16 rounding (measured up to ~7e-3 forward, ~2e-2 gradients: the
#: SDPA outputs are rounded to bf16 and the pseudo-inverse amplifies it, about 2-3x full
#: attention's bf16 error)
SDPA_PATH_TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 5e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize(("q_len", "k_len"), [(75, 75), (52, 75)])  # N not a multiple of m = 8
def test_sdpa_path_matches_the_previous_formulation(dtype, kv_heads, q_len, k_len, monkeypatch) -> None:
    """The unmasked path runs its two N-sized products through SDPA in the input dtype, the
    keys as given (no copy for grouped heads); values and gradients equal the float64 dense
    formulation within the input dtype's rounding."""
    sdpa_calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(query, key, value, *args, **kwargs):
        sdpa_calls.append((query.dtype, key.dtype, value.dtype, key.data_ptr(), key.shape))
        return sdpa(query, key, value, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    q, k, v = grouped_inputs(kv_heads, q_len, k_len, dtype)
    att = create_attention("nystrom", num_landmarks=8)
    out = att(q, k, v)  # (B, H, Nq, Dv)
    assert "softmax products via SDPA, input dtype" in att.last_path.path
    assert out.dtype == dtype
    # the m query landmarks over the N keys (k itself), the N queries over the m key landmarks
    assert [call[:3] for call in sdpa_calls] == [(dtype,) * 3] * 2
    assert sdpa_calls[0][3:] == (k.data_ptr(), k.shape)
    ref = previous_formulation(q.detach(), k.detach(), v.detach(), m=8)
    out_tol, grad_tol = SDPA_PATH_TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), ref, atol=out_tol * float(ref.abs().max()), rtol=0)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    grads = torch.autograd.grad((out.double() * weight).sum(), (q, k, v))
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref_grads = torch.autograd.grad((previous_formulation(*leaves, m=8) * weight).sum(), leaves)
    for g, r in zip(grads, ref_grads):
        assert g.dtype == dtype
        torch.testing.assert_close(g.double(), r, atol=grad_tol * float(r.abs().max()), rtol=0)


def test_exact_when_n_smaller_than_landmarks() -> None:
    q, k, v = inputs(10)
    key_mask = torch.ones(2, 10, dtype=torch.bool)
    key_mask[1, 6:] = False
    att = create_attention("nystrom", num_landmarks=64).double()
    torch.testing.assert_close(att(q, k, v, key_mask=key_mask), dense_attention(q, k, v, key_mask=key_mask),
                               atol=1e-12, rtol=0)


def test_padding_never_leaks_with_n_not_divisible_by_m() -> None:
    n, m = 29, 8  # N padded to 32 inside: 3 padded slots plus key_mask padding
    q, k, v = inputs(n)
    key_mask = torch.ones(2, n, dtype=torch.bool)
    key_mask[0, 20:] = False
    key_mask[1, 3] = False
    att = create_attention("nystrom", num_landmarks=m).double()
    out = att(q, k, v, key_mask=key_mask)
    pad = ~key_mask[:, None, :, None]
    k2 = torch.where(pad, torch.randn_like(k) * 10, k)
    v2 = torch.where(pad, torch.randn_like(v) * 10, v)
    q2 = torch.where(pad, torch.randn_like(q) * 10, q)  # self-attention: padded queries too
    out2 = att(q2, k2, v2, key_mask=key_mask)
    real = key_mask[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out2[real], out[real], atol=1e-12, rtol=0)


def test_segment_means_spread_padding_and_exclude_masked() -> None:
    x = torch.arange(10, dtype=torch.float64).view(1, 1, 10, 1)
    # 10 positions into 4 segments: sizes 3, 2, 3, 2 -> [0,1,2] [3,4] [5,6,7] [8,9]
    means, ok = segment_means(x, 4, None)
    torch.testing.assert_close(means.flatten(), torch.tensor([1.0, 3.5, 6.0, 8.5], dtype=torch.float64))
    valid = torch.tensor([[True] * 7 + [False] * 3])  # masked keys 7, 8, 9
    means, ok = segment_means(x, 4, valid)
    torch.testing.assert_close(means.flatten(), torch.tensor([1.0, 3.5, 5.5, 0.0], dtype=torch.float64))
    assert ok.flatten().tolist() == [True, True, True, False]


def test_iterative_pinv_matches_linalg_pinv() -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(3, 8, 8, generator=gen, dtype=torch.float64).softmax(-1)
    z = iterative_pinv(a, iters=20)
    torch.testing.assert_close(z, torch.linalg.pinv(a), atol=1e-8, rtol=1e-6)


def test_causal_is_refused_with_a_clear_error() -> None:
    att = create_attention("nystrom", num_landmarks=4)
    q = torch.randn(1, 2, 16, 8)
    with pytest.raises(NotImplementedError, match=r"nystrom.*causal"):
        att(q, q, q, causal=True)


def test_conv_skip_needs_heads_and_changes_output() -> None:
    with pytest.raises(ValueError, match="num_heads"):
        create_attention("nystrom", num_landmarks=4, conv_kernel=3)
    q, k, v = inputs(20)
    plain = create_attention("nystrom", num_landmarks=4).double()
    conv = create_attention("nystrom", num_landmarks=4, conv_kernel=3, num_heads=2).double()
    assert sum(p.numel() for p in conv.parameters()) == 2 * 3
    assert (conv(q, k, v) - plain(q, k, v)).abs().max() > 0


def test_conv_skip_declares_that_it_needs_self_attention() -> None:
    from attn import AttentionCall

    conv = create_attention("nystrom", num_landmarks=4, conv_kernel=3, num_heads=2)
    any_length = AttentionCall("cpu", torch.float64)
    decode = AttentionCall("cpu", torch.float64, q_len=1, k_len=20, head_dim=16)
    assert conv.not_supported_reasons(any_length) == []
    assert conv.not_supported_reasons(AttentionCall("cpu", torch.float64, q_len=20, k_len=20)) == []
    (reason,) = conv.not_supported_reasons(decode)
    assert "conv_kernel=3 needs self-attention (Nq == Nk); got Nq=1, Nk=20" in reason
    assert create_attention("nystrom", num_landmarks=4).not_supported_reasons(decode) == []
    q, k, v = inputs(20)
    conv = conv.double()
    conv(q, k, v)  # auto remembers native for this call description; the decode call is refused
    with pytest.raises(NotImplementedError, match=r"needs self-attention \(Nq == Nk\); got Nq=1, Nk=20"):
        conv(q[:, :, :1], k, v)
