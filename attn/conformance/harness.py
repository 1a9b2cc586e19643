"""The kit's harness: shapes, tolerances, seeded inputs, cases, and the :func:`check` decorator (a body raises
:class:`Failure` or :class:`Skip`, or returns a skip reason or None)."""

from __future__ import annotations

import copy
import functools
import weakref
from collections.abc import Iterator, Sequence
from contextvars import ContextVar, Token

import torch
from torch import Tensor

from attn.base import Attention
from attn.call import AttentionCall
from attn.conformance.report import CheckResult
from attn.kernels.reference import dense_attention

#: the kit's head count: divisible by 2 and 4, so per-head-group parameters have groups of several heads
HEADS = 4
#: (B, H, Nq, Nk, D, Dv): odd lengths, Nq < Nk (decode), Nq > Nk, and block multiples (no padding path)
SHAPES: tuple[tuple[int, int, int, int, int, int], ...] = (
    (2, HEADS, 37, 37, 16, 16),
    (2, HEADS, 13, 37, 16, 8),
    (1, HEADS, 1, 29, 16, 16),
    (2, HEADS, 41, 23, 16, 16),
    (2, HEADS, 32, 96, 16, 16),
)
#: the quick profile (compile-per-shape kernels): one square and one decode-like shape
QUICK_SHAPES = SHAPES[:2]
EXACT_DTYPES: tuple[torch.dtype, ...] = (torch.float64, torch.float32)
#: checked on request (``dtypes=``, ``--dtype``)
LOW_PRECISION_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16)
CHECK_DTYPES: tuple[torch.dtype, ...] = EXACT_DTYPES + LOW_PRECISION_DTYPES
#: max |out - ref| against the float64 reference of the same rounded inputs; a wrong mask moves
#: outputs by O(0.1..1), far above the low-precision bounds
ATOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 4e-2, torch.float16: 5e-3}
GRAD_ATOL = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 1.5e-1, torch.float16: 2e-2}
#: plus this fraction of the largest reference gradient (a bias table's gradient sums O(10..100) terms)
GRAD_RTOL = {torch.float64: 0.0, torch.float32: 0.0, torch.bfloat16: 8e-2, torch.float16: 1e-2}
#: "this key moved this output": above round-off; in bf16/fp16 a forbidden key moves nothing at all
PROBE_EPS = {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 0.0, torch.float16: 0.0}
#: what the pattern probe adds to one value row: large in low precision, so small weights still show
PROBE_STEP = {torch.float64: 1.0, torch.float32: 1.0, torch.bfloat16: 256.0, torch.float16: 256.0}
PROBE_LEN = 13  # sequence length of the pattern probe
#: shape sweep lengths on one module: 13 > dynamo's recompile limit; 24 and 40 are 8 past a multiple of
#: 16 (where a CPU micro-kernel overran); 185 is past ``flex``'s eager block-mask size
SWEEP_LENGTHS: tuple[int, ...] = (17, 19, 20, 23, 24, 25, 28, 31, 33, 36, 39, 40, 185)
SWEEP_BATCH, SWEEP_DIM = 2, 16
GUARD_ROWS = 32  # NaN rows after every swept input: a kernel reading past its inputs gives NaN
#: the shapes of the running check_attention call (SHAPES, or QUICK_SHAPES in the quick profile)
active_shapes: ContextVar[tuple[tuple[int, int, int, int, int, int], ...]] = ContextVar("shapes", default=SHAPES)
#: True in the quick profile: each (causal, key_mask) combination on one shape (:func:`iter_cases`)
covering_cases: ContextVar[bool] = ContextVar("covering_cases", default=False)


def enter_profile(quick: bool) -> tuple[Token, Token]:
    """Activate the quick or full profile's shapes and cases; returns tokens for :func:`leave_profile`."""
    return active_shapes.set(QUICK_SHAPES if quick else SHAPES), covering_cases.set(quick)


def leave_profile(tokens: tuple[Token, Token]) -> None:
    """Restore the profile that was active before :func:`enter_profile` returned ``tokens``."""
    shapes, covering = tokens
    active_shapes.reset(shapes)
    covering_cases.reset(covering)


#: the dtypes of the running check_attention call (EXACT_DTYPES unless it asked for others)
active_dtypes: ContextVar[tuple[torch.dtype, ...]] = ContextVar("dtypes", default=EXACT_DTYPES)
#: the running check_attention call's typed copies (:func:`typed_copy`); None: a fresh copy each time
typed_copies: ContextVar[weakref.WeakKeyDictionary | None] = ContextVar("typed_copies", default=None)


