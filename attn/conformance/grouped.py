"""The kit's ``grouped_query`` check (docs/contract.md): k, v with ``H_kv < H`` heads equal the reference with k
and v repeated per group."""

from __future__ import annotations

import copy

import torch
from torch import Tensor

from attn.base import Attention
from attn.conformance.harness import (
    ATOL,
    HEADS,
    NONE_RAN,
    Failure,
    Skip,
    active_shapes,
    call_module,
    check,
    dense_reference,
    describe,
    gradient_error,
    in_precision,
    iter_cases,
    make_inputs,
    refusals,
    where_differs,
)
from attn.kernels import get_kernel

#: the key heads the check gives the kit's HEADS query heads: GQA (2 per key head) and MQA
KV_HEADS: tuple[int, ...] = (HEADS // 2, 1)


def _repeated(x: Tensor, heads: int) -> Tensor:
    """``x (B, H_kv, N, E)`` with each head repeated for its group: ``(B, H, N, E)``."""
    return x.repeat_interleave(heads // x.shape[1], dim=1)


def _reference(module: Attention, q: Tensor, k: Tensor, v: Tensor, causal: bool,
               key_mask: Tensor | None) -> Tensor:
    """The float64 dense reference on the repeated heads (exact), or the module itself on them."""
    heads = q.shape[1]
    if not module.exact:
        return call_module(module, q, _repeated(k, heads), _repeated(v, heads), causal, key_mask)
    return dense_reference(module, q.double(), _repeated(k.double(), heads), _repeated(v.double(), heads), causal,
                           key_mask)


@check("grouped_query")
def check_grouped_query(module, kernel, device, seed) -> str | None:
    """GQA and MQA calls against the repeated-heads reference, forward and gradients."""
    module, dtype = in_precision(module, kernel, device, grad=False)
    compiles = get_kernel(kernel).compiles_per_shape
    ran = False
    for index, (shape, causal, key_mask) in enumerate(iter_cases(module, device)):
        if compiles and index > 0:  # a compile per case: the first case is enough
            break
        # GQA and MQA alternate so that across the shapes each meets every (causal, key_mask) pair
        turns = KV_HEADS if compiles else (KV_HEADS[(index + active_shapes.get().index(shape)) % len(KV_HEADS)],)
        for kv_heads in turns:
            groups = shape[1] // kv_heads
            reasons = refusals(module, kernel, device, dtype, causal, False, shape, key_mask, groups)
            if reasons and not refusals(module, kernel, device, dtype, causal, False, shape, key_mask):
                raise Skip(f"GQA: not supported ({'; '.join(reasons)})")
            if reasons:
                continue
            grad = not refusals(module, kernel, device, dtype, causal, True, shape, key_mask, groups)
            _compare(module, shape, dtype, device, seed, causal, key_mask, kv_heads, grad)
            ran = True
    return None if ran else NONE_RAN


def _compare(module: Attention, shape, dtype, device, seed, causal, key_mask, kv_heads: int,
             grad: bool) -> None:
    """One case with ``kv_heads`` key heads: the output and, when ``grad``, every gradient."""
    where = f"{describe(shape, dtype, causal, key_mask)} H_kv={kv_heads}"
    q, k, v = make_inputs(shape, dtype, device, seed)
    k, v = k[:, :kv_heads], v[:, :kv_heads]  # (B, H_kv, Nk, .)
    if grad:
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    reference = copy.deepcopy(module)
    if module.exact:
        reference = reference.double()
    with torch.set_grad_enabled(grad):
        module.zero_grad(set_to_none=True)
        out = call_module(module, q, k, v, causal, key_mask)  # (B, H, Nq, Dv)
        ref_dtype = torch.float64 if module.exact else dtype
        refs = tuple(t.detach().to(ref_dtype).requires_grad_(grad) for t in (q, k, v))
        ref = _reference(reference, *refs, causal, key_mask)
    diff = (out.detach().double() - ref.detach().double()).abs()
    if not float(diff.max()) <= ATOL[dtype]:
        raise Failure(f"k, v with {kv_heads} of {shape[1]} heads differ from the reference with k, v "
                      f"repeated per group: max |out - ref| = {float(diff.max()):.3g} > atol "
                      f"{ATOL[dtype]:g} {where_differs(diff, shape[2], shape[3])} [{where}]")
    if not grad:
        return
    gen = torch.Generator().manual_seed(seed + 5)
    weight = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(device)
    (out * weight.to(out.dtype)).sum().backward()
    (ref * weight.to(ref.dtype)).sum().backward()
    pairs = [("q", q.grad, refs[0].grad), ("k", k.grad, refs[1].grad), ("v", v.grad, refs[2].grad)]
    pairs += [(f"parameter {n}", p.grad, r.grad) for (n, p), r in
              zip(module.named_parameters(), reference.parameters()) if p.requires_grad]
    for label, got, expected in pairs:
        if got is None or expected is None:
            raise Failure(f"gradient of {label} is missing [{where}]")
        err, tol = gradient_error(got, expected, dtype)
        if not err <= tol:
            raise Failure(f"gradient of {label} with {kv_heads} key heads differs from the reference "
                          f"with k, v repeated per group by {err:.3g} > {tol:.3g} [{where}]")
