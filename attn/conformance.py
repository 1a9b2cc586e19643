"""The conformance kit: one function proving that an attention keeps the contract.

    from attn.conformance import check_attention
    report = check_attention("sliding_window")          # or a factory / class
    report.raise_if_failed()                             # AssertionError listing failures

Checks, for every parameter set and every kernel the variant declares (a kernel that
does not support a call is reported as skipped with its reason):

- ``shape_dtype_finite``: output (B, H, Nq, Dv), input dtype, finite values;
- ``matches_reference``: exact variants equal the dense reference built from their own
  mask_mod / score_mod (fp64 atol 1e-10, fp32 1e-5) for odd lengths, B > 1, H > 1,
  Nq != Nk, with and without ``key_mask`` and ``causal``, contiguous and head-split
  (non-contiguous) inputs;
- ``gradients``: finite, and for exact variants equal to the reference's (fp64) for
  q, k, v and the module's own parameters;
- ``pattern``: the keys that actually influence each query (probed by perturbing one
  value row at a time) are exactly those the mask_mod allows, so an off-by-one window is
  named by the (i, j) pairs where it differs;
- ``causal_no_leak``: perturbing keys/values after position t leaves rows <= t unchanged;
- ``key_mask``: perturbing padded keys changes nothing; an all-padding row gives zeros;
- ``batch_independence``: each batch element alone gives the same output as in the batch;
- ``shape_sweep`` (kernels that compile per call shape): one module runs many successive
  lengths (more than dynamo's recompile limit, including key lengths 8 past a multiple of
  16) with q, k, v lying inside NaN-filled buffers, and each output must equal the dense
  reference, so a stale compiled entry or a kernel reading past its inputs is named by shape;
- ``converges`` (approximate variants with ``convergence_param``): error against full
  attention falls as the parameter grows and is exact once it reaches N.
"""

from __future__ import annotations

import copy
import functools
import itertools
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from attn.base import Attention
from attn.call import AttentionCall
from attn.kernels import get_kernel
from attn.kernels.reference import dense_attention
from attn.registry import attention_info, build_attention, create_attention

#: (B, H, Nq, Nk, D, Dv) shapes: odd lengths, B > 1, H > 1, Nq < Nk (decode), Nq > Nk, and
#: lengths that are multiples of typical block sizes (no padding path in blocked kernels)
SHAPES: tuple[tuple[int, int, int, int, int, int], ...] = (
    (2, 3, 37, 37, 16, 16),
    (2, 3, 13, 37, 16, 8),
    (1, 3, 1, 29, 16, 16),
    (2, 3, 41, 23, 16, 16),
    (2, 3, 32, 96, 16, 16),
)
#: the quick profile (compile-per-shape kernels): one square and one decode-like shape
QUICK_SHAPES = SHAPES[:2]
ATOL = {torch.float64: 1e-10, torch.float32: 1e-5}
GRAD_ATOL = {torch.float64: 1e-9, torch.float32: 1e-4}
PROBE_EPS = {torch.float64: 1e-12, torch.float32: 1e-6}  # "this key moved this output"
_shapes: ContextVar[tuple[tuple[int, int, int, int, int, int], ...]] = ContextVar("shapes", default=SHAPES)
PROBE_LEN = 13  # sequence length of the pattern probe
#: lengths of the shape sweep, all run on one module: 12 > dynamo's recompile limit (8); 24 and
#: 40 are 8 past a multiple of 16, the key lengths where a CPU micro-kernel overran its block
SWEEP_LENGTHS: tuple[int, ...] = (17, 19, 20, 23, 24, 25, 28, 31, 33, 36, 39, 40)
SWEEP_BATCH, SWEEP_DIM = 2, 16
GUARD_ROWS = 32  # NaN rows after every swept input: a kernel reading past its inputs gives NaN


@dataclass(frozen=True)
class CheckResult:
    """Outcome of one check for one (params, kernel)."""

    check: str
    kernel: str
    params: dict[str, Any]
    status: str  # "pass" | "fail" | "skip"
    message: str = ""

    def __str__(self) -> str:
        head = f"[{self.status.upper()}] {self.check} kernel={self.kernel} params={self.params}"
        return f"{head}: {self.message}" if self.message else head


