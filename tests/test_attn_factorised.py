"""The factorised pattern on a token grid (attn/grid.py, attn/variants/factorised.py) and its
kernel (attn/kernels/factorised.py): definitions, exactness against the dense reference,
gradients, refusals, parameter errors, closed-form cost, and the kit's grid check."""

from __future__ import annotations

import pytest
import torch

from attn import create_attention
from attn.base import ExactAttention
from attn.conformance.grid import check_grid
from attn.cost import CostQuery, counted_pairs
from attn.grid import Grid, spatial_mod, temporal_mod
from attn.kernels.factorised import factorised_attention
from attn.kernels.reference import dense_attention
from attn.mods import dense_allowed
from attn.variants.factorised import FactorisedAttention


def _allowed(module, n: int) -> torch.Tensor:
    heads = module.num_heads or 1
    mask = dense_allowed(module.mask_mod(), batch=1, heads=heads, q_len=n, k_len=n, causal=False,
                         key_mask=None, device=torch.device("cpu"))
    return mask.expand(1, heads, n, n)[0]  # (H, N, N)


def test_mask_mods_follow_the_grid_by_hand() -> None:
    # 7 tokens, 3 per frame: frames {0,1,2} {3,4,5} {6}; positions i % 3
    spatial = _allowed(create_attention("factorised", axis="spatial", positions_per_frame=3), 7)[0]
    temporal = _allowed(create_attention("factorised", axis="temporal", positions_per_frame=3), 7)[0]
    assert spatial[4].nonzero().flatten().tolist() == [3, 4, 5]
    assert spatial[6].nonzero().flatten().tolist() == [6]  # the partial last frame
    assert temporal[4].nonzero().flatten().tolist() == [1, 4]
    assert temporal[0].nonzero().flatten().tolist() == [0, 3, 6]
    split = _allowed(create_attention("factorised", axis="split", positions_per_frame=3, num_heads=4), 7)
    assert torch.equal(split[0], spatial) and torch.equal(split[1], spatial)
    assert torch.equal(split[2], temporal) and torch.equal(split[3], temporal)


