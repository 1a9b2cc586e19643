"""The checks of the conformance kit (what each proves: docs/contract.md); :data:`CHECKS` in run order."""

from __future__ import annotations

import copy
import itertools

import torch
from torch import Tensor

from attn.base import Attention
from attn.conformance.documents import check_documents
from attn.conformance.grouped import check_grouped_query
from attn.conformance.harness import (
    ATOL,
    GRAD_ATOL,
    GRAD_RTOL,
    HEADS,
    NONE_RAN,
    PROBE_EPS,
    PROBE_LEN,
    PROBE_STEP,
    SWEEP_BATCH,
    SWEEP_DIM,
    SWEEP_LENGTHS,
    Failure,
    active_shapes,
    call_module,
    causal_options,
    check,
    dense_reference,
    describe,
    for_cases,
    for_precisions,
    gradient_error,
    guarded,
    in_precision,
    make_inputs,
    make_key_mask,
    reference_output,
    refusals,
    where_differs,
)
from attn.conformance.report import CheckResult
from attn.kernels import get_kernel
from attn.kernels.reference import dense_attention
from attn.mods import dense_allowed


@check("shape_dtype_finite")
def _check_shape(module, kernel, device, seed) -> str | None:
    def body(typed, dtype, shape, causal, key_mask) -> None:
        q, k, v = make_inputs(shape, dtype, device, seed)
        with torch.no_grad():
            out = call_module(typed, q, k, v, causal, key_mask)
        b, h, nq, _, _, dv = shape
        where = describe(shape, dtype, causal, key_mask)
        if tuple(out.shape) != (b, h, nq, dv):
            raise Failure(f"output shape {tuple(out.shape)} != (B, H, Nq, Dv) {(b, h, nq, dv)} [{where}]")
        if out.dtype != dtype:
            raise Failure(f"output dtype {out.dtype} != input dtype {dtype} [{where}]")
        if not torch.isfinite(out).all():
            raise Failure(f"output has NaN/inf [{where}]")

    return None if for_precisions(module, kernel, device, body) else NONE_RAN


@check("matches_reference")
def _check_reference(module, kernel, device, seed) -> str | None:
    if not module.exact and not _has_definition(module, device):
        if module.convergence_param is not None:
            return "approximate variant: compared with full attention by 'converges'"
        return "approximate variant without a definition to compare with (reference_forward)"
    what = "the dense reference of its own mask_mod/score_mod" if module.exact else (
        "its own definition computed directly (reference_forward)")

    def body(typed, dtype, shape, causal, key_mask) -> None:
        q, k, v = make_inputs(shape, dtype, device, seed)
        with torch.no_grad():
            out = call_module(typed, q, k, v, causal, key_mask)
            ref = reference_output(module if module.exact else typed, q, k, v, causal, key_mask)
        diff = (out.double() - ref).abs()
        # an approximation's outputs are not bounded by |v| (Linformer's F V sums Nk values):
        # its tolerance scales with the largest reference output (never below the exact one)
        atol = ATOL[dtype] if module.exact else ATOL[dtype] * max(1.0, float(ref.abs().max()))
        if not float(diff.max()) <= atol:
            raise Failure(
                f"differs from {what}: max |out - ref| = "
                f"{float(diff.max()):.3g} > atol {atol:g} "
                f"{where_differs(diff, shape[2], shape[3])} [{describe(shape, dtype, causal, key_mask)}]"
            )

    return None if for_precisions(module, kernel, device, body) else NONE_RAN


def _has_definition(module: Attention, device) -> bool:
    """True when an approximate ``module`` gives its definition (``reference_forward``)."""
    q = torch.zeros(1, module.num_heads or HEADS, 2, 16, dtype=torch.float64, device=device)
    with torch.no_grad():
        return copy.deepcopy(module).double().reference_forward(q, q, q, False, None) is not None


