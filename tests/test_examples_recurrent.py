"""The recurrent plug-in packages (examples/attn_bench_retention, _gla, _ssd): each chunked form
against its recurrence written out token by token, decoding through the state, key padding, the
refusal of a non-causal call, gradients (to the decay parameters too), the cost, the models and
the conformance kit. Imported from their folders, as the baselines are (no pip install)."""

from __future__ import annotations

import math

import pytest
import torch
from baseline_packages import baselines_registered, load
from torch import Tensor, nn
from torch.nn import functional as F

from attn import create_attention
from attn.conformance import check_attention
from attn.cost import CostQuery
from models import create_model
from models.attention import StateCache

NAMES = ["retention", "gla", "ssd"]
HEADS, DIM = 3, 8


@pytest.fixture
def registered():
    """Register the baseline and recurrent packages' classes under their entry-point names for one test."""
    with baselines_registered() as classes:
        yield classes


def build(name: str, chunk: int = 4, dtype: torch.dtype = torch.float64, **params) -> nn.Module:
    """The variant from its package, its decay parameters drawn large enough that the decays differ
    from 1 and from one another (seeded)."""
    if name == "retention":
        module = load("attn_bench_retention").RetentionAttention(chunk=chunk, **params)
    elif name == "gla":
        module = load("attn_bench_gla").GatedLinearAttention(chunk=chunk, num_heads=HEADS, head_dim=DIM)
    else:
        module = load("attn_bench_ssd").SSDAttention(chunk=chunk, num_heads=HEADS, head_dim=DIM)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=gen, dtype=param.dtype) * 2.0)
    return module.to(dtype)


