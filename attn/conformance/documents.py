"""The kit's ``documents`` check (docs/contract.md): a packed row equals each of its documents run alone through
the dense float64 reference, outputs and gradients."""

from __future__ import annotations

import copy

import torch
from torch import Tensor

from attn.base import Attention
from attn.call import AttentionCall
from attn.conformance.harness import (
    ATOL,
    HEADS,
    Failure,
    Skip,
    active_dtypes,
    causal_options,
    check,
    dense_reference,
    gradient_error,
    make_inputs,
    make_key_mask,
    typed_copy,
)

#: document lengths of each packed row, each summing to :data:`PACKED_LEN`
ROW_DOCUMENTS: tuple[tuple[int, ...], ...] = ((9, 1, 21, 6), (37,))
PACKED_LEN = 37


def row_ids(rows: tuple[tuple[int, ...], ...], device: torch.device) -> Tensor:
    """``document_ids (B, N)`` of rows of document lengths, ids increasing along each row."""
    ids = [torch.repeat_interleave(torch.arange(len(r)) + 10 * b, torch.tensor(r)) for b, r in enumerate(rows)]
    return torch.stack(ids).to(device)  # (B, N)


def alone(module: Attention, q: Tensor, k: Tensor, v: Tensor, causal: bool,
          key_mask: Tensor | None) -> Tensor:
    """The dense float64 reference of every document of :data:`ROW_DOCUMENTS` run alone, concatenated."""
    rows = []
    for b, lengths in enumerate(ROW_DOCUMENTS):
        parts, start = [], 0
        for length in lengths:
            end = start + length
            mask = None if key_mask is None else key_mask[b : b + 1, start:end]
            qs, ks, vs = (t[b : b + 1, :, start:end] for t in (q, k, v))
            parts.append(dense_reference(module, qs, ks, vs, causal, mask))  # (1, H, n_d, Dv)
            start = end
        rows.append(torch.cat(parts, dim=2))
    return torch.cat(rows, dim=0)  # (B, H, N, Dv)


@check("documents")
def check_documents(module: Attention, kernel: str, device, seed) -> str | None:
    """Packed rows against each document alone; skipped where the kernel refuses packed calls."""
    if not module.exact:
        return "approximate variant: its own implementation takes no document_ids"
    shape = (len(ROW_DOCUMENTS), HEADS, PACKED_LEN, PACKED_LEN, 16, 16)
    ids = row_ids(ROW_DOCUMENTS, device)
    refused: list[str] = []
    ran = False
    for dtype in active_dtypes.get():
        typed = typed_copy(module, dtype)
        for causal in causal_options(module):
            for masked in (False, True):
                key_mask = make_key_mask(shape[0], PACKED_LEN, device, seed) if masked else None
                for grad in (False, True):
                    call = AttentionCall(device, dtype, causal, grad, PACKED_LEN, PACKED_LEN, 16,
                                         has_key_mask=masked, has_document_ids=True)
                    if reasons := typed.not_supported_reasons(call, kernel=kernel):
                        refused += reasons
                        continue
                    _compare(typed, dtype, shape, ids, causal, key_mask, grad, device, seed)
                    ran = True
    if not ran:
        raise Skip(f"refused: {'; '.join(dict.fromkeys(refused))}")
    return None


def _compare(module: Attention, dtype: torch.dtype, shape: tuple[int, ...], ids: Tensor, causal: bool,
             key_mask: Tensor | None, grad: bool, device, seed: int) -> None:
    """One packed call against the documents alone; with ``grad``, the gradients too."""
    where = (f"{str(dtype).removeprefix('torch.')} documents {[list(r) for r in ROW_DOCUMENTS]} H={HEADS} "
             f"causal={causal} key_mask={'yes' if key_mask is not None else 'no'}")
    q, k, v = (t.requires_grad_(grad) for t in make_inputs(shape, dtype, device, seed))
    module.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(grad):
        out = module(q, k, v, causal=causal, key_mask=key_mask, document_ids=ids)  # (B, H, N, Dv)
    ref_module = copy.deepcopy(module).double()
    ref_module.zero_grad(set_to_none=True)
    q2, k2, v2 = (t.detach().double().requires_grad_(grad) for t in (q, k, v))
    with torch.set_grad_enabled(grad):
        ref = alone(ref_module, q2, k2, v2, causal, key_mask)
    err = float((out.detach().double() - ref.detach()).abs().max())
    if not err <= ATOL[dtype]:
        raise Failure(f"a packed row differs from its documents run alone: max |out - ref| = "
                      f"{err:.3g} > atol {ATOL[dtype]:g} [{where}; ran "
                      f"{getattr(module.last_path, 'path', None)!r}]")
    if not grad:
        return
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 5), dtype=torch.float64)
    (out * weight.to(device, dtype)).sum().backward()
    (ref * weight.to(device)).sum().backward()
    pairs = [("q", q.grad, q2.grad), ("k", k.grad, k2.grad), ("v", v.grad, v2.grad)]
    pairs += [(f"parameter {n}", p.grad, p2.grad) for (n, p), p2 in
              zip(module.named_parameters(), ref_module.parameters(), strict=True) if p.requires_grad]
    for label, got, want in pairs:
        if got is None or not bool(torch.isfinite(got).all()):
            raise Failure(f"gradient of {label} of a packed call is missing or not finite [{where}]")
        err, tol = gradient_error(got, want, dtype)
        if not err <= tol:
            raise Failure(f"gradient of {label} of a packed row differs from its documents run "
                          f"alone by {err:.3g} > {tol:.3g} [{where}]")