@check("gradients")
def _check_gradients(module, kernel, device, seed) -> str | None:
    module, dtype = in_precision(module, kernel, device, grad=True)

    def body(shape, causal, key_mask) -> None:
        where = describe(shape, dtype, causal, key_mask)
        q, k, v = (t.requires_grad_() for t in make_inputs(shape, dtype, device, seed))
        gen = torch.Generator().manual_seed(seed + 3)
        weight = torch.randn(shape[0], shape[1], shape[2], shape[5], generator=gen, dtype=dtype)
        module.zero_grad(set_to_none=True)
        (call_module(module, q, k, v, causal, key_mask) * weight.to(device)).sum().backward()
        grads = [("q", q.grad), ("k", k.grad), ("v", v.grad)] + [
            (f"parameter {n}", p.grad) for n, p in module.named_parameters() if p.requires_grad
        ]
        for label, grad in grads:
            if grad is None or not torch.isfinite(grad).all():
                raise Failure(f"gradient of {label} is missing or not finite [{where}]")
        if key_mask is not None:
            _check_empty_row_gradients(module, shape, dtype, device, seed, causal, key_mask, where)
        if not module.exact:
            return
        # the float64 reference of the same (rounded) inputs, parameters and upstream gradient
        q2, k2, v2 = (t.detach().double().requires_grad_() for t in (q, k, v))
        ref_module = copy.deepcopy(module).double()
        ref_module.zero_grad(set_to_none=True)
        ref = dense_reference(ref_module, q2, k2, v2, causal, key_mask)
        (ref * weight.to(device).double()).sum().backward()
        ref_grads = [q2.grad, k2.grad, v2.grad] + [p.grad for p in ref_module.parameters() if p.requires_grad]
        for (label, grad), ref_grad in zip(grads, ref_grads):
            err, tol = gradient_error(grad, ref_grad, dtype)
            if not err <= tol:
                scale = float(ref_grad.abs().max())
                raise Failure(
                    f"gradient of {label} differs from the reference by {err:.3g} > {tol:.3g} "
                    f"(atol {GRAD_ATOL[dtype]:g} + rtol {GRAD_RTOL[dtype]:g} x max |reference "
                    f"gradient| {scale:.3g}) [{where}]"
                )

    ran = for_cases(module, kernel, device, dtype, True, body)
    return None if ran else "kernel supports no backward pass on this device"


def _check_empty_row_gradients(module, shape, dtype, device, seed, causal, key_mask, where) -> None:
    """An all-padded batch row must get zero, finite input gradients (a tiny-clamp division gives NaN)."""
    q, k, v = (t.requires_grad_() for t in make_inputs(shape, dtype, device, seed))
    none = key_mask.clone()
    none[0] = False
    grads = torch.autograd.grad((call_module(module, q, k, v, causal, none) * 8.0).sum(), [q, k, v])
    for label, grad in zip("qkv", grads):
        if not torch.isfinite(grad).all() or float(grad[0].abs().max()) != 0.0:
            raise Failure(f"gradient of {label} for a batch row whose keys are all padding must "
                           f"be finite zeros; got max |grad| = {float(grad[0].abs().max()):.3g} [{where}]")


@check("pattern")
def _check_pattern(module, kernel, device, seed) -> str | None:
    if not module.exact:
        return "approximate variant: no exact pattern"
    module, dtype = in_precision(module, kernel, device, grad=False)
    ran = False
    shape = (1, HEADS, PROBE_LEN, PROBE_LEN, 16, 16)
    if get_kernel(kernel).compiles_per_shape:  # probe at a shape it has compiled already
        shape = active_shapes.get()[0]
    length = shape[2]
    for causal in causal_options(module):
        if refusals(module, kernel, device, dtype, causal, False, shape):
            continue
        ran = True
        q, k, v = make_inputs(shape, dtype, device, seed)
        effective = _effective_pattern(module, q, k, v, causal)  # (H, N, N)
        expected = dense_allowed(
            module.mask_mod(), batch=1, heads=HEADS, q_len=length, k_len=length,
            causal=causal or module.forces_causal, key_mask=None, device=device,
        )
        expected = (
            torch.ones(HEADS, length, length, dtype=torch.bool, device=device)
            if expected is None else expected.expand(1, HEADS, length, length)[0]
        )
        wrong = (effective != expected).nonzero().tolist()
        if wrong:
            pairs = ", ".join(
                f"(i={i}, j={j}, head {h}: definition {'allows' if expected[h, i, j] else 'forbids'}, "
                f"kernel {'uses' if effective[h, i, j] else 'ignores'} it)"
                for h, i, j in wrong[:5]
            )
            raise Failure(
                f"attention pattern differs from the mask_mod at {len(wrong)} (head, i, j) pairs, "
                f"e.g. {pairs} [N={length}, causal={causal}]"
            )
    return None if ran else NONE_RAN