@dataclass
class ConformanceReport:
    """All check results for one attention."""

    name: str
    results: list[CheckResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """True when no check failed (skips are allowed)."""
        return not any(r.status == "fail" for r in self.results)

    @property
    def failures(self) -> list[str]:
        """One line per failed check, saying what is wrong."""
        return [str(r) for r in self.results if r.status == "fail"]

    def raise_if_failed(self) -> None:
        """Raise ``AssertionError`` listing every failure."""
        if not self.passed:
            raise AssertionError(
                f"{self.name} failed {len(self.failures)} conformance check(s):\n"
                + "\n".join(self.failures)
            )

    def __str__(self) -> str:
        counts = {s: sum(r.status == s for r in self.results) for s in ("pass", "fail", "skip")}
        lines = [
            f"conformance of {self.name!r}: {counts['pass']} passed, {counts['fail']} failed, "
            f"{counts['skip']} skipped"
        ]
        lines += [str(r) for r in self.results if r.status != "pass"]
        return "\n".join(lines)


Factory = Callable[..., Attention]


class _Failure(Exception):
    """Raised inside a check to fail it with a message."""


def check_attention(
    attention: str | Factory,
    *,
    params: dict[str, Any] | Sequence[dict[str, Any]] | None = None,
    kernels: Sequence[str] | None = None,
    device: str | torch.device = "cpu",
    seed: int = 0,
    quick: bool = False,
) -> ConformanceReport:
    """Run the conformance checks on a registered name or a factory/class.

    ``params``: one dict or several (default: the variant's ``example_params``).
    ``kernels``: which kernels to check (default: every kernel the variant declares).
    ``quick``: the first parameter set and two shapes only (for kernels that compile per
    shape, e.g. ``flex`` on CPU); every check still runs.
    """
    token = _shapes.set(QUICK_SHAPES if quick else SHAPES)
    try:
        return _check_all(attention, params, kernels, torch.device(device), seed, quick)
    finally:
        _shapes.reset(token)


def _check_all(attention, params, kernels, device: torch.device, seed: int, quick: bool) -> ConformanceReport:
    if isinstance(attention, str):
        name = attention
        param_sets = list(attention_info(name).example_params)

        def build(kernel: str, heads: int, dim: int, p: dict[str, Any]) -> Attention:
            return create_attention(name, num_heads=heads, head_dim=dim, kernel=kernel, **p)

    else:
        name = getattr(attention, "name", getattr(attention, "__name__", repr(attention)))
        param_sets = list(getattr(attention, "example_params", ({},)))

        def build(kernel: str, heads: int, dim: int, p: dict[str, Any]) -> Attention:
            return build_attention(attention, name=name, kernel=kernel, num_heads=heads,
                                   head_dim=dim, **p)

    if params is not None:
        param_sets = [params] if isinstance(params, dict) else list(params)
    if quick:
        param_sets = param_sets[:1]
    report = ConformanceReport(name)
    for p in param_sets:
        heads, dim = SHAPES[0][1], SHAPES[0][4]
        try:
            base = build("auto", heads, dim, p)
        except Exception as err:
            report.results.append(CheckResult("construct", "-", p, "fail", f"{type(err).__name__}: {err}"))
            continue
        _randomise_parameters(base, seed)
        for kernel in kernels if kernels is not None else base.kernels:
            module = copy.deepcopy(base).to(device)
            module.kernel = kernel
            for check in _CHECKS:
                report.results.extend(check(module, kernel, p, device, seed))
        if not base.exact and base.convergence_param is not None:
            report.results.extend(_check_convergence(build, base, p, device, seed))
    return report


def _randomise_parameters(module: Attention, seed: int) -> None:
    """Give learned parameters (e.g. a relative bias table) values large enough to matter."""
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=gen, dtype=param.dtype) * 0.5)