def dtypes_from(names: Sequence[str | torch.dtype] | None) -> tuple[torch.dtype, ...]:
    """The dtypes ``check_attention(dtypes=...)`` names, in the kit's order (None: :data:`EXACT_DTYPES`);
    ``ValueError`` names the allowed values."""
    if names is None:
        return EXACT_DTYPES
    allowed = {str(d).removeprefix("torch."): d for d in CHECK_DTYPES}
    chosen = set()
    for name in [names] if isinstance(names, (str, torch.dtype)) else names:
        dtype = allowed.get(name) if isinstance(name, str) else name
        if dtype not in CHECK_DTYPES:
            raise ValueError(f"dtypes: {name!r} is not a dtype the kit checks; allowed values are "
                             f"{list(allowed)}")
        chosen.add(dtype)
    if not chosen:
        raise ValueError(f"dtypes: name at least one of {list(allowed)}")
    return tuple(d for d in CHECK_DTYPES if d in chosen)


#: the reason a check gives when no case ran
NONE_RAN = "kernel supports none of the cases on this device"


class Failure(Exception):
    """Raised inside a check to fail it with a message."""


class Skip(Exception):
    """Raised inside a check to skip it with a reason."""


class NotSupported(Exception):
    """The module honestly refused this call (NotImplementedError): the case is skipped."""


