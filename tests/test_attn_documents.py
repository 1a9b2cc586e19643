"""Packed sequences (``document_ids``): validation, exactness per kernel, refusals, block skipping."""

from __future__ import annotations

import pytest
import torch

import attn.kernels.blocked.packed as packed_module
from attn import AttentionCall, create_attention
from attn.conformance.documents import ROW_DOCUMENTS, check_documents, row_ids
from attn.conformance.harness import HEADS, active_dtypes, make_inputs
from attn.documents import Documents
from attn.kernels import register_kernel, unregister_kernel
from attn.kernels.reference import ReferenceKernel

CPU = torch.device("cpu")


@pytest.fixture
def float64_only():
    """The kit's checks in float64 alone (the tightest tolerance; half the calls)."""
    token = active_dtypes.set((torch.float64,))
    yield
    active_dtypes.reset(token)


def _qkv(batch: int = 2, n: int = 12, heads: int = 2, dim: int = 8):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(batch, heads, n, dim, generator=gen, dtype=torch.float64) for _ in range(3)]


@pytest.mark.parametrize(("ids", "message"), [
    ([[0, 0, 1, 1, 0, 0] * 2] * 2, "argument 'document_ids' must be non-decreasing along each row"),
    (torch.zeros(2, 12), "argument 'document_ids' must have an integer dtype (torch.int32 / torch.int64)"),
    (torch.zeros(2, 11, dtype=torch.int64), "must have shape (B, N) = (2, 12); got (2, 11)"),
    ("0011", "argument 'document_ids' must be an integer tensor (B, N) or None; got str"),
])
def test_bad_document_ids_are_refused_naming_the_argument(ids, message) -> None:
    q, k, v = _qkv()
    ids = torch.tensor(ids) if isinstance(ids, list) else ids
    with pytest.raises(ValueError) as err:
        create_attention("causal")(q, k, v, document_ids=ids)
    assert message in str(err.value) and str(err.value).startswith("causal: ")
    assert "\n" not in str(err.value)


def test_cross_attention_takes_no_document_ids() -> None:
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"needs self-attention \(Nq == Nk\); got Nq=5, Nk=12"):
        create_attention("full")(q[:, :, :5], k, v, document_ids=torch.zeros(2, 12, dtype=torch.int64))


def test_documents_give_each_token_its_document_start() -> None:
    docs = Documents.from_ids(torch.tensor([[3, 3, 3, 5, 5, 9], [0, 0, 0, 0, 0, 0]]))
    assert docs.starts.tolist() == [[0, 0, 0, 3, 3, 5], [0, 0, 0, 0, 0, 0]]
    assert docs.segments() == [[(0, 3), (3, 5), (5, 6)], [(0, 6)]]


PACKED_CASES = [
    *[("blocked", variant, params) for variant, params in (
        ("full", {}), ("causal", {}), ("sliding_window", {"window": 3}),
        ("dilated", {"window": 2, "dilation": (1, 2)}), ("global_tokens", {"num_global": 2, "window": 3}),
        ("relative", {"bias": "learned", "max_distance": 4}),
        ("sliding_window", {"window": 2, "position_bias": "alibi"}))],
    *[(kernel, "global_tokens", {"num_global": 2, "window": 3}) for kernel in ("sdpa", "chunked", "reference")],
    *[(kernel, "dilated", {"window": 2, "dilation": (1, 2), "position_bias": "learned"})
      for kernel in ("sdpa", "chunked")],
]


@pytest.mark.parametrize(("kernel", "variant", "params"), PACKED_CASES)
def test_a_packed_row_equals_its_documents_run_alone(kernel, variant, params, float64_only) -> None:
    module = create_attention(variant, num_heads=HEADS, head_dim=16, kernel=kernel, **params)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    [result] = check_documents(module, kernel, {}, CPU, 0)
    assert result.status == "pass", result.message


def test_global_tokens_are_the_first_tokens_of_each_document() -> None:
    module = create_attention("global_tokens", num_global=1, window=0)
    q, k, v = _qkv(batch=1, n=6)
    ids = torch.tensor([[0, 0, 0, 1, 1, 1]])
    v = torch.zeros_like(v)
    v[:, :, 3] = 1.0  # only the second document's first token carries a value
    out = module(q, k, v, document_ids=ids)
    assert float(out[0, :, :3].abs().max()) == 0.0  # the first document never sees it
    assert bool((out[0, :, 4:] > 0).all())  # the second document's rows all see their global token


class _UnpackedKernel(ReferenceKernel):
    """A broken kernel: says it runs packed calls, runs them unpacked."""

    name = "test_unpacked"

    supports_document_ids = True

    def run(self, pattern, q, k, v, causal, key_mask):
        return super().run(pattern.within or pattern, q, k, v, causal, key_mask)


def test_the_kit_fails_a_kernel_that_ignores_the_documents(float64_only) -> None:
    register_kernel(_UnpackedKernel)
    try:
        module = create_attention("causal", num_heads=HEADS, head_dim=16, kernel="test_unpacked")
        [result] = check_documents(module, "test_unpacked", {}, CPU, 0)
    finally:
        unregister_kernel("test_unpacked")
    assert result.status == "fail"
    assert "a packed row differs from its documents run alone" in result.message


@pytest.mark.parametrize(("variant", "kernel", "reason"), [
    ("causal", "flex", "flex does not run packed sequences (document_ids)"),
    ("nystrom", "native", "native does not run packed sequences (document_ids)"),
])
def test_kernels_that_cannot_run_packed_calls_refuse_them(variant, kernel, reason, float64_only) -> None:
    module = create_attention(variant, num_heads=HEADS, head_dim=16)
    call = AttentionCall(CPU, torch.float32, variant == "causal", False, 37, 37, 16, has_document_ids=True)
    assert reason in module.not_supported_reasons(call, kernel=kernel)
    [result] = check_documents(module, kernel, {}, CPU, 0)
    assert result.status == "skip"


def test_blocked_runs_full_attention_on_packed_calls_only() -> None:
    module = create_attention("full", kernel="blocked")
    q, k, v = _qkv()
    with pytest.raises(NotImplementedError, match="blocked runs it on packed calls only"):
        module(q, k, v)
    module.kernel = "auto"
    module(q, k, v, document_ids=torch.zeros(2, 12, dtype=torch.int64))
    assert module.last_path.kernel == "blocked"


@pytest.mark.parametrize(("n", "kernel"), [(1024, "blocked"), (64, "sdpa")])
def test_auto_runs_long_packed_calls_on_blocked_and_short_banded_ones_on_sdpa(n, kernel) -> None:
    module = create_attention("sliding_window", window=4)
    call = AttentionCall(CPU, torch.float32, False, False, n, n, 16, has_document_ids=True)
    assert module.resolve_kernel(call) == kernel


def test_blocked_computes_each_document_alone(monkeypatch) -> None:
    """No product spans two documents: every fused call is one document's length."""
    lengths = []
    real = packed_module.F.scaled_dot_product_attention

    def recording(q, k, v, **kwargs):
        lengths.append((q.shape[2], k.shape[2]))
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(packed_module.F, "scaled_dot_product_attention", recording)
    q, k, v = make_inputs((2, HEADS, 37, 37, 16, 16), torch.float32, CPU, 0)
    module = create_attention("causal", kernel="blocked")
    module(q, k, v, document_ids=row_ids(ROW_DOCUMENTS, CPU))
    assert lengths == [(n, n) for row in ROW_DOCUMENTS for n in row]
    assert module.last_path.path == "per document (5 documents in 2 rows: fused sdpa)"