@pytest.mark.parametrize("axis", ["spatial", "temporal", "split"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("q_len", "k_len"), [(24, 24), (22, 22), (1, 23), (9, 24)])
def test_kernel_matches_the_dense_reference(axis: str, causal: bool, q_len: int, k_len: int) -> None:
    gen = torch.Generator().manual_seed(q_len * 100 + k_len)
    module = create_attention("factorised", axis=axis, positions_per_frame=4, num_heads=4, kernel="factorised")
    q = torch.randn(2, 4, q_len, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, 4, k_len, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    key_mask = torch.rand(2, k_len, generator=gen) > 0.3
    key_mask[1] = False  # a batch row with no real key: zeros
    for mask in (None, key_mask):
        out = module(q, k, v, causal=causal, key_mask=mask)
        ref = dense_attention(q, k, v, mask_mod=module.mask_mod(), causal=causal, key_mask=mask)
        assert float((out - ref).abs().max()) < 1e-12
    assert module.last_path.kernel == "factorised" and not module.last_path.mask_emulated


def test_gradients_match_the_reference() -> None:
    gen = torch.Generator().manual_seed(0)
    module = create_attention("factorised", axis="split", positions_per_frame=5, num_heads=2, kernel="factorised")
    q, k, v = (torch.randn(1, 2, 20, 8, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3))
    key_mask = torch.ones(1, 20, dtype=torch.bool)
    key_mask[0, 7] = False
    weight = torch.randn(1, 2, 20, 8, generator=gen, dtype=torch.float64)
    grads = torch.autograd.grad((module(q, k, v, causal=True, key_mask=key_mask) * weight).sum(), (q, k, v))
    ref = dense_attention(q, k, v, mask_mod=module.mask_mod(), causal=True, key_mask=key_mask)
    ref_grads = torch.autograd.grad((ref * weight).sum(), (q, k, v))
    for got, want in zip(grads, ref_grads):
        assert float((got - want).abs().max()) < 1e-12


def test_auto_prefers_the_factorised_kernel_and_others_stay_exact() -> None:
    module = create_attention("factorised", axis="temporal", positions_per_frame=8)
    q = torch.randn(1, 2, 64, 16)
    module(q, q, q)
    assert module.last_path.kernel == "factorised"
    assert "8 frames x 8 positions" in module.last_path.path
    assert {"reference", "sdpa", "chunked", "factorised"} <= set(module.supported_kernels())


def test_kernel_refusals_are_declared() -> None:
    module = create_attention("factorised", positions_per_frame=4, kernel="factorised")
    q = torch.randn(1, 1, 9, 8)
    k = torch.randn(1, 1, 5, 8)
    with pytest.raises(NotImplementedError, match="needs Nq <= Nk"):
        module(q, k, k)
    biased = create_attention("factorised", positions_per_frame=4, position_bias="alibi", num_heads=2)
    assert "factorised" not in biased.supported_kernels()  # a score term: the others run it


def test_parameter_errors_name_the_argument() -> None:
    with pytest.raises(ValueError, match="parameter 'axis': unknown value 'diagonal'"):
        create_attention("factorised", axis="diagonal")
    with pytest.raises(ValueError, match="parameter 'positions_per_frame': must be an integer >= 1; got 0"):
        create_attention("factorised", positions_per_frame=0)
    with pytest.raises(ValueError, match="parameter 'num_heads' is required with axis='split'"):
        create_attention("factorised", axis="split")
    with pytest.raises(ValueError, match=r"'num_heads': must be even with axis='split' \(half the heads .*; got 3"):
        create_attention("factorised", axis="split", num_heads=3)


def test_frames_fixes_the_grid_length() -> None:
    module = create_attention("factorised", positions_per_frame=4, frames=3)
    ok = torch.randn(1, 1, 12, 8)
    assert module(ok, ok, ok).shape == (1, 1, 12, 8)
    bad = torch.randn(1, 1, 13, 8)
    with pytest.raises(ValueError, match="argument 'k' has 13 keys but the grid is frames=3 x positions_per_frame=4"):
        module(bad, bad, bad)


@pytest.mark.parametrize("axis", ["spatial", "temporal", "split"])
@pytest.mark.parametrize("n", [16, 19])
@pytest.mark.parametrize("causal", [False, True])
def test_closed_form_cost_counts_the_allowed_pairs(axis: str, n: int, causal: bool) -> None:
    module = create_attention("factorised", axis=axis, positions_per_frame=4, num_heads=2)
    cost = module.cost(CostQuery.self_attention(1, 2, n, 8, causal))
    pattern = module.pattern()
    heads = [counted_pairs(pattern, n, n, causal)] if not pattern.per_head else None
    if heads is None:  # per head: count each head's mask
        allowed = _allowed(module, n)
        if causal:
            allowed = allowed & torch.ones(n, n, dtype=torch.bool).tril()
        heads = [int(allowed[h].sum()) for h in range(2)]
        assert cost.pairs == sum(heads) / 2
    else:
        assert cost.pairs == heads[0]


def test_factorised_is_o_n_s_plus_t() -> None:
    # N = 16 x 64: spatial S^2 per frame, temporal T^2 per position; far below N^2
    grid = Grid(64, ("spatial", "temporal"))
    spatial, temporal = grid.pairs(1024, causal=False)
    assert spatial == 1024 * 64 and temporal == 1024 * 16


class _WrongGrid(FactorisedAttention):
    """Declares its grid (temporal) but its mask_mod is spatial: the kit must say so."""

    def mask_mod(self):
        return spatial_mod(self.positions_per_frame)


def test_kit_fails_a_grid_that_its_mask_mod_does_not_match() -> None:
    good = create_attention("factorised", axis="split", positions_per_frame=4, num_heads=4)
    assert check_grid(good, {})[0].status == "pass"
    result = check_grid(_WrongGrid(axis="temporal", positions_per_frame=4, num_heads=4), {})[0]
    assert result.status == "fail" and "the declared grid" in result.message
    assert "mask_mod allows" in result.message


def test_function_form_runs_a_partial_frame() -> None:
    grid = Grid(5, ("spatial",))
    q = torch.randn(1, 1, 7, 4, dtype=torch.float64)
    out = factorised_attention(q, q, q, grid)
    # token 6 is alone in its (partial) frame with token 5: attends to {5, 6}
    ref = dense_attention(q, q, q, mask_mod=lambda b, h, i, j: (i // 5) == (j // 5))
    assert float((out - ref).abs().max()) < 1e-12


class _PluginGrid(ExactAttention):
    """A plug-in's own variant on a grid: it declares grid() and mask_mod, nothing else."""

    name = "plugin_grid"

    def mask_mod(self):
        return temporal_mod(3)

    def grid(self) -> Grid:
        return Grid(3, ("temporal",))


def test_a_plugin_variant_with_a_grid_gets_the_kernel() -> None:
    module = _PluginGrid()
    assert "factorised" in module.supported_kernels()
    module.kernel = "factorised"
    q = torch.randn(2, 2, 10, 4, dtype=torch.float64)
    ref = dense_attention(q, q, q, mask_mod=module.mask_mod(), causal=True)
    assert float((module(q, q, q, causal=True) - ref).abs().max()) < 1e-12
    assert check_grid(module, {})[0].status == "pass"


@pytest.mark.parametrize("kv_heads", [2, 1])
@pytest.mark.parametrize("axis", ["spatial", "temporal", "split"])
def test_factorised_kernel_takes_grouped_key_heads(axis, kv_heads) -> None:
    """k, v with fewer heads than q (GQA, MQA): the kernel equals the reference with k, v
    repeated per group, every head group (model 4's split too) reading its own key head."""
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(1, 4, 32, 8, generator=gen, dtype=torch.float64)  # (B, H, T*S, D)
    k, v = (torch.randn(1, kv_heads, 32, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    params = {"axis": axis, "positions_per_frame": 8, **({"num_heads": 4} if axis == "split" else {})}
    module = create_attention("factorised", kernel="factorised", **params)
    reference = create_attention("factorised", kernel="reference", **params)
    repeat = 4 // kv_heads
    expected = reference(q, k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1))
    torch.testing.assert_close(module(q, k, v), expected, rtol=0, atol=1e-12)
    assert ("MQA" if kv_heads == 1 else "GQA") in module.last_path.path
