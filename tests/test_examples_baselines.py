"""The published baselines as third-party plug-in packages (examples/attn_bench_*): each
against a direct formula, its declared limits, the conformance kit, and the core hooks they
use (feature-map attention, reference_forward, the decoding state)."""

from __future__ import annotations

import importlib
import math
import shutil
import subprocess
import sys

import pytest
import torch
from baseline_packages import EXAMPLES, PACKAGES, baselines_registered, load
from torch import Tensor

import attn.registry as registry
from attn import AttentionCall, create_attention, get_kernel, register_attention
from attn.conformance import check_attention
from attn.kernelized import (
    KernelizedState,
    dense_kernelized_attention,
    kernelized_attention,
    streamed_kernelized_attention,
)
from attn.kernels.reference import dense_attention
from models import create_model
from models.attention import StateCache


@pytest.fixture
def registered():
    """Register the four packages' classes under their entry-point names for one test."""
    with baselines_registered() as classes:
        yield classes


def qkv(b=2, h=3, nq=11, nk=11, d=8, dv=8, seed=0, scale=1.0) -> tuple[Tensor, Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, nq, d, generator=gen, dtype=torch.float64) * scale
    k = torch.randn(b, h, nk, d, generator=gen, dtype=torch.float64) * scale
    v = torch.randn(b, h, nk, dv, generator=gen, dtype=torch.float64)
    return q, k, v


def allowed(nq: int, nk: int, causal: bool, key_mask: Tensor | None) -> Tensor:
    """Bool (B|1, 1, Nq, Nk): bottom-right causal alignment and key padding, written out."""
    ok = torch.ones(nq, nk, dtype=torch.bool)
    if causal:
        for r in range(nq):
            ok[r, max(0, nk - nq + r + 1):] = False  # keys after the row's position
            if nk - nq + r < 0:
                ok[r] = False  # the row sits before every key
    ok = ok[None, None]
    return ok if key_mask is None else ok & key_mask[:, None, None, :]


def elu1(x: Tensor) -> Tensor:
    return torch.where(x > 0, x + 1, torch.exp(x))


# ---- linear attention ------------------------------------------------------------------------


@pytest.mark.parametrize(("nq", "nk"), [(11, 11), (4, 11), (13, 9)])
@pytest.mark.parametrize("causal", [False, True])
def test_linear_attention_equals_the_direct_quadratic_formula(nq, nk, causal):
    linear = load("attn_bench_linear").LinearAttention(chunk=3)
    q, k, v = qkv(nq=nq, nk=nk)
    key_mask = torch.rand(2, nk, generator=torch.Generator().manual_seed(1)) > 0.3
    key_mask[0] = False  # a row with no real key gives zeros
    a = (elu1(q) @ elu1(k).transpose(-2, -1)) * allowed(nq, nk, causal, key_mask)  # (B, H, Nq, Nk)
    den = a.sum(-1, keepdim=True)
    expected = torch.where(den > 0, (a @ v) / den.clamp(min=1e-300), torch.zeros(()))
    out = linear(q, k, v, causal=causal, key_mask=key_mask)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)
    assert out[0].abs().max() == 0


def test_linear_attention_recurrent_step_equals_the_batch_forward():
    linear = load("attn_bench_linear").LinearAttention(chunk=4)
    q, k, v = qkv(nq=10, nk=10)
    batch = linear(q, k, v, causal=True)
    state = linear.new_decoding_state()
    steps = [state.step(q[:, :, :3], k[:, :, :3], v[:, :, :3])]  # a 3-token prompt, then tokens
    shape = tuple(state.state.shape)
    for t in range(3, 10):
        steps.append(state.step(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1]))
        assert tuple(state.state.shape) == shape  # O(1) state: it does not grow with the tokens
    torch.testing.assert_close(torch.cat(steps, dim=2), batch, atol=1e-12, rtol=0)
    assert state.length == 10