def _effective_pattern(module: Attention, q, k, v, causal) -> Tensor:
    """Which keys influence which queries of batch 0, probed one value row at a time."""
    length = k.shape[2]
    with torch.no_grad():
        base = call_module(module, q, k, v, causal, None)  # (1, H, N, Dv)
        cols = []
        for j in range(length):
            v2 = v.clone()
            v2[:, :, j] += PROBE_STEP[v.dtype]
            moved = (call_module(module, q, k, v2, causal, None) - base).abs().amax(-1)[0]  # (H, N)
            cols.append(moved > PROBE_EPS[q.dtype])
    return torch.stack(cols, dim=-1)  # (H, Nq, Nk)


@check("causal_no_leak")
def _check_causal(module, kernel, device, seed) -> str | None:
    if not (module.supports_causal or module.forces_causal):
        return "variant has no causal form"
    module, dtype = in_precision(module, kernel, device, grad=False)
    ran = False
    for shape in active_shapes.get()[:2]:  # a square and a decode-like shape the others run
        if refusals(module, kernel, device, dtype, True, False, shape):
            continue
        ran = True
        q, k, v = make_inputs(shape, dtype, device, seed)
        q_len, k_len = shape[2], shape[3]
        with torch.no_grad():
            base = call_module(module, q, k, v, True, None)
            for t in (k_len - q_len, k_len // 2, k_len - 2):
                k2, v2 = k.clone(), v.clone()
                k2[:, :, t + 1:] = torch.randn_like(k2[:, :, t + 1:]) * 3
                v2[:, :, t + 1:] = torch.randn_like(v2[:, :, t + 1:]) * 3
                out = call_module(module, q, k2, v2, True, None)
                rows = t - (k_len - q_len) + 1  # rows with absolute position <= t
                if rows <= 0:
                    continue
                moved = float((out[:, :, :rows] - base[:, :, :rows]).abs().max())
                if moved > ATOL[dtype]:
                    raise Failure(
                        f"future leakage under causal=True: outputs at positions <= {t} changed by "
                        f"{moved:.3g} when keys/values at positions > {t} were perturbed "
                        f"[Nq={q_len}, Nk={k_len}]"
                    )
    return None if ran else "kernel supports no causal call on this device"


@check("key_mask")
def _check_key_mask(module, kernel, device, seed) -> str | None:
    module, dtype = in_precision(module, kernel, device, grad=False)

    def body(shape, causal, case_mask) -> None:
        if case_mask is None:
            return  # this check masks every call: the case's masked twin makes the same calls
        batch, _, _, k_len = shape[:4]
        key_mask = make_key_mask(batch, k_len, device, seed)
        q, k, v = make_inputs(shape, dtype, device, seed)
        where = describe(shape, dtype, causal, key_mask)
        with torch.no_grad():
            base = call_module(module, q, k, v, causal, key_mask)
            pad = ~key_mask[:, None, :, None]  # (B, 1, Nk, 1)
            k2 = torch.where(pad, torch.randn_like(k) * 5, k)
            v2 = torch.where(pad, torch.randn_like(v) * 5, v)
            moved = float((call_module(module, q, k2, v2, causal, key_mask) - base).abs().max())
            if moved > ATOL[dtype]:
                raise Failure(
                    f"key_mask ignored: output changed by {moved:.3g} when padded keys/values "
                    f"(key_mask=False) were perturbed [{where}]"
                )
            none = key_mask.clone()
            none[0] = False
            out = call_module(module, q, k, v, causal, none)
            if not torch.isfinite(out).all():
                raise Failure(f"a batch row whose keys are all padding gives NaN/inf [{where}]")
            if float(out[0].abs().max()) != 0.0:
                raise Failure(
                    f"a batch row whose keys are all padding must give zeros; got max |out| = "
                    f"{float(out[0].abs().max()):.3g} [{where}]"
                )

    return None if for_cases(module, kernel, device, dtype, False, body) else NONE_RAN


@check("batch_independence")
def _check_batch(module, kernel, device, seed) -> str | None:
    module, dtype = in_precision(module, kernel, device, grad=False)
    shape = active_shapes.get()[0]  # B > 1, a shape the other checks run (compiled already)
    batch, k_len = shape[0], shape[3]
    causal = causal_options(module)[-1]
    key_mask = make_key_mask(batch, k_len, device, seed)
    if reasons := refusals(module, kernel, device, dtype, causal, False, shape, key_mask):
        return "; ".join(reasons)
    q, k, v = make_inputs(shape, dtype, device, seed)
    with torch.no_grad():
        together = call_module(module, q, k, v, causal, key_mask)
        for b in range(batch):
            # every other element's inputs replaced, at the same shape (no new compile)
            others = (torch.arange(batch, device=q.device) != b)[:, None, None, None]  # (B, 1, 1, 1)
            q2, k2, v2 = (torch.where(others, torch.randn_like(t) * 3, t) for t in (q, k, v))
            moved = float((call_module(module, q2, k2, v2, causal, key_mask)[b] - together[b]).abs().max())
            if moved > ATOL[dtype]:
                raise Failure(
                    f"batch element {b} changes by {moved:.3g} when the other elements' inputs "
                    "change: outputs depend on other batch elements"
                )
    return None


@check("shape_sweep")
def _check_shape_sweep(module, kernel, device, seed) -> str | None:
    """SWEEP_LENGTHS on one module, inputs inside NaN buffers, each against the dense reference."""
    if not get_kernel(kernel).compiles_per_shape:
        return f"kernel {kernel!r} compiles no code per call shape (compiles_per_shape is False)"
    if not module.exact:
        return "approximate variant: no exact reference to sweep against"
    module, dtype = in_precision(module, kernel, device, grad=False)
    module = copy.deepcopy(module)  # its own copy: the sweep's lengths are the first it runs
    causal = causal_options(module)[0]
    if reasons := refusals(module, kernel, device, dtype, causal, False):
        return "; ".join(reasons)
    heads = module.num_heads or HEADS
    with torch.no_grad():
        for index, length in enumerate(SWEEP_LENGTHS, start=1):
            shape = (SWEEP_BATCH, heads, length, length, SWEEP_DIM, SWEEP_DIM)
            q, k, v = (guarded(t) for t in make_inputs(shape, dtype, device, seed + index))
            out = call_module(module, q, k, v, causal, None)
            diff = (out.double() - reference_output(module, q, k, v, causal, None)).abs()
            if not float(diff.max()) <= ATOL[dtype]:
                ran = module.last_path
                raise Failure(
                    f"shape {index} of {len(SWEEP_LENGTHS)} run on one module differs from the dense "
                    f"reference: max |out - ref| = {float(diff.max()):.3g} > atol {ATOL[dtype]:g} "
                    f"{where_differs(diff.nan_to_num(float('inf')), length, length)} "
                    f"[{describe(shape, dtype, causal, None)}; ran {getattr(ran, 'path', None)!r}, "
                    f"fallback {getattr(ran, 'fallback', None)!r}]"
                )
    return None


CHECKS = (
    _check_shape, _check_reference, _check_gradients, _check_pattern,
    _check_causal, _check_key_mask, _check_batch, _check_shape_sweep, check_documents,
    check_grouped_query,
)


def check_convergence(build, base: Attention, params, device, seed) -> list[CheckResult]:
    """Approximation error against full attention must fall as the parameter grows, and at its
    last value be exact (``convergence_bound`` None) or within the variant's stated bound."""
    knob = base.convergence_param
    length = 45  # divisible by none of the smaller values: exercises the padded segments
    q, k, v = make_inputs((2, HEADS, length, length, 16, 16), torch.float64, device, seed)
    q, k = q * 0.5, k * 0.5
    full = dense_attention(q, k, v)
    errors: dict[int, float] = {}
    for value in base.convergence_values or (2, 4, 8, 16, 32, length):
        p = {**params, knob: value}
        p.pop("conv_kernel", None)  # the conv skip is an addition, not part of the approximation
        module = build("auto", HEADS, 16, p).to(device, torch.float64)
        with torch.no_grad():
            errors[value] = float((module(q, k, v) - full).abs().max())
    shown = ", ".join(f"{knob}={m}: {e:.2e}" for m, e in errors.items())
    values = list(errors)
    messages = []
    bound = base.convergence_bound
    if bound is None and not errors[values[-1]] <= 1e-8:
        messages.append(f"not exact at {knob}=N={length}: error {errors[values[-1]]:.3g}")
    if bound is not None and not errors[values[-1]] <= bound:
        messages.append(f"error {errors[values[-1]]:.3g} at {knob}={values[-1]} above its bound {bound:g}")
    rising = [(a, b) for a, b in itertools.pairwise(values) if errors[b] > errors[a] * 1.05 + 1e-12]
    if rising or not errors[values[-2]] < errors[values[0]]:
        messages.append(f"error does not fall as {knob} grows")
    status = "fail" if messages else "pass"
    return [CheckResult("converges", base.kernel, params, status, "; ".join([*messages, shown]))]