def _inputs(
    shape: tuple[int, int, int, int, int, int], dtype: torch.dtype, device: torch.device, seed: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Seeded q, k, v. Shapes with Nq != Nk come in the models' layout: (B, N, H, D) storage
    viewed as (B, H, N, D), i.e. non-contiguous, as a head split produces."""
    batch, heads, q_len, k_len, dim, v_dim = shape
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, q_len, dim, generator=gen, dtype=torch.float64)
    k = torch.randn(batch, heads, k_len, dim, generator=gen, dtype=torch.float64)
    v = torch.randn(batch, heads, k_len, v_dim, generator=gen, dtype=torch.float64)
    tensors = [t.to(device, dtype) for t in (q, k, v)]
    if q_len != k_len:
        tensors = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in tensors]  # (B, H, N, D) view
    return tensors[0], tensors[1], tensors[2]


def _key_mask(batch: int, k_len: int, device: torch.device, seed: int) -> Tensor:
    """Padding at the end of each row (lengths differ per row) plus a few holes; never all False."""
    gen = torch.Generator().manual_seed(seed + 7)
    mask = torch.rand(batch, k_len, generator=gen) > 0.25  # (B, Nk)
    for b in range(batch):
        mask[b, max(1, k_len - 3 - 4 * b):] = False
        mask[b, 0] = True
    return mask.to(device)


def _refusals(module: Attention, kernel: str, device, dtype, causal: bool, grad: bool,
              shape: tuple[int, ...] | None = None, key_mask: Tensor | None = None) -> list[str]:
    """Why ``kernel`` cannot run this case ([] = it can); without a ``shape``, any lengths."""
    lengths = {} if shape is None else {"q_len": shape[2], "k_len": shape[3], "head_dim": shape[4]}
    call = AttentionCall(device, dtype, causal, grad, has_key_mask=key_mask is not None, **lengths)
    return module.not_supported_reasons(call, kernel=kernel)


class _Skip(Exception):
    """Raised inside a check to skip it with a reason."""


def _in_precision(module: Attention, kernel: str, device, grad: bool) -> tuple[Attention, torch.dtype]:
    """A copy of ``module`` in float64 where the kernel supports it (tightest checks), else
    float32; the check is skipped when the kernel supports neither."""
    causal = _causal_options(module)[0]
    for dtype in (torch.float64, torch.float32):
        if not _refusals(module, kernel, device, dtype, causal, grad):
            return copy.deepcopy(module).to(dtype), dtype
    raise _Skip("kernel supports neither float64 nor float32 here")


def _causal_options(module: Attention) -> tuple[bool, ...]:
    if module.forces_causal:
        return (True,)
    return (False, True) if module.supports_causal else (False,)


class _NotSupported(Exception):
    """The module honestly refused this call (NotImplementedError): the case is skipped."""


def _run(module: Attention, q, k, v, causal, key_mask) -> Tensor:
    try:
        return module(q, k, v, causal=causal, key_mask=key_mask)
    except NotImplementedError as err:
        raise _NotSupported(str(err)) from err


def _describe(shape, dtype, causal, key_mask) -> str:
    b, h, nq, nk, d, dv = shape
    masked = "yes" if key_mask is not None else "no"
    dtype_name = str(dtype).replace("torch.", "")
    return f"{dtype_name} B={b} H={h} Nq={nq} Nk={nk} D={d} Dv={dv} causal={causal} key_mask={masked}"


def _where_differs(diff: Tensor, q_len: int, k_len: int) -> str:
    """Locate the largest difference in a (B, H, Nq, Dv) tensor."""
    flat = int(diff.argmax())
    b, h, row, _ = (int(x) for x in torch.unravel_index(torch.tensor(flat), diff.shape))
    return f"at b={b} h={h} query row {row} (absolute position {k_len - q_len + row})"


def _cases(module: Attention, device: torch.device) -> Iterator[tuple]:
    for shape in _shapes.get():
        batch, _, q_len, k_len = shape[:4]
        for causal in _causal_options(module):
            for masked in (False, True):
                key_mask = _key_mask(batch, k_len, device, seed=q_len) if masked else None
                yield shape, causal, key_mask


def _reference(module: Attention, q, k, v, causal, key_mask) -> Tensor:
    ref_module = copy.deepcopy(module).to(torch.float64)
    return dense_attention(
        q.double(), k.double(), v.double(),
        mask_mod=ref_module.mask_mod(), score_mod=ref_module.score_mod(),
        causal=causal or module.forces_causal, key_mask=key_mask,
    )


def _check(name: str):
    """Decorator: turn a check body that raises ``_Failure`` into CheckResults."""

    def wrap(body):
        def run(module: Attention, kernel: str, params, device, seed) -> list[CheckResult]:
            try:
                skipped = body(module, kernel, device, seed)
            except _NotSupported as err:
                return [CheckResult(name, kernel, params, "skip", f"refused: {err}")]
            except _Skip as err:
                return [CheckResult(name, kernel, params, "skip", str(err))]
            except _Failure as fail:
                return [CheckResult(name, kernel, params, "fail", str(fail))]
            except Exception as err:
                return [CheckResult(name, kernel, params, "fail", f"raised {type(err).__name__}: {err}")]
            if skipped:
                return [CheckResult(name, kernel, params, "skip", skipped)]
            return [CheckResult(name, kernel, params, "pass")]

        run.__name__ = name
        return run

    return wrap


def _for_cases(module: Attention, kernel: str, device, dtype, grad: bool, body) -> bool:
    """Run ``body(shape, causal, key_mask)`` on every supported case; True if any ran.

    A case the kernel does not support, or that the module refuses with
    NotImplementedError, is skipped; the check is skipped only if no case ran.
    """
    ran = False
    for shape, causal, key_mask in _cases(module, device):
        if _refusals(module, kernel, device, dtype, causal, grad, shape, key_mask):
            continue
        try:
            body(shape, causal, key_mask)
        except _NotSupported:
            continue
        ran = True
    return ran


NONE_RAN = "kernel supports none of the cases on this device"


def _for_both_precisions(module: Attention, kernel: str, device, body) -> bool:
    """``_for_cases`` in float64 and float32 on a copy of ``module`` in each precision;
    ``body(typed_module, dtype, shape, causal, key_mask)``."""
    ran = False
    for dtype in (torch.float64, torch.float32):
        typed = copy.deepcopy(module).to(dtype)
        ran |= _for_cases(typed, kernel, device, dtype, False, functools.partial(body, typed, dtype))
    return ran


@_check("shape_dtype_finite")
def _check_shape(module, kernel, device, seed) -> str | None:
    def body(typed, dtype, shape, causal, key_mask) -> None:
        q, k, v = _inputs(shape, dtype, device, seed)
        with torch.no_grad():
            out = _run(typed, q, k, v, causal, key_mask)
        b, h, nq, _, _, dv = shape
        where = _describe(shape, dtype, causal, key_mask)
        if tuple(out.shape) != (b, h, nq, dv):
            raise _Failure(f"output shape {tuple(out.shape)} != (B, H, Nq, Dv) {(b, h, nq, dv)} [{where}]")
        if out.dtype != dtype:
            raise _Failure(f"output dtype {out.dtype} != input dtype {dtype} [{where}]")
        if not torch.isfinite(out).all():
            raise _Failure(f"output has NaN/inf [{where}]")

    return None if _for_both_precisions(module, kernel, device, body) else NONE_RAN


@_check("matches_reference")
def _check_reference(module, kernel, device, seed) -> str | None:
    if not module.exact:
        return "approximate variant: compared with full attention by 'converges'"

    def body(typed, dtype, shape, causal, key_mask) -> None:
        q, k, v = _inputs(shape, dtype, device, seed)
        with torch.no_grad():
            out = _run(typed, q, k, v, causal, key_mask)
            ref = _reference(module, q, k, v, causal, key_mask)
        diff = (out.double() - ref).abs()
        if not float(diff.max()) <= ATOL[dtype]:
            raise _Failure(
                f"differs from the dense reference of its own mask_mod/score_mod: max |out - ref| = "
                f"{float(diff.max()):.3g} > atol {ATOL[dtype]:g} "
                f"{_where_differs(diff, shape[2], shape[3])} [{_describe(shape, dtype, causal, key_mask)}]"
            )

    return None if _for_both_precisions(module, kernel, device, body) else NONE_RAN


@_check("gradients")
def _check_gradients(module, kernel, device, seed) -> str | None:
    module, dtype = _in_precision(module, kernel, device, grad=True)

    def body(shape, causal, key_mask) -> None:
        where = _describe(shape, dtype, causal, key_mask)
        q, k, v = (t.requires_grad_() for t in _inputs(shape, dtype, device, seed))
        gen = torch.Generator().manual_seed(seed + 3)
        weight = torch.randn(shape[0], shape[1], shape[2], shape[5], generator=gen, dtype=dtype)
        module.zero_grad(set_to_none=True)
        (_run(module, q, k, v, causal, key_mask) * weight.to(device)).sum().backward()
        grads = [("q", q.grad), ("k", k.grad), ("v", v.grad)] + [
            (f"parameter {n}", p.grad) for n, p in module.named_parameters() if p.requires_grad
        ]
        for label, grad in grads:
            if grad is None or not torch.isfinite(grad).all():
                raise _Failure(f"gradient of {label} is missing or not finite [{where}]")
        if key_mask is not None:
            _check_empty_row_gradients(module, shape, dtype, device, seed, causal, key_mask, where)
        if not module.exact:
            return
        q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
        ref_module = copy.deepcopy(module)
        ref_module.zero_grad(set_to_none=True)
        ref = dense_attention(
            q2, k2, v2, mask_mod=ref_module.mask_mod(), score_mod=ref_module.score_mod(),
            causal=causal or module.forces_causal, key_mask=key_mask,
        )
        (ref * weight.to(device)).sum().backward()
        ref_grads = [q2.grad, k2.grad, v2.grad] + [
            p.grad for p in ref_module.parameters() if p.requires_grad
        ]
        for (label, grad), ref_grad in zip(grads, ref_grads):
            err = float((grad - ref_grad).abs().max())
            if not err <= GRAD_ATOL[dtype]:
                raise _Failure(
                    f"gradient of {label} differs from the reference by {err:.3g} > {GRAD_ATOL[dtype]:g} [{where}]"
                )

    ran = _for_cases(module, kernel, device, dtype, True, body)
    return None if ran else "kernel supports no backward pass on this device"


def _check_empty_row_gradients(module, shape, dtype, device, seed, causal, key_mask, where) -> None:
    """Batch row 0 with every key padded: its output is 0 whatever its inputs, so its input
    gradients must be 0 and finite, even under a large upstream gradient (a kernel that
    divides an empty row by a tiny clamp turns that into inf, then NaN)."""
    q, k, v = (t.requires_grad_() for t in _inputs(shape, dtype, device, seed))
    none = key_mask.clone()
    none[0] = False
    grads = torch.autograd.grad((_run(module, q, k, v, causal, none) * 8.0).sum(), [q, k, v])
    for label, grad in zip("qkv", grads):
        if not torch.isfinite(grad).all() or float(grad[0].abs().max()) != 0.0:
            raise _Failure(f"gradient of {label} for a batch row whose keys are all padding must "
                           f"be finite zeros; got max |grad| = {float(grad[0].abs().max()):.3g} [{where}]")


@_check("pattern")
def _check_pattern(module, kernel, device, seed) -> str | None:
    if not module.exact:
        return "approximate variant: no exact pattern"
    module, dtype = _in_precision(module, kernel, device, grad=False)
    ran = False
    shape = (1, 3, PROBE_LEN, PROBE_LEN, 16, 16)
    for causal in _causal_options(module):
        if _refusals(module, kernel, device, dtype, causal, False, shape):
            continue
        ran = True
        q, k, v = _inputs(shape, dtype, device, seed)
        effective = _effective_pattern(module, q, k, v, causal)  # (H, N, N)
        from attn.mods import dense_allowed

        expected = dense_allowed(
            module.mask_mod(), batch=1, heads=3, q_len=PROBE_LEN, k_len=PROBE_LEN,
            causal=causal or module.forces_causal, key_mask=None, device=device,
        )
        expected = (
            torch.ones(3, PROBE_LEN, PROBE_LEN, dtype=torch.bool, device=device)
            if expected is None else expected.expand(1, 3, PROBE_LEN, PROBE_LEN)[0]
        )
        wrong = (effective != expected).nonzero().tolist()
        if wrong:
            pairs = ", ".join(
                f"(i={i}, j={j}: definition {'allows' if expected[h, i, j] else 'forbids'}, "
                f"kernel {'uses' if effective[h, i, j] else 'ignores'} it)"
                for h, i, j in wrong[:5]
            )
            raise _Failure(
                f"attention pattern differs from the mask_mod at {len(wrong)} (head, i, j) pairs, "
                f"e.g. {pairs} [N={PROBE_LEN}, causal={causal}]"
            )
    return None if ran else NONE_RAN


def _effective_pattern(module: Attention, q, k, v, causal) -> Tensor:
    """Which keys influence which queries, probed by perturbing one value row at a time."""
    length = k.shape[2]
    with torch.no_grad():
        base = _run(module, q, k, v, causal, None)  # (1, H, N, Dv)
        cols = []
        for j in range(length):
            v2 = v.clone()
            v2[:, :, j] += 1.0
            moved = (_run(module, q, k, v2, causal, None) - base).abs().amax(-1)[0]  # (H, N)
            cols.append(moved > PROBE_EPS[q.dtype])
    return torch.stack(cols, dim=-1)  # (H, Nq, Nk)


@_check("causal_no_leak")
def _check_causal(module, kernel, device, seed) -> str | None:
    if not (module.supports_causal or module.forces_causal):
        return "variant has no causal form"
    module, dtype = _in_precision(module, kernel, device, grad=False)
    ran = False
    for shape in ((2, 3, 37, 37, 16, 16), (2, 3, 13, 37, 16, 16)):
        if _refusals(module, kernel, device, dtype, True, False, shape):
            continue
        ran = True
        q, k, v = _inputs(shape, dtype, device, seed)
        q_len, k_len = shape[2], shape[3]
        with torch.no_grad():
            base = _run(module, q, k, v, True, None)
            for t in (k_len - q_len, k_len // 2, k_len - 2):
                k2, v2 = k.clone(), v.clone()
                k2[:, :, t + 1:] = torch.randn_like(k2[:, :, t + 1:]) * 3
                v2[:, :, t + 1:] = torch.randn_like(v2[:, :, t + 1:]) * 3
                out = _run(module, q, k2, v2, True, None)
                rows = t - (k_len - q_len) + 1  # rows with absolute position <= t
                if rows <= 0:
                    continue
                moved = float((out[:, :, :rows] - base[:, :, :rows]).abs().max())
                if moved > ATOL[dtype]:
                    raise _Failure(
                        f"future leakage under causal=True: outputs at positions <= {t} changed by "
                        f"{moved:.3g} when keys/values at positions > {t} were perturbed "
                        f"[Nq={q_len}, Nk={k_len}]"
                    )
    return None if ran else "kernel supports no causal call on this device"


@_check("key_mask")
def _check_key_mask(module, kernel, device, seed) -> str | None:
    module, dtype = _in_precision(module, kernel, device, grad=False)

    def body(shape, causal, _unused) -> None:
        batch, _, _, k_len = shape[:4]
        key_mask = _key_mask(batch, k_len, device, seed)
        q, k, v = _inputs(shape, dtype, device, seed)
        where = _describe(shape, dtype, causal, key_mask)
        with torch.no_grad():
            base = _run(module, q, k, v, causal, key_mask)
            pad = ~key_mask[:, None, :, None]  # (B, 1, Nk, 1)
            k2 = torch.where(pad, torch.randn_like(k) * 5, k)
            v2 = torch.where(pad, torch.randn_like(v) * 5, v)
            moved = float((_run(module, q, k2, v2, causal, key_mask) - base).abs().max())
            if moved > ATOL[dtype]:
                raise _Failure(
                    f"key_mask ignored: output changed by {moved:.3g} when padded keys/values "
                    f"(key_mask=False) were perturbed [{where}]"
                )
            none = key_mask.clone()
            none[0] = False
            out = _run(module, q, k, v, causal, none)
            if not torch.isfinite(out).all():
                raise _Failure(f"a batch row whose keys are all padding gives NaN/inf [{where}]")
            if float(out[0].abs().max()) != 0.0:
                raise _Failure(
                    f"a batch row whose keys are all padding must give zeros; got max |out| = "
                    f"{float(out[0].abs().max()):.3g} [{where}]"
                )

    return None if _for_cases(module, kernel, device, dtype, False, body) else NONE_RAN


@_check("batch_independence")
def _check_batch(module, kernel, device, seed) -> str | None:
    module, dtype = _in_precision(module, kernel, device, grad=False)
    shape = (3, 3, 21, 21, 16, 16)
    causal = _causal_options(module)[-1]
    key_mask = _key_mask(3, 21, device, seed)
    if reasons := _refusals(module, kernel, device, dtype, causal, False, shape, key_mask):
        return "; ".join(reasons)
    q, k, v = _inputs(shape, dtype, device, seed)
    with torch.no_grad():
        together = _run(module, q, k, v, causal, key_mask)
        for b in range(3):
            alone = _run(module, q[b:b + 1], k[b:b + 1], v[b:b + 1], causal, key_mask[b:b + 1])
            moved = float((alone - together[b:b + 1]).abs().max())
            if moved > ATOL[dtype]:
                raise _Failure(
                    f"batch element {b} differs by {moved:.3g} when run alone: outputs depend on "
                    "other batch elements"
                )
    return None


def _guarded(t: Tensor, rows: int = GUARD_ROWS) -> Tensor:
    """A copy of ``t (B, H, N, D)`` as a view into a buffer whose ``rows`` rows after N are NaN."""
    batch, heads, length, dim = t.shape
    buf = torch.full((batch, heads, length + rows, dim), float("nan"), dtype=t.dtype, device=t.device)
    buf[:, :, :length] = t
    return buf[:, :, :length]  # (B, H, N, D), strides of (B, H, N + rows, D)


@_check("shape_sweep")
def _check_shape_sweep(module, kernel, device, seed) -> str | None:
    """Kernels that compile per call shape: SWEEP_LENGTHS on one module, inputs inside NaN
    buffers, each output against the dense reference (runs in the quick profile too)."""
    if not get_kernel(kernel).compiles_per_shape:
        return f"kernel {kernel!r} compiles no code per call shape (compiles_per_shape is False)"
    if not module.exact:
        return "approximate variant: no exact reference to sweep against"
    module, dtype = _in_precision(module, kernel, device, grad=False)
    causal = _causal_options(module)[0]
    if reasons := _refusals(module, kernel, device, dtype, causal, False):
        return "; ".join(reasons)
    heads = module.num_heads or SHAPES[0][1]
    with torch.no_grad():
        for index, length in enumerate(SWEEP_LENGTHS, start=1):
            shape = (SWEEP_BATCH, heads, length, length, SWEEP_DIM, SWEEP_DIM)
            q, k, v = (_guarded(t) for t in _inputs(shape, dtype, device, seed + index))
            out = _run(module, q, k, v, causal, None)
            diff = (out.double() - _reference(module, q, k, v, causal, None)).abs()
            if not float(diff.max()) <= ATOL[dtype]:
                ran = module.last_path
                raise _Failure(
                    f"shape {index} of {len(SWEEP_LENGTHS)} run on one module differs from the dense "
                    f"reference: max |out - ref| = {float(diff.max()):.3g} > atol {ATOL[dtype]:g} "
                    f"{_where_differs(diff.nan_to_num(float('inf')), length, length)} "
                    f"[{_describe(shape, dtype, causal, None)}; ran {getattr(ran, 'path', None)!r}, "
                    f"fallback {getattr(ran, 'fallback', None)!r}]"
                )
    return None


_CHECKS = (
    _check_shape, _check_reference, _check_gradients, _check_pattern,
    _check_causal, _check_key_mask, _check_batch, _check_shape_sweep,
)


def _check_convergence(build, base: Attention, params, device, seed) -> list[CheckResult]:
    """Approximation error against full attention must fall as the parameter grows to N."""
    knob = base.convergence_param
    length = 45  # divisible by none of the smaller values: exercises the padded segments
    q, k, v = _inputs((2, 3, length, length, 16, 16), torch.float64, device, seed)
    q, k = q * 0.5, k * 0.5
    full = dense_attention(q, k, v)
    errors: dict[int, float] = {}
    for value in (2, 4, 8, 16, 32, length):
        p = {**params, knob: value}
        p.pop("conv_kernel", None)  # the conv skip is an addition, not part of the approximation
        module = build("auto", 3, 16, p).to(device, torch.float64)
        with torch.no_grad():
            errors[value] = float((module(q, k, v) - full).abs().max())
    shown = ", ".join(f"{knob}={m}: {e:.2e}" for m, e in errors.items())
    values = list(errors)
    messages = []
    if not errors[values[-1]] <= 1e-8:
        messages.append(f"not exact at {knob}=N={length}: error {errors[values[-1]]:.3g}")
    rising = [(a, b) for a, b in itertools.pairwise(values) if errors[b] > errors[a] * 1.05 + 1e-12]
    if rising or not errors[values[-2]] < errors[values[0]]:
        messages.append(f"error does not fall as {knob} grows")
    status = "fail" if messages else "pass"
    return [CheckResult("converges", base.kernel, params, status, "; ".join([*messages, shown]))]