def qkv(n: int, nq: int | None = None, b: int = 2, dtype: torch.dtype = torch.float64,
        seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, HEADS, n if nq is None else nq, DIM, generator=gen, dtype=torch.float64)
    k = torch.randn(b, HEADS, n, DIM, generator=gen, dtype=torch.float64)
    v = torch.randn(b, HEADS, n, DIM, generator=gen, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


@torch.no_grad()
def recurrence(name: str, module: nn.Module, q: Tensor, k: Tensor, v: Tensor,
               key_mask: Tensor | None = None) -> Tensor:
    """``S_t = decay_t * S_{t-1} + k_t^T v_t``, ``out_t = q_t S_t``, one token at a time in float64,
    the decays written from the papers' formulas; a padded token leaves ``S`` as it is."""
    q, k, v = (t.double() for t in (q, k, v))
    batch, heads, length, dim = k.shape
    if name == "retention":  # fixed gamma per head; q scaled by D^-1/2; the normaliser's column of ones
        gamma = 1 - torch.exp(torch.linspace(math.log(1 / 32), math.log(1 / 512), heads, dtype=torch.float64))
        decay = gamma[None, :, None, None].expand(batch, heads, length, dim)  # (B, H, N, D)
        q = q / math.sqrt(dim)
        if module.normalize:
            v = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
    elif name == "gla":  # alpha_t = sigmoid(k_t W + b)^(1/16) per channel; q scaled by D^-1/2
        weight, bias = module.gate_weight.double(), module.gate_bias.double()
        decay = torch.sigmoid(torch.einsum("bhnd,hde->bhne", k, weight) + bias[:, None]) ** (1 / 16)
        q = q / math.sqrt(dim)
    else:  # dt_t = softplus(k_t . w + dt_bias), a_t = exp(-dt_t exp(A_log)), dt_t k_t^T v_t
        dt = F.softplus(torch.einsum("bhnd,hd->bhn", k, module.dt_weight.double()) + module.dt_bias.double()[:, None])
        decay = torch.exp(-dt * module.A_log.double().exp()[:, None])[..., None].expand(batch, heads, length, dim)
        k = k * dt[..., None]
    real = torch.ones(batch, length, dtype=torch.bool) if key_mask is None else key_mask
    state = torch.zeros(batch, heads, dim, v.shape[-1], dtype=torch.float64)
    outs = []
    for t in range(length):
        fed = decay[:, :, t, :, None] * state + k[:, :, t, :, None] * v[:, :, t, None, :]  # (B, H, D, Dv)
        state = torch.where(real[:, t, None, None, None], fed, state)
        outs.append((q[:, :, t, None, :] @ state)[:, :, 0])  # (B, H, Dv)
    out = torch.stack(outs, dim=2)  # (B, H, N, Dv)
    if name == "retention" and module.normalize:
        out = out[..., :-1] / out[..., -1:].abs().clamp(min=1.0)
    return out


def close(out: Tensor, expected: Tensor, tol: float) -> None:
    """|out - expected| <= tol, relative to the largest expected value when above 1."""
    err = float((out.detach().double() - expected).abs().max())
    bound = tol * max(1.0, float(expected.abs().max()))
    assert err <= bound, f"max |out - expected| = {err:.3g} > {bound:.3g}"


# ---- the chunked form against the recurrence ---------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize(("chunk", "length"), [(4, 5), (4, 13), (8, 13), (8, 37)])
@pytest.mark.parametrize("name", NAMES)
def test_chunked_form_equals_the_recurrence(name, chunk, length, dtype):
    """Lengths that are not multiples of the chunk (a partial last chunk), float32 and bfloat16
    (computed in float32: only the output is rounded), and the decode-like ``Nq < Nk``."""
    module = build(name, chunk, torch.float32)
    q, k, v = qkv(length, dtype=dtype)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    expected = recurrence(name, module, q, k, v)
    out = module(q, k, v, causal=True)
    assert out.dtype == dtype and out.shape == (2, HEADS, length, DIM)
    close(out, expected, tol)
    close(module(q[:, :, -3:], k, v, causal=True), expected[:, :, -3:], tol)  # bottom-right aligned


@pytest.mark.parametrize("name", NAMES)
def test_dense_reference_equals_the_recurrence(name):
    """The O(Nq * Nk) definition with the explicit decay mask, ``Nq < Nk`` bottom-right aligned."""
    module = build(name)
    q, k, v = qkv(11, nq=4)
    expected = recurrence(name, module, F.pad(q, (0, 0, 7, 0)), k, v)[:, :, 7:]  # rows at positions 7..10
    torch.testing.assert_close(module.reference_forward(q, k, v, True, None), expected, atol=1e-12, rtol=0)


def test_retention_without_the_normaliser_is_the_plain_decayed_sum():
    module = build("retention", normalize=False)
    q, k, v = qkv(9)
    gamma = 1 - torch.exp(torch.linspace(math.log(1 / 32), math.log(1 / 512), HEADS, dtype=torch.float64))
    i, j = torch.arange(9)[:, None], torch.arange(9)[None, :]
    weights = torch.where(j <= i, gamma[:, None, None] ** (i - j).clamp(min=0), 0.0)  # (H, N, N)
    expected = ((q @ k.transpose(-2, -1)) / math.sqrt(DIM) * weights) @ v
    torch.testing.assert_close(module(q, k, v, causal=True), expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", NAMES)
def test_a_padded_key_is_skipped(name):
    """Padded keys add nothing and do not decay the state: a row's output at its real positions is
    the output of its sequence without the padding; a row with no real key gives zeros."""
    module = build(name, chunk=4)
    q, k, v = qkv(10, b=3)
    key_mask = torch.ones(3, 10, dtype=torch.bool)
    key_mask[0, [2, 3, 7]] = False
    key_mask[1] = False
    key_mask[2, :4] = False  # left padding
    out = module(q, k, v, causal=True, key_mask=key_mask)
    torch.testing.assert_close(out, recurrence(name, module, q, k, v, key_mask), atol=1e-12, rtol=0)
    real = key_mask[0]
    alone = module(q[:1, :, real], k[:1, :, real], v[:1, :, real], causal=True)
    torch.testing.assert_close(out[:1, :, real], alone, atol=1e-12, rtol=0)
    assert out[1].abs().max() == 0


# ---- decoding through the state ---------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_decoding_token_by_token_equals_the_chunked_forward(name):
    module = build(name, chunk=4)
    q, k, v = qkv(11)
    full = module(q, k, v, causal=True)
    state = module.new_decoding_state()
    steps = [state.step(q[:, :, :3], k[:, :, :3], v[:, :, :3])]  # a 3-token prompt, then tokens
    shape = tuple(state.state.shape)
    for t in range(3, 11):
        steps.append(state.step(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1]))
        assert tuple(state.state.shape) == shape  # O(D * Dv): it does not grow with the tokens
    torch.testing.assert_close(torch.cat(steps, dim=2), full, atol=1e-12, rtol=0)
    assert state.length == 11
    again = module.new_decoding_state()  # beam search's reorder keeps each row's state
    again.step(q[:, :, :5], k[:, :, :5], v[:, :, :5])
    again.reorder(torch.tensor([1, 1]))
    row = again.step(q[1:, :, 5:6].expand(2, -1, -1, -1), k[1:, :, 5:6].expand(2, -1, -1, -1),
                     v[1:, :, 5:6].expand(2, -1, -1, -1))
    torch.testing.assert_close(row, full[1:, :, 5:6].expand(2, -1, -1, -1), atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="q: a decoding step takes one query per new key"):
        again.step(q[:, :, :2], k[:, :, :1], v[:, :, :1])


@pytest.mark.parametrize("name", NAMES)
def test_decoding_in_bfloat16_keeps_a_float32_state(name):
    module = build(name, chunk=4, dtype=torch.float32)
    q, k, v = qkv(6, dtype=torch.bfloat16)
    state = module.new_decoding_state()
    steps = torch.cat([state.step(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1]) for t in range(6)], 2)
    assert steps.dtype == torch.bfloat16 and state.state.dtype == torch.float32
    close(steps, recurrence(name, module, q, k, v), 1e-2)