def make_inputs(
    shape: tuple[int, int, int, int, int, int], dtype: torch.dtype, device: torch.device, seed: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Seeded q, k, v; shapes with Nq != Nk come non-contiguous, (B, N, H, D) storage viewed as a head split."""
    batch, heads, q_len, k_len, dim, v_dim = shape
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, q_len, dim, generator=gen, dtype=torch.float64)
    k = torch.randn(batch, heads, k_len, dim, generator=gen, dtype=torch.float64)
    v = torch.randn(batch, heads, k_len, v_dim, generator=gen, dtype=torch.float64)
    tensors = [t.to(device, dtype) for t in (q, k, v)]
    if q_len != k_len:
        tensors = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in tensors]  # (B, H, N, D) view
    return tensors[0], tensors[1], tensors[2]


def make_key_mask(batch: int, k_len: int, device: torch.device, seed: int) -> Tensor:
    """Padding at the end of each row (lengths differ per row) plus a few holes; never all False."""
    gen = torch.Generator().manual_seed(seed + 7)
    mask = torch.rand(batch, k_len, generator=gen) > 0.25  # (B, Nk)
    for b in range(batch):
        mask[b, max(1, k_len - 3 - 4 * b):] = False
        mask[b, 0] = True
    return mask.to(device)


def refusals(module: Attention, kernel: str, device, dtype, causal: bool, grad: bool,
             shape: tuple[int, ...] | None = None, key_mask: Tensor | None = None,
             kv_groups: int = 1) -> list[str]:
    """Why ``kernel`` cannot run this case ([] = it can); without a ``shape``, any lengths."""
    lengths = {} if shape is None else {"q_len": shape[2], "k_len": shape[3], "head_dim": shape[4]}
    call = AttentionCall(device, dtype, causal, grad, has_key_mask=key_mask is not None,
                         kv_groups=kv_groups, **lengths)
    return module.not_supported_reasons(call, kernel=kernel)


def typed_copy(module: Attention, dtype: torch.dtype) -> Attention:
    """One copy of ``module`` in ``dtype`` per check_attention call, shared by the checks of a kernel,
    so a kernel that caches compiled code per module compiles once per run. Checks clear its gradients."""
    memo = typed_copies.get()
    if memo is None:
        return copy.deepcopy(module).to(dtype)
    per_dtype = memo.setdefault(module, {})
    if dtype not in per_dtype:
        per_dtype[dtype] = copy.deepcopy(module).to(dtype)
    return per_dtype[dtype]


def in_precision(module: Attention, kernel: str, device, grad: bool) -> tuple[Attention, torch.dtype]:
    """A :func:`typed_copy` in the first checked dtype the kernel supports; :class:`Skip` when none."""
    causal = causal_options(module)[0]
    dtypes = active_dtypes.get()
    for dtype in dtypes:
        if not refusals(module, kernel, device, dtype, causal, grad):
            return typed_copy(module, dtype), dtype
    names = " / ".join(str(d).removeprefix("torch.") for d in dtypes)
    raise Skip(f"kernel supports none of {names} here")


def causal_options(module: Attention) -> tuple[bool, ...]:
    """The values of ``causal`` the module accepts (first: the one checks use by default)."""
    if module.forces_causal:
        return (True,)
    return (False, True) if module.supports_causal else (False,)


def call_module(module: Attention, q, k, v, causal, key_mask) -> Tensor:
    """``module(q, k, v, ...)``; a refusal (NotImplementedError) raises :class:`NotSupported`."""
    try:
        return module(q, k, v, causal=causal, key_mask=key_mask)
    except NotImplementedError as err:
        raise NotSupported(str(err)) from err


def describe(shape, dtype, causal, key_mask) -> str:
    """One case in words, for failure messages."""
    b, h, nq, nk, d, dv = shape
    masked = "yes" if key_mask is not None else "no"
    dtype_name = str(dtype).replace("torch.", "")
    return f"{dtype_name} B={b} H={h} Nq={nq} Nk={nk} D={d} Dv={dv} causal={causal} key_mask={masked}"


def where_differs(diff: Tensor, q_len: int, k_len: int) -> str:
    """Locate the largest difference in a (B, H, Nq, Dv) tensor."""
    flat = int(diff.argmax())
    b, h, row, _ = (int(x) for x in torch.unravel_index(torch.tensor(flat), diff.shape))
    return f"at b={b} h={h} query row {row} (absolute position {k_len - q_len + row})"


def iter_cases(module: Attention, device: torch.device) -> Iterator[tuple]:
    """``(shape, causal, key_mask)`` for every active shape, causal option, with and without padding; the quick
    profile runs each combination on one of its two shapes, alternating (half the compiles)."""
    covering = covering_cases.get()
    for index, shape in enumerate(active_shapes.get()):
        batch, _, q_len, k_len = shape[:4]
        for causal in causal_options(module):
            for masked in (False, True):
                if covering and (index + causal + masked) % 2:
                    continue  # this combination runs on the other shape
                key_mask = make_key_mask(batch, k_len, device, seed=q_len) if masked else None
                yield shape, causal, key_mask


def dense_reference(module: Attention, q: Tensor, k: Tensor, v: Tensor, causal: bool,
                    key_mask: Tensor | None) -> Tensor:
    """The dense reference of ``module``'s own mods on ``q, k, v`` in their dtype."""
    return dense_attention(q, k, v, mask_mod=module.mask_mod(), score_mod=module.score_mod(),
                           causal=causal or module.forces_causal, key_mask=key_mask)


def reference_output(module: Attention, q, k, v, causal, key_mask) -> Tensor:
    """The dense float64 reference from the module's own mods (an approximation's ``reference_forward``)."""
    ref_module = copy.deepcopy(module).to(torch.float64)
    if not module.exact:
        return ref_module.reference_forward(q.double(), k.double(), v.double(), causal, key_mask)
    return dense_reference(ref_module, q.double(), k.double(), v.double(), causal, key_mask)


def gradient_error(got: Tensor, expected: Tensor, dtype: torch.dtype) -> tuple[float, float]:
    """``max |got - expected|`` and its tolerance, ``GRAD_ATOL`` plus ``GRAD_RTOL`` x ``max |expected|``."""
    return (float((got.double() - expected.double()).abs().max()),
            GRAD_ATOL[dtype] + GRAD_RTOL[dtype] * float(expected.abs().max()))


def check(name: str):
    """Decorator: turn a check body that raises ``Failure`` into CheckResults."""

    def wrap(body):
        def run(module: Attention, kernel: str, params, device, seed) -> list[CheckResult]:
            try:
                skipped = body(module, kernel, device, seed)
            except NotSupported as err:
                return [CheckResult(name, kernel, params, "skip", f"refused: {err}")]
            except Skip as err:
                return [CheckResult(name, kernel, params, "skip", str(err))]
            except Failure as fail:
                return [CheckResult(name, kernel, params, "fail", str(fail))]
            except Exception as err:
                return [CheckResult(name, kernel, params, "fail", f"raised {type(err).__name__}: {err}")]
            if skipped:
                return [CheckResult(name, kernel, params, "skip", skipped)]
            return [CheckResult(name, kernel, params, "pass")]

        run.__name__ = name
        return run

    return wrap


def for_cases(module: Attention, kernel: str, device, dtype, grad: bool, body) -> bool:
    """Run ``body(shape, causal, key_mask)`` on every supported case; True if any ran (refusals skipped)."""
    ran = False
    for shape, causal, key_mask in iter_cases(module, device):
        if refusals(module, kernel, device, dtype, causal, grad, shape, key_mask):
            continue
        try:
            body(shape, causal, key_mask)
        except NotSupported:
            continue
        ran = True
    return ran


def for_precisions(module: Attention, kernel: str, device, body) -> bool:
    """``for_cases`` in every checked dtype on a :func:`typed_copy`; ``body(typed, dtype, shape, causal, key_mask)``."""
    ran = False
    for dtype in active_dtypes.get():
        typed = typed_copy(module, dtype)
        ran |= for_cases(typed, kernel, device, dtype, False, functools.partial(body, typed, dtype))
    return ran


def guarded(t: Tensor, rows: int = GUARD_ROWS) -> Tensor:
    """A copy of ``t (B, H, N, D)`` as a view into a buffer whose ``rows`` rows after N are NaN."""
    batch, heads, length, dim = t.shape
    buf = torch.full((batch, heads, length + rows, dim), float("nan"), dtype=t.dtype, device=t.device)
    buf[:, :, :length] = t
    return buf[:, :, :length]  # (B, H, N, D), strides of (B, H, N + rows, D)