def test_decoder_with_linear_attention_decodes_through_its_state(registered):
    torch.manual_seed(0)
    model = create_model("decoder_lm", attention="linear_attention", d_model=32, num_heads=2, num_layers=2,
                         d_ff=64, vocab_size=17, max_len=64).eval()
    ids = torch.randint(0, 17, (2, 12))
    with torch.no_grad():
        full = model(ids)  # (B, N, V), no cache
        cache = model.new_cache()
        assert all(isinstance(layer, StateCache) for layer in cache.layers)
        stepped = [model(ids[:, :5], cache=cache)]
        for t in range(5, 12):
            stepped.append(model(ids[:, t:t + 1], cache=cache))
    torch.testing.assert_close(torch.cat(stepped, dim=1), full, atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # beam search's reorder keeps each row's state
        cache = model.new_cache()
        model(ids[:, :5], cache=cache)
        cache.reorder(torch.tensor([1, 1]))
        row = model(ids[1:, 5:6].expand(2, 1), cache=cache)
    torch.testing.assert_close(row[0], full[1, 5:6], atol=1e-5, rtol=1e-5)


def test_decoder_state_keeps_left_padding_out(registered):
    """A left-padded prompt gives the logits its unpadded prompt gives alone."""
    torch.manual_seed(0)
    model = create_model("decoder_lm", attention="linear_attention", d_model=32, num_heads=2, num_layers=1,
                         d_ff=64, vocab_size=17, max_len=64).eval()
    ids = torch.randint(1, 17, (1, 6))
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], dim=1)
    mask = torch.tensor([[False] * 3 + [True] * 6])
    with torch.no_grad():
        alone = model.generate(ids, 4)
        together = model.generate(padded, 4, key_mask=mask)
    assert torch.equal(together[:, -4:], alone[:, -4:])


# ---- Performer -------------------------------------------------------------------------------


@pytest.mark.slow  # a minute (65536 features); Performer's other tests and its kit stay in the default run
def test_performer_approaches_softmax_attention_as_features_grow():
    """An unbiased estimate: the error falls like m^-1/2 (16 -> 65536 features: about 64x,
    at least 16x required); a biased one (e.g. orthogonal blocks without Haar signs) stalls."""
    performer_cls = load("attn_bench_performer").PerformerAttention
    q, k, v = qkv(b=1, h=2, nq=20, nk=20, d=8, scale=0.5)
    exact = dense_attention(q, k, v)
    errors = {}
    for m in (16, 256, 4096, 65536):
        with torch.no_grad():
            errors[m] = float((performer_cls(num_features=m, head_dim=8).double()(q, k, v) - exact).abs().max())
    assert errors[65536] < errors[4096] < errors[256] < errors[16], errors
    assert errors[65536] < errors[16] / 16 and errors[65536] < 0.02, errors


def test_performer_features_are_positive_random_features_up_to_a_row_factor():
    """phi(q) phi(k)^T equals the plain FAVOR+ estimate mean_r exp(w_r.x - |x|^2/2) exp(w_r.y - |y|^2/2)
    (x = q D^-1/4, y = k D^-1/4) up to one factor per query row: the stabiliser changes nothing else."""
    performer = load("attn_bench_performer").PerformerAttention(num_features=64, head_dim=4).double()
    q, k, _ = qkv(b=1, h=1, nq=3, nk=5, d=4, scale=2.0)
    phi_q, phi_k = performer.features(q, True), performer.features(k, False)
    assert (phi_q > 0).all() and (phi_k > 0).all() and phi_k.max() <= 1.0
    w, x, y = performer.projection, q * 4**-0.25, k * 4**-0.25
    fx = torch.exp(x @ w.T - (x * x).sum(-1, keepdim=True) / 2)  # (1, 1, Nq, m)
    fy = torch.exp(y @ w.T - (y * y).sum(-1, keepdim=True) / 2)  # (1, 1, Nk, m)
    plain = fx @ fy.transpose(-2, -1)
    ratio = (phi_q @ phi_k.transpose(-2, -1)) / plain  # (1, 1, Nq, Nk)
    torch.testing.assert_close(ratio / ratio[..., :1], torch.ones_like(ratio), atol=1e-12, rtol=0)