@pytest.mark.parametrize("name", NAMES)
def test_decoder_decodes_through_the_state(registered, name):
    torch.manual_seed(0)
    model = create_model("decoder_lm", attention=name, d_model=24, num_heads=HEADS, num_layers=2,
                         d_ff=48, vocab_size=17, max_len=64).eval()
    ids = torch.randint(1, 17, (2, 12))
    with torch.no_grad():
        full = model(ids)  # (B, N, V), no cache
        cache = model.new_cache()
        assert all(isinstance(layer, StateCache) for layer in cache.layers)
        stepped = [model(ids[:, :5], cache=cache)] + [model(ids[:, t:t + 1], cache=cache) for t in range(5, 12)]
        torch.testing.assert_close(torch.cat(stepped, dim=1), full, atol=1e-5, rtol=1e-5)
        padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids[:1, :6]], dim=1)  # left padding
        mask = torch.tensor([[False] * 3 + [True] * 6])
        assert torch.equal(model.generate(padded, 4, key_mask=mask)[:, -4:], model.generate(ids[:1, :6], 4)[:, -4:])


# ---- always causal --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_a_non_causal_call_runs_causally_and_an_encoder_reads_left_to_right(registered, name):
    module = build(name)
    q, k, v = qkv(6)
    assert module.forces_causal
    torch.testing.assert_close(module(q, k, v), module(q, k, v, causal=True), atol=0, rtol=0)
    encoder = create_model("encoder_classifier", attention=name, d_model=24, num_heads=HEADS, num_layers=1,
                           d_ff=48, vocab_size=17, max_len=64, num_classes=3)
    ids = torch.randint(1, 17, (2, 6))
    logits = encoder(ids)
    assert logits.shape == (2, 3) and torch.isfinite(logits).all()
    changed = ids.clone()
    changed[:, -1] = ids[:, -1] % 16 + 1  # another last token: no earlier position may see it
    torch.testing.assert_close(encoder.encode(changed)[0][:, :-1], encoder.encode(ids)[0][:, :-1])
    assert not torch.allclose(encoder.encode(changed)[0][:, -1], encoder.encode(ids)[0][:, -1])


