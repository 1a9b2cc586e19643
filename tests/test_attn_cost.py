"""FLOPs come from the variant's cost hook: allowed pairs for exact variants (closed forms
checked against counting the mask), performed matmuls for Nystrom (checked against
PyTorch's FLOP counter on the real forward and backward)."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

import attn.cost
from attn import Attention, ExactAttention, create_attention, register_attention
from attn.cost import CostQuery, allowed_pairs, band_pairs, counted_pairs
from attn.devices import module_device
from attn.mods import dense_allowed
from attn.registry import unregister_attention
from bench.speed.flops import case_flops


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("name", "params"), [
    ("sliding_window", {"window": 3}), ("sliding_window", {"window": 40}),
    ("dilated", {"window": 2, "dilation": 3}), ("dilated", {"window": 20, "dilation": 2}),
    ("global_tokens", {"num_global": 2, "window": 1}),
    ("global_tokens", {"num_global": 50, "window": 5}),
])
@pytest.mark.parametrize("n", [1, 7, 33, 64])
def test_closed_form_pairs_match_counting_the_mask(name, params, causal, n):
    module = create_attention(name, **params)
    assert band_pairs(module.band(), n, causal) == counted_pairs(module.pattern(), n, n, causal)


@pytest.mark.parametrize(("q_len", "k_len"), [(1, 9), (5, 9), (9, 9), (12, 9)])
def test_causal_pairs_are_bottom_right_aligned(q_len, k_len):
    full = create_attention("full").pattern()
    assert allowed_pairs(full, q_len, k_len, True) == counted_pairs(full, q_len, k_len, True)


def test_useful_flops_of_exact_variants():
    assert allowed_pairs(create_attention("full").pattern(), 100, 100, False) == 100 * 100
    assert allowed_pairs(create_attention("causal").pattern(), 100, 100, False) == 100 * 101 // 2
    flops, kind, density = case_flops(create_attention("sliding_window", window=1), batch=2,
                                      heads=3, n=10, head_dim=8, causal=False)
    assert flops["fwd"] == 4 * 2 * 3 * (3 * 10 - 2) * 8 and kind == "useful"
    assert flops["bwd"] == 2.5 * flops["fwd"] and density == pytest.approx(28 / 100)
    cost = create_attention("full").cost(CostQuery(1, 2, 5, 7, 8, 4))
    assert cost.fwd == 2 * 2 * 5 * 7 * (8 + 4)  # Dv != D: 2 * P * (D + Dv)


def _sdpa_cpu_forward(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _sdpa_cpu_backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None,
                       **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


#: PyTorch's counter has formulas for the CUDA SDPA ops only; the CPU flash kernel's get the
#: same ones (scores and values forward; the recomputed scores and four products backward)
SDPA_CPU = {
    op: formula for op, formula in (
        (getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None), _sdpa_cpu_forward),
        (getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None),
         _sdpa_cpu_backward),
    ) if op is not None
}


def _counted(module, q, k, v, key_mask=None) -> tuple[int, int]:
    with FlopCounterMode(display=False, custom_mapping=SDPA_CPU) as forward:
        out = module(q, k, v, key_mask=key_mask)
    with FlopCounterMode(display=False, custom_mapping=SDPA_CPU) as backward:
        out.backward(torch.randn_like(out))
    return forward.get_total_flops(), backward.get_total_flops()


@pytest.mark.parametrize(("q_len", "k_len", "dim", "v_dim", "masked"), [
    (200, 200, 16, 16, False),  # the benchmarked path: softmax products through SDPA
    (96, 130, 8, 12, False),  # cross-attention shape, Dv != D: SDPA's math path on CPU
    (96, 130, 16, 16, False),  # cross-attention shape, SDPA's fused CPU kernel
    (120, 120, 16, 8, True),  # key_mask: the materialised (N, m) path
])
def test_nystrom_flops_equal_a_flop_counter_on_forward_and_backward(q_len, k_len, dim, v_dim,
                                                                    masked):
    module = create_attention("nystrom", num_landmarks=16, num_heads=2, head_dim=dim)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, q_len, dim, generator=gen, requires_grad=True)
    k = torch.randn(2, 2, k_len, dim, generator=gen, requires_grad=True)
    v = torch.randn(2, 2, k_len, v_dim, generator=gen, requires_grad=True)
    key_mask = torch.rand(2, k_len, generator=gen) > 0.2 if masked else None
    fwd, bwd = _counted(module, q, k, v, key_mask)
    cost = module.cost(CostQuery(2, 2, q_len, k_len, dim, v_dim, has_key_mask=masked))
    assert (cost.fwd, cost.bwd, cost.kind) == (fwd, bwd, "performed")


def test_nystrom_has_no_n_m_m_product():
    """The products associate to the right: doubling m at fixed N must not add an N*m^2 term."""
    def fwd(n, m):
        module = create_attention("nystrom", num_landmarks=m)
        return module.cost(CostQuery.self_attention(1, 1, n, 64)).fwd

    n = 16384
    linear_in_n = fwd(2 * n, 64) - fwd(n, 64)  # the N-proportional part for m = 64
    assert linear_in_n == 8 * n * 64 * 64  # 8 N m D: two products of two matmuls each


def test_a_plug_in_approximation_is_measured_by_its_own_cost_hook():
    @register_attention("halved_attention", overwrite=True)
    class Halved(Attention):
        """Test approximation that declares its own cost."""

        exact = False

        def native_forward(self, q, k, v, causal, key_mask):
            return v

        def cost(self, query):
            from attn.cost import Cost

            return Cost(fwd=123, bwd=456, kind="performed")

    try:
        flops, kind, density = case_flops(create_attention("halved_attention"), batch=1, heads=1,
                                          n=8, head_dim=4, causal=False)
    finally:
        unregister_attention("halved_attention")
    assert flops == {"fwd": 123, "bwd": 456, "fwd_bwd": 579} and kind == "performed"
    assert density == 1.0


# An exact variant's FLOPs are counted where its mask_mod's tensors live (attn.devices.module_device):
# a mask_mod indexing a buffer got `error` rows on CUDA; the module is moved to `meta` here.
class TableMasked(ExactAttention):
    """Each query block sees the key blocks a buffer lists for it (a mask_mod reading a tensor)."""

    name = "table_masked"

    def __init__(self, block: int = 4, **common) -> None:
        super().__init__(**common)
        self.block = block
        self.register_buffer("table", torch.tensor([0, 0, 1, 0, 3, 2, 1, 3]), persistent=False)

    def mask_mod(self):
        table, block = self.table, self.block

        def allowed(b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
            qb = (i // block).clamp(max=table.shape[0] - 1)
            return (table[qb] == j // block) | (i // block == j // block)

        return allowed


class _Recorded(Exception):
    pass


def test_module_device_is_where_the_buffers_are() -> None:
    module = TableMasked()
    assert module_device(module) == torch.device("cpu")
    assert module_device(module.to("meta")) == torch.device("meta")
    assert module_device(ExactAttention().to("meta")) == torch.device("cpu")  # holds no tensor


def test_cost_counts_the_mask_on_the_module_device(monkeypatch: pytest.MonkeyPatch) -> None:
    module = TableMasked().to("meta")
    seen: list[torch.device] = []

    def recording(batch: int, heads: int, q_len: int, k_len: int, device: torch.device):
        seen.append(torch.device(device))
        raise _Recorded

    monkeypatch.setattr(attn.cost, "index_grids", recording)
    with pytest.raises(_Recorded):
        module.cost(CostQuery.self_attention(1, 2, 32, 8))
    assert seen == [torch.device("meta")]  # the CPU here is the bug: the buffer is not there


def test_cost_of_a_buffer_mask_counts_its_pairs() -> None:
    module = TableMasked()
    n = 32
    expected = int(dense_allowed(module.mask_mod(), batch=1, heads=1, q_len=n, k_len=n, causal=False,
                                 key_mask=None, device=torch.device("cpu")).sum())
    assert module.cost(CostQuery.self_attention(1, 2, n, 8)).pairs == expected