def test_performer_redraws_on_schedule_in_training_only():
    performer = load("attn_bench_performer").PerformerAttention(num_features=8, redraw_interval=2, seed=3,
                                                                head_dim=4)
    first = performer.projection.clone()
    q = torch.randn(1, 1, 5, 4, requires_grad=True)
    performer.train()
    performer(q, q, q)
    performer(q, q, q)
    assert torch.equal(performer.projection, first)  # two calls: still the first draw
    with torch.no_grad():
        performer(q, q, q)  # no gradients: not a training call
    assert torch.equal(performer.projection, first)
    performer(q, q, q)  # the third training call redraws
    second = performer.projection.clone()
    assert not torch.equal(second, first)
    performer.eval()
    for _ in range(5):
        performer(q, q, q)
    assert torch.equal(performer.projection, second)  # fixed in eval
    again = load("attn_bench_performer").PerformerAttention(num_features=8, seed=3, head_dim=4)
    assert torch.equal(again.projection, first)  # seeded: the same first draw


def test_performer_causal_and_decoding_state_match_its_definition():
    performer = load("attn_bench_performer").PerformerAttention(num_features=16, chunk=4, head_dim=8).double()
    q, k, v = qkv(nq=9, nk=9)
    out = performer(q, k, v, causal=True)
    torch.testing.assert_close(out, performer.reference_forward(q, k, v, True, None), atol=1e-12, rtol=0)
    state = performer.new_decoding_state()
    stepped = torch.cat([state.step(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1]) for t in range(9)], 2)
    torch.testing.assert_close(stepped, out, atol=1e-12, rtol=0)


# ---- Linformer -------------------------------------------------------------------------------


def test_linformer_equals_the_direct_formula_with_its_projections():
    linformer = load("attn_bench_linformer").LinformerAttention(proj_len=5, max_len=16).double()
    q, k, v = qkv(nq=7, nk=12)
    key_mask = torch.ones(2, 12, dtype=torch.bool)
    key_mask[1, 9:] = False
    e, f = linformer.key_proj[:, :12], linformer.value_proj[:, :12]  # (k, Nk)
    real = key_mask[:, None, :, None].double()
    k_proj = torch.einsum("kn,bhnd->bhkd", e, k * real)
    v_proj = torch.einsum("kn,bhnd->bhkd", f, v * real)
    expected = torch.softmax(q @ k_proj.transpose(-2, -1) / math.sqrt(8), dim=-1) @ v_proj
    torch.testing.assert_close(linformer(q, k, v, key_mask=key_mask), expected, atol=1e-12, rtol=0)


def test_linformer_declares_what_it_cannot_run():
    linformer = load("attn_bench_linformer").LinformerAttention(proj_len=4, max_len=16)
    q = torch.randn(1, 2, 17, 8)
    causal = AttentionCall.from_tensors(q[:, :, :8], q[:, :, :8], q[:, :, :8], True, None, False)
    assert [r.endswith("does not support causal=True") for r in linformer.not_supported_reasons(causal)] == [True]
    too_long = AttentionCall.from_tensors(q, q, q, False, None, False)
    assert any("17 keys exceed max_len=16" in r for r in linformer.not_supported_reasons(too_long))
    with pytest.raises(NotImplementedError, match="max_len=16"):
        linformer(q, q, q)
    with pytest.raises(NotImplementedError, match="'causal' must be False"):
        linformer(q[:, :, :8], q[:, :, :8], q[:, :, :8], causal=True)
    with pytest.raises(ValueError, match="linformer: parameter 'proj_len': must be an integer >= 1; got 0"):
        create_attention_from(load("attn_bench_linformer").LinformerAttention, "linformer", proj_len=0)


def create_attention_from(cls, name: str, **params):
    register_attention(name, overwrite=True)(cls)
    try:
        return create_attention(name, **params)
    finally:
        registry.unregister_attention(name)


# ---- BigBird ---------------------------------------------------------------------------------


