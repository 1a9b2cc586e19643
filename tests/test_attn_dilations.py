"""Per-head dilations of ``dilated`` (Longformer's mix): ``dilation=(r_0, ..., r_{k-1})`` gives
head h the rate ``r_{h // (H // k)}``.

Every kernel is checked against a mask written out by hand, one head at a time (not the
variant's own mask_mod), values and gradients; the int form is unchanged; the parameter
checks name ``dilation`` and ``num_heads``; the cost counts each head's own pairs.
"""

from __future__ import annotations

import math

import pytest
import torch

from attn import Band, attention_info, create_attention
from attn.call import AttentionCall
from attn.cost import CostQuery, allowed_pairs, band_pairs, counted_head_pairs, head_pairs
from attn.kernels import get_kernel
from attn.kernels.blocked import banded_attention, blocked_attention, key_span_attention
from attn.mods import dense_allowed
from attn.registry import check_attention_params

CPU = torch.device("cpu")


def rate_of(rates: tuple[int, ...], heads: int, h: int) -> int:
    return rates[h // (heads // len(rates))]


def hand_mask(rates: tuple[int, ...], window: int, heads: int, q_len: int, k_len: int, causal: bool,
              key_mask: torch.Tensor | None = None, batch: int = 1) -> torch.Tensor:
    """``(B, H, Nq, Nk)`` bool, one (head, query, key) at a time from the rule of docs/variants.md."""
    allowed = torch.zeros(batch, heads, q_len, k_len, dtype=torch.bool)
    for b in range(batch):
        for h in range(heads):
            r = rate_of(rates, heads, h)
            for row in range(q_len):
                i = k_len - q_len + row  # bottom-right aligned
                for j in range(k_len):
                    ok = (i - j) % r == 0 and abs(i - j) <= r * window
                    ok = ok and (j <= i or not causal)
                    ok = ok and (key_mask is None or bool(key_mask[b, j]))
                    allowed[b, h, row, j] = ok
    return allowed


def hand_attention(q, k, v, allowed: torch.Tensor) -> torch.Tensor:
    """Softmax over the allowed keys only, written directly; a row with no key gives zeros."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~allowed, float("-inf"))
    has_key = allowed.any(-1, keepdim=True)
    probs = torch.softmax(scores.masked_fill(~has_key, 0.0), dim=-1).masked_fill(~has_key, 0.0)
    return probs @ v


def qkv(batch, heads, q_len, k_len, dtype=torch.float32, dim=8, v_dim=8, seed=0, grad=False):
    gen = torch.Generator().manual_seed(seed)
    tensors = [torch.randn(batch, heads, n, d, generator=gen, dtype=torch.float64).to(dtype)
               for n, d in ((q_len, dim), (k_len, dim), (k_len, v_dim))]
    return [t.requires_grad_(grad) for t in tensors]


def key_mask_of(batch: int, k_len: int, seed: int = 5) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(batch, k_len, generator=gen) > 0.3
    mask[:, 0] = True
    mask[-1, k_len - 4:] = False
    return mask


CPU_KERNELS = ("reference", "sdpa", "chunked", "blocked", "flex")
GRAD_KERNELS = ("reference", "sdpa", "chunked", "blocked")  # flex has no CPU backward


# -- the mask itself ---------------------------------------------------------------------------


@pytest.mark.parametrize(("rates", "heads"), [((1, 2), 4), ((1, 3), 2), ((2, 1, 3), 6), ((1, 2, 1), 3)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("q_len", "k_len"), [(13, 13), (5, 13), (15, 9)])
def test_mask_mod_matches_the_hand_written_mask_per_head(rates, heads, causal, q_len, k_len) -> None:
    module = create_attention("dilated", window=2, dilation=rates, num_heads=heads)
    assert module.mask_depends_on_head()
    got = dense_allowed(module.mask_mod(), batch=1, heads=heads, q_len=q_len, k_len=k_len,
                        causal=causal, key_mask=None, device=CPU)
    assert torch.equal(got.expand(1, heads, q_len, k_len), hand_mask(rates, 2, heads, q_len, k_len, causal))


def test_groups_are_contiguous_heads() -> None:
    """(1, 2) with 4 heads: heads 0, 1 undilated, heads 2, 3 dilation 2."""
    mod = create_attention("dilated", window=1, dilation=(1, 2), num_heads=4).mask_mod()
    t = torch.tensor
    for h, rate in enumerate((1, 1, 2, 2)):
        allowed = [d for d in range(-6, 7) if bool(mod(t(0), t(h), t(10), t(10 - d)))]
        assert allowed == [-rate, 0, rate], h


# -- every CPU kernel against the hand-written mask --------------------------------------------


#: flex compiles per call shape (~20-50 s each on CPU): two of the four (causal, key_mask) cases
CASES = [pytest.param(kernel, causal, masked, marks=[pytest.mark.compile] if kernel == "flex" else [])
         for kernel in CPU_KERNELS for causal in (False, True) for masked in (False, True)
         if kernel != "flex" or causal == masked]


@pytest.mark.parametrize(("kernel", "causal", "masked"), CASES)
def test_every_cpu_kernel_matches_the_hand_written_mask(kernel, causal, masked) -> None:
    rates, heads, window = (1, 2), 4, 2
    module = create_attention("dilated", window=window, dilation=rates, num_heads=heads, kernel=kernel)
    shapes = [(37, 37), (7, 37)] if kernel != "flex" else [(37, 37)]  # flex compiles per shape
    for q_len, k_len in shapes:
        q, k, v = qkv(2, heads, q_len, k_len)
        key_mask = key_mask_of(2, k_len) if masked else None
        with torch.no_grad():
            out = module(q, k, v, causal=causal, key_mask=key_mask)
        allowed = hand_mask(rates, window, heads, q_len, k_len, causal, key_mask, batch=2)
        want = hand_attention(q.double(), k.double(), v.double(), allowed)
        assert out.dtype == torch.float32
        torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=0)
        assert module.last_path.kernel == kernel
        if kernel == "flex":  # one block mask per head, compiled (no eager fallback)
            assert module.last_path.path == "flex_attention(compiled), block mask per head"
            assert module.last_path.fallback is None


@pytest.mark.parametrize("kernel", GRAD_KERNELS)
@pytest.mark.parametrize("causal", [False, True])
def test_gradients_of_every_cpu_kernel(kernel, causal) -> None:
    rates, heads, window = (1, 3), 4, 2
    module = create_attention("dilated", window=window, dilation=rates, num_heads=heads, kernel=kernel).double()
    for q_len, k_len, masked in ((41, 41, True), (41, 41, False), (5, 41, True)):
        q, k, v = qkv(2, heads, q_len, k_len, dtype=torch.float64, grad=True, seed=q_len)
        key_mask = key_mask_of(2, k_len) if masked else None
        out = module(q, k, v, causal=causal, key_mask=key_mask)
        want = hand_attention(q, k, v, hand_mask(rates, window, heads, q_len, k_len, causal, key_mask, batch=2))
        torch.testing.assert_close(out, want, atol=1e-10, rtol=0)
        weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=out.dtype)
        grads = torch.autograd.grad((out * weight).sum(), (q, k, v))
        ref_grads = torch.autograd.grad((want * weight).sum(), (q, k, v))
        for name, got, ref in zip("qkv", grads, ref_grads):
            assert torch.isfinite(got).all(), name
            torch.testing.assert_close(got, ref, atol=1e-9, rtol=0, msg=f"d{name} ({kernel})")


def test_flex_declares_no_cpu_backward() -> None:
    module = create_attention("dilated", window=2, dilation=(1, 2), num_heads=4, kernel="flex")
    call = AttentionCall(CPU, torch.float32, False, True, has_key_mask=False)
    assert any("backward" in reason for reason in module.not_supported_reasons(call))


def test_blocked_fp32_backward_and_the_path_names_the_groups() -> None:
    rates, heads = (1, 2), 4
    module = create_attention("dilated", window=2, dilation=rates, num_heads=heads, kernel="blocked")
    q, k, v = qkv(1, heads, 33, 33, grad=True)
    out = module(q, k, v, causal=True)
    want = hand_attention(q, k, v, hand_mask(rates, 2, heads, 33, 33, True))
    torch.testing.assert_close(out, want, atol=1e-5, rtol=0)
    for got, ref in zip(torch.autograd.grad(out.sum(), (q, k, v)), torch.autograd.grad(want.sum(), (q, k, v))):
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)
    path = module.last_path
    assert not path.mask_emulated and path.fallback is None
    assert path.path.startswith("per-head dilation groups")
    assert "heads 0-1: banded blocks (w=2)" in path.path and "heads 2-3: banded blocks (w=2, residues r=2)" in path.path


def test_blocked_decoding_and_more_queries_than_keys() -> None:
    """One-block calls take the key span per group; Nq > Nk rows at negative positions stay exact."""
    rates, heads = (2, 1), 2
    module = create_attention("dilated", window=3, dilation=rates, num_heads=heads, kernel="blocked").double()
    for q_len, k_len in ((1, 50), (3, 50), (45, 23)):
        q, k, v = qkv(2, heads, q_len, k_len, dtype=torch.float64)
        for causal in (False, True):
            out = module(q, k, v, causal=causal)
            want = hand_attention(q, k, v, hand_mask(rates, 3, heads, q_len, k_len, causal, batch=2))
            torch.testing.assert_close(out, want, atol=1e-10, rtol=0)
        if q_len <= 3:
            assert "key span" in module.last_path.path


def test_non_adjacent_groups_of_one_rate() -> None:
    """(1, 2, 1) with 6 heads: three runs of heads, the first and last with the same rate."""
    rates, heads = (1, 2, 1), 6
    band = create_attention("dilated", window=2, dilation=rates, num_heads=heads).band()
    assert [(h0, h1, b.dilation) for h0, h1, b in band.head_groups(heads)] == [(0, 2, 1), (2, 4, 2), (4, 6, 1)]
    q, k, v = qkv(1, heads, 30, 30, dtype=torch.float64)
    out = blocked_attention(q, k, v, band, causal=False)
    torch.testing.assert_close(out, hand_attention(q, k, v, hand_mask(rates, 2, heads, 30, 30, False)),
                               atol=1e-10, rtol=0)


@pytest.mark.parametrize("bias", ["learned", "alibi"])
@pytest.mark.parametrize("kernel", ["blocked", "sdpa", "chunked"])
def test_a_position_bias_sees_the_true_head_index(bias, kernel) -> None:
    """The blocked kernel runs head groups as slices: its score_mod must still get h of the
    whole tensor (heads 2-3 are heads 2-3 of the bias table, not 0-1)."""
    params = dict(window=2, dilation=(1, 2), num_heads=4, position_bias=bias, max_distance=5)
    module = create_attention("dilated", kernel=kernel, **params).double()
    ref = create_attention("dilated", kernel="reference", **params).double()
    ref.load_state_dict(module.state_dict())
    if bias == "learned":
        with torch.no_grad():
            module.position_bias.table.normal_(0, 1, generator=torch.Generator().manual_seed(9))
            ref.position_bias.table.copy_(module.position_bias.table)
    q, k, v = qkv(2, 4, 40, 40, dtype=torch.float64, grad=True)
    out, want = module(q, k, v, causal=True), ref(q, k, v, causal=True)
    torch.testing.assert_close(out, want, atol=1e-10, rtol=0)
    wanted = [q, k, v, *module.parameters()]
    grads = torch.autograd.grad(out.sum(), wanted)
    ref_grads = torch.autograd.grad(want.sum(), [q, k, v, *ref.parameters()])
    for got, exp in zip(grads, ref_grads):
        torch.testing.assert_close(got, exp, atol=1e-9, rtol=0)


def test_sdpa_builds_one_cached_mask_per_head() -> None:
    module = create_attention("dilated", window=2, dilation=(1, 2), num_heads=4, kernel="sdpa")
    q, k, v = qkv(1, 4, 21, 21)
    module(q, k, v)
    assert module.last_path.path == "sdpa(cached float mask per head)"
    assert module.last_path.setup_bytes == 4 * 21 * 21 * 4  # (1, H, N, N) fp32, no empty rows
    uniform = create_attention("dilated", window=2, dilation=2, num_heads=4, kernel="sdpa")
    uniform(q, k, v)
    assert uniform.last_path.path == "sdpa(cached float mask)"
    assert uniform.last_path.setup_bytes == 21 * 21 * 4  # (1, 1, N, N): shared by the heads


# -- the int form and its equal tuples ---------------------------------------------------------


@pytest.mark.parametrize("kernel", ["reference", "sdpa", "chunked", "blocked"])
def test_int_and_equal_tuples_are_the_same_attention(kernel) -> None:
    q, k, v = qkv(2, 4, 29, 29)
    key_mask = key_mask_of(2, 29)
    outs = []
    for dilation in (3, (3,), [3], (3, 3), (3, 3, 3, 3)):
        module = create_attention("dilated", window=2, dilation=dilation, num_heads=4, kernel=kernel)
        assert not module.mask_depends_on_head()
        assert module.band() == Band(2, 3)
        outs.append(module(q, k, v, causal=True, key_mask=key_mask))
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], atol=0, rtol=0)


def test_each_group_equals_the_int_variant_on_its_heads() -> None:
    q, k, v = qkv(2, 4, 31, 31)
    mixed = create_attention("dilated", window=2, dilation=(1, 4), num_heads=4, kernel="blocked")(q, k, v)
    for heads, rate in ((slice(0, 2), 1), (slice(2, 4), 4)):
        alone = create_attention("dilated", window=2, dilation=rate, kernel="blocked")
        torch.testing.assert_close(mixed[:, heads], alone(q[:, heads], k[:, heads], v[:, heads]),
                                   atol=1e-6, rtol=0)


def test_int_form_is_unchanged() -> None:
    module = create_attention("dilated", window=2, dilation=3)
    assert module.dilation == 3 and module.band() == Band(2, 3) and not module.band().per_head
    assert "dilation=3," in repr(module)


def test_a_yaml_list_becomes_a_tuple() -> None:
    module = create_attention("dilated", window=2, dilation=[1, 2], num_heads=4)
    assert module.dilation == (1, 2)
    assert "dilation=(1, 2)" in repr(module)
    assert module.band() == Band(2, 2, 0, (1, 2))


# -- parameter checks --------------------------------------------------------------------------


@pytest.mark.parametrize(("params", "pattern"), [
    ({"dilation": 0}, r"^dilated: parameter 'dilation': must be an integer >= 1; got 0$"),
    ({"dilation": (1, 0), "num_heads": 4},
     r"^dilated: parameter 'dilation': must be an integer >= 1 or a list of them; got 0$"),
    ({"dilation": [2, -1], "num_heads": 4}, r"parameter 'dilation': must be an integer >= 1 or a list of them; got -1"),
    ({"dilation": (1, 2.5), "num_heads": 4}, r"parameter 'dilation': .* got 2.5"),
    ({"dilation": (1, True), "num_heads": 4}, r"parameter 'dilation': .* got True"),
    ({"dilation": [], "num_heads": 4}, r"^dilated: parameter 'dilation': must not be empty$"),
    ({"dilation": (1, 2), "num_heads": 3},
     r"^dilated: parameter 'num_heads': must be divisible by the 2 head groups of parameter 'dilation' "
     r"\(dilation=\(1, 2\): one rate per group\); got 3$"),
    ({"dilation": (1, 2, 3), "num_heads": 4},
     r"'num_heads': must be divisible by the 3 head groups of parameter 'dilation'"),
    ({"dilation": (1, 2)}, r"^dilated: parameter 'num_heads' is required with dilation=\(1, 2\) "
                           r"\(parameter 'dilation' gives one rate per head group\)$"),
])
def test_bad_dilations_are_named(params, pattern) -> None:
    with pytest.raises(ValueError, match=pattern):
        create_attention("dilated", window=2, **params)
    with pytest.raises(ValueError, match=pattern):  # the same rule, without building a module
        check_attention_params("dilated", window=2, **params)


def test_good_dilations_pass_the_check_without_building() -> None:
    check_attention_params("dilated", window=2, dilation=(1, 2), num_heads=4)
    check_attention_params("dilated", window=2, dilation=[1, 2, 3], num_heads=6)
    check_attention_params("dilated", window=2, dilation=2)


def test_band_rules() -> None:
    assert Band.per_head_groups(3, (2, 2)) == Band(3, 2)
    band = Band.per_head_groups(3, (1, 4))
    assert band == Band(3, 4, 0, (1, 4)) and band.per_head and band.dilation == 4  # the reach
    assert band.head_dilations(4) == (1, 1, 4, 4)
    with pytest.raises(ValueError, match="'dilation' must be max"):
        Band(3, 2, 0, (1, 4))
    with pytest.raises(ValueError, match="3 heads are not divisible into the 2 head groups"):
        band.head_groups(3)
    q, k, v = qkv(1, 4, 9, 9)
    with pytest.raises(ValueError, match="per-head band"):
        banded_attention(q, k, v, band, causal=False, q_offset=0, key_mask=None, score_mod=None,
                         block=None, chunk=None)
    with pytest.raises(ValueError, match="per-head band"):
        key_span_attention(q, k, v, band, causal=False, q_offset=0, key_mask=None, score_mod=None)


def test_xformers_refuses_per_head_dilations_with_a_reason() -> None:
    module = create_attention("dilated", window=2, dilation=(1, 2), num_heads=4)
    call = AttentionCall(torch.device("cuda"), torch.float16, False, False, has_key_mask=False)
    reasons = get_kernel("xformers").not_supported_reasons(module.pattern(), call)
    assert any("per-head dilations" in reason for reason in reasons)


def test_attention_info_describes_the_per_head_form() -> None:
    info = attention_info("dilated")
    assert "per head group" in info.description
    assert {"window": 2, "dilation": (1, 2)} in info.example_params


# -- cost: each head's own pairs ---------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("q_len", "k_len"), [(37, 37), (64, 64), (9, 37), (40, 23)])
def test_the_blocked_modules_cost_counts_the_masks_allowed_pairs(causal, q_len, k_len) -> None:
    rates, heads, window, batch, dim, v_dim = (1, 3), 4, 2, 2, 8, 6
    module = create_attention("dilated", window=window, dilation=rates, num_heads=heads, kernel="blocked")
    per_head = hand_mask(rates, window, heads, q_len, k_len, causal).sum(dim=(0, 2, 3))  # (H,)
    cost = module.cost(CostQuery(batch, heads, q_len, k_len, dim, v_dim, causal))
    total = int(per_head.sum())
    assert cost.kind == "useful"
    assert cost.fwd == 2 * batch * total * (dim + v_dim)
    assert cost.bwd == round(2.5 * cost.fwd)
    assert cost.pairs == pytest.approx(total / heads)
    assert head_pairs(module.pattern(), q_len, k_len, causal, heads) == tuple(int(p) for p in per_head)
    assert allowed_pairs(module.pattern(), q_len, k_len, causal) == pytest.approx(total / heads)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [1, 7, 33, 64])
def test_per_head_closed_form_matches_counting(causal, n) -> None:
    module = create_attention("dilated", window=3, dilation=(1, 2, 5), num_heads=6)
    band = module.band()
    closed = tuple(band_pairs(group, n, causal) for h0, h1, group in band.head_groups(6) for _ in range(h0, h1))
    pattern = module.pattern()
    assert closed == counted_head_pairs(pattern, n, n, causal, 6) == head_pairs(pattern, n, n, causal, 6)
    with pytest.raises(ValueError, match="one count per head"):
        band_pairs(band, n, causal)


def test_uniform_cost_is_unchanged_by_the_tuple_form() -> None:
    query = CostQuery.self_attention(2, 4, 50, 16, causal=True)
    int_cost = create_attention("dilated", window=3, dilation=2).cost(query)
    assert create_attention("dilated", window=3, dilation=(2, 2), num_heads=4).cost(query) == int_cost
    assert isinstance(int_cost.pairs, int)