@pytest.mark.parametrize("name", ["gla", "ssd"])
def test_gate_parameters_need_the_heads_and_head_dim(registered, name):
    with pytest.raises(ValueError, match=rf"{name}: parameter 'num_heads' is required"):
        create_attention(name, head_dim=DIM)
    x = torch.randn(1, HEADS, 5, 4, dtype=torch.float64)  # built with head_dim=DIM=8
    with pytest.raises(ValueError, match=rf"{name}: arguments 'q', 'k' have head dim 4"):
        build(name)(x, x, x, causal=True)


# ---- gradients ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_gradients_match_the_definition_and_reach_the_decay_parameters(name):
    """Backward through the chunks equals backward through the dense definition, for q, k, v and
    every parameter (GLA's gate map, SSD's dt map, dt bias and A_log; retention has none)."""
    module = build(name, chunk=4)
    q, k, v = (t.requires_grad_() for t in qkv(13))
    key_mask = torch.ones(2, 13, dtype=torch.bool)
    key_mask[1, :3] = False
    weight = torch.randn(2, HEADS, 13, DIM, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    inputs = [q, k, v, *module.parameters()]
    chunked = torch.autograd.grad((module(q, k, v, causal=True, key_mask=key_mask) * weight).sum(), inputs)
    dense = torch.autograd.grad((module.reference_forward(q, k, v, True, key_mask) * weight).sum(), inputs)
    for got, want in zip(chunked, dense):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=0)
    params = dict(module.named_parameters())
    assert set(params) == {"retention": set(), "gla": {"gate_weight", "gate_bias"},
                           "ssd": {"dt_weight", "dt_bias", "A_log"}}[name]
    for label, grad in zip(params, chunked[3:]):
        assert torch.isfinite(grad).all() and grad.abs().max() > 0, label


def test_gla_gates_far_below_one_stay_finite_and_exact_in_float32():
    """No exp(-cumulative log gate) is formed: gates of e^-60 per token overflow nothing."""
    module = build("gla", chunk=64, dtype=torch.float32)
    with torch.no_grad():
        module.gate_bias.fill_(-1000.0)  # log alpha = log sigmoid(-1000) / 16, about -62 per channel
    q, k, v = qkv(37, dtype=torch.float32)
    out = module(q, k, v, causal=True)
    assert torch.isfinite(out).all()
    close(out, recurrence("gla", module, q, k, v), 1e-5)


# ---- cost and the conformance kit -----------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_cost_is_linear_in_the_length(name):
    module = build(name, chunk=64)
    costs = [module.cost(CostQuery.self_attention(2, 8, n, 64, causal=True)) for n in (4096, 8192)]
    assert costs[1].fwd == 2 * costs[0].fwd and costs[0].bwd == 2 * costs[0].fwd
    assert costs[0].kind == "performed"


@pytest.mark.parametrize("name", NAMES)
def test_each_package_passes_the_conformance_kit(registered, name):
    report = check_attention(name, quick=True, isolate=False)
    report.raise_if_failed()
    ran = {r.check for r in report.results if r.status == "pass"}
    assert {"shape_dtype_finite", "matches_reference"} <= ran, ran


@pytest.mark.parametrize("name", NAMES)
def test_the_kit_runs_every_check_on_a_causal_only_variant(registered, name):
    report = check_attention(name, quick=True, isolate=False)
    ran = {r.check for r in report.results if r.status == "pass"}
    assert {"gradients", "causal_no_leak", "key_mask", "batch_independence"} <= ran, ran