def bigbird_pairs(n: int, size: int, window: int, first: int, table: Tensor) -> Tensor:
    """(N, N) bool: BigBird's block pattern built block by block, independently of its mask_mod."""
    blocks = -(-n // size)
    block_ok = torch.zeros(blocks, blocks, dtype=torch.bool)
    for a in range(blocks):
        for c in range(blocks):
            block_ok[a, c] = abs(a - c) <= window or a < first or c < first
        for c in table[a].tolist() if a < table.shape[0] else []:
            if c < blocks:
                block_ok[a, c] = True
    idx = torch.arange(n) // size
    return block_ok[idx][:, idx]


def test_bigbird_mask_is_window_global_and_seeded_random_blocks():
    bigbird_cls = load("attn_bench_bigbird").BigBirdAttention
    bigbird = bigbird_cls(block_size=3, window_blocks=1, num_global_blocks=1, num_random_blocks=2, seed=5,
                          max_len=30)
    n = 30
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    mask = bigbird.mask_mod()(0, 0, i, j)
    assert torch.equal(mask, bigbird_pairs(n, 3, 1, 1, bigbird.random_table))
    assert bigbird.random_table.shape == (10, 2)
    assert all(len(set(row.tolist())) == 2 for row in bigbird.random_table)  # distinct per block
    same = bigbird_cls(block_size=3, num_random_blocks=2, seed=5, max_len=30)
    other = bigbird_cls(block_size=3, num_random_blocks=2, seed=6, max_len=30)
    assert torch.equal(same.random_table, bigbird.random_table)
    assert not torch.equal(other.random_table, bigbird.random_table)
    q, k, v = qkv(b=1, h=2, nq=n, nk=n)
    pairs = bigbird_pairs(n, 3, 1, 1, bigbird.random_table)
    expected = dense_attention(q, k, v, mask_mod=lambda b, h, i, j: pairs[i, j])
    torch.testing.assert_close(bigbird.double()(q, k, v), expected, atol=1e-12, rtol=0)



@pytest.mark.slow
@pytest.mark.compile
def test_bigbird_runs_compiled_flex_without_falling_back():
    """Its block mask and its attention compile (no eager fallback, which materialises N x N
    scores) and give the dense reference; a mask_mod reading views of one table fell back."""
    bigbird = load("attn_bench_bigbird").BigBirdAttention(block_size=16, num_random_blocks=2, max_len=512,
                                                          kernel="flex")
    q, k, v = (t.float() for t in qkv(b=1, h=2, nq=512, nk=512, d=16, dv=16))  # flex on CPU: no float64
    with torch.no_grad():
        out = bigbird(q, k, v)  # (B, H, N, Dv)
    assert bigbird.last_path.kernel == "flex" and bigbird.last_path.fallback is None, bigbird.last_path
    pairs = bigbird_pairs(512, 16, 1, 1, bigbird.random_table)
    torch.testing.assert_close(out, dense_attention(q, k, v, mask_mod=lambda b, h, i, j: pairs[i, j]),
                               atol=1e-5, rtol=1e-5)

def test_bigbird_refuses_more_random_blocks_than_blocks():
    with pytest.raises(ValueError, match="'num_random_blocks' must be at most the 4 blocks of max_len=16; got 5"):
        create_attention_from(load("attn_bench_bigbird").BigBirdAttention, "bigbird", block_size=4,
                              max_len=16, num_random_blocks=5)


# ---- the kit on each package, and the kit against broken approximations -----------------------


@pytest.mark.parametrize("name", ["linear_attention", "performer", "linformer", "bigbird"])
def test_each_package_passes_the_conformance_kit(registered, name):
    kernels = ["sdpa"] if name == "bigbird" else None  # bigbird's others: the entry-point test
    report = check_attention(name, quick=True, kernels=kernels, isolate=False)
    report.raise_if_failed()
    ran = {r.check for r in report.results if r.status == "pass"}
    expected = {"matches_reference", "shape_dtype_finite", "gradients", "key_mask", "batch_independence"}
    if name == "performer":
        expected.add("converges")
    assert expected <= ran, ran


def test_kit_fails_a_fast_path_that_leaks_one_key_ahead():
    """A linear attention whose chunked causal form lets each query see the next key: the
    conformance kit's matches_reference (against reference_forward) names it."""
    linear_cls = load("attn_bench_linear").LinearAttention

    class Leaky(linear_cls):
        def native_forward(self, q, k, v, causal, key_mask):
            if causal:  # shift the keys one step back: query i now sees key i + 1
                k, v = torch.roll(k, -1, dims=2), torch.roll(v, -1, dims=2)
            return super().native_forward(q, k, v, causal, key_mask)

    report = check_attention(Leaky, params={"chunk": 4}, quick=True, isolate=False)
    failed = {r.check: r.message for r in report.results if r.status == "fail"}
    assert "its own definition computed directly" in failed["matches_reference"]
    assert "future leakage" in failed["causal_no_leak"]


def test_kit_fails_a_performer_whose_features_miss_the_norm_term():
    performer_cls = load("attn_bench_performer").PerformerAttention

    class NoNormTerm(performer_cls):
        def features(self, x, is_query):
            w = self.projection.to(x.dtype)
            if self.projection.shape[1] != x.shape[-1]:
                self.redraw(x.shape[-1])
                w = self.projection.to(x.dtype)
            logits = (x * x.shape[-1] ** -0.25) @ w.T  # exp(w . x) without -|x|^2/2: biased
            return torch.exp(logits - logits.amax(dim=-1, keepdim=True)) if is_query else torch.exp(logits)

    report = check_attention(NoNormTerm, params={"num_features": 32}, quick=True, isolate=False)
    converges = next(r for r in report.results if r.check == "converges")
    assert converges.status == "fail" and "above its bound" in converges.message


def test_kernelized_attention_chunks_match_the_dense_definition():
    gen = torch.Generator().manual_seed(2)
    phi_q = torch.rand(2, 2, 9, 5, generator=gen, dtype=torch.float64)
    phi_k = torch.rand(2, 2, 14, 5, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 2, 14, 3, generator=gen, dtype=torch.float64)
    key_mask = torch.rand(2, 14, generator=gen) > 0.4
    for chunk in (1, 4, 100):
        out = kernelized_attention(phi_q, phi_k, v, causal=True, key_mask=key_mask, chunk=chunk)
        ref = dense_kernelized_attention(phi_q, phi_k, v, causal=True, key_mask=key_mask)
        torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    state = KernelizedState(lambda x, is_query: x)
    with pytest.raises(ValueError, match="q: a decoding step takes one query per new key"):
        state.step(phi_q, phi_k, v)


def test_streamed_kernelized_attention_equals_the_whole_length_form_in_values_and_gradients():
    # slices of 4 rows over 9 queries and 14 keys: partial last slices on both sides, masked keys
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 2, 9, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 14, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, 14, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    key_mask = torch.rand(2, 14, generator=gen) > 0.4
    key_mask[1] = False  # every key of batch element 1 padded: zeros
    features = lambda x, is_query: elu1(x) * (2.0 if is_query else 1.0)
    out = streamed_kernelized_attention(features, q, k, v, key_mask=key_mask, rows=4)
    ref = kernelized_attention(features(q, True), features(k, False), v, key_mask=key_mask)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    assert out[1].abs().max() == 0
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    expected = torch.autograd.grad(ref.square().sum(), (q, k, v))
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    no_keys = streamed_kernelized_attention(features, q, k[:, :, :0], v[:, :, :0], rows=4)
    assert no_keys.shape == (2, 2, 9, 3) and no_keys.abs().max() == 0


@pytest.mark.slow
def test_packages_install_and_register_through_entry_points(tmp_path, monkeypatch):
    """pip installs the four packages (from copies, into a temporary site dir); their entry
    points register them, and BigBird passes the kit on every kernel that compiles nothing
    per shape (flex compiles per shape: ``attn-bench check bigbird`` runs it)."""
    copies = []
    for package in PACKAGES.values():
        copies.append(tmp_path / package)
        shutil.copytree(EXAMPLES / package, copies[-1], ignore=shutil.ignore_patterns("build", "*.egg-info",
                                                                                         "__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(tmp_path / "site"), *map(str, copies)],
        check=True, capture_output=True, text=True, timeout=600,
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    try:
        errors = registry.load_plugins(reload=True)
        for name, package in PACKAGES.items():
            assert name not in errors
            assert f"entry point {package}:" in registry.attention_info(name).source
        kernels = [k for k in registry.attention_info("bigbird").kernels if not get_kernel(k).compiles_per_shape]
        assert kernels == ["reference", "sdpa", "chunked"]
        check_attention("bigbird", quick=True, kernels=kernels, isolate=False).raise_if_failed()
    finally:
        for name, package in PACKAGES.items():
            registry.unregister_attention(name)
            sys.modules.pop(package, None)
