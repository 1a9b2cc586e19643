"""The kit's harness: shapes, tolerances, seeded inputs, the cases a kernel supports, and the
decorator that turns a check body into results.

A check body raises :class:`Failure` to fail with a message, :class:`Skip` to skip with a
reason, or returns a reason (skipped) or None (passed); a call the module refuses with
``NotImplementedError`` is skipped (:class:`NotSupported`).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator
from contextvars import ContextVar

import torch
from torch import Tensor

from attn.base import Attention
from attn.call import AttentionCall
from attn.conformance.report import CheckResult
from attn.kernels.reference import dense_attention

#: the kit's head count, in every shape and in the modules it builds (``num_heads``): > 1, and
#: divisible by 2 and 4 so that per-head-group parameters (e.g. ``dilated``'s
#: ``dilation=(1, 2)``) have groups of more than one head
HEADS = 4
#: (B, H, Nq, Nk, D, Dv) shapes: odd lengths, B > 1, H > 1, Nq < Nk (decode), Nq > Nk, and
#: lengths that are multiples of typical block sizes (no padding path in blocked kernels)
SHAPES: tuple[tuple[int, int, int, int, int, int], ...] = (
    (2, HEADS, 37, 37, 16, 16),
    (2, HEADS, 13, 37, 16, 8),
    (1, HEADS, 1, 29, 16, 16),
    (2, HEADS, 41, 23, 16, 16),
    (2, HEADS, 32, 96, 16, 16),
)
#: the quick profile (compile-per-shape kernels): one square and one decode-like shape
QUICK_SHAPES = SHAPES[:2]
ATOL = {torch.float64: 1e-10, torch.float32: 1e-5}
GRAD_ATOL = {torch.float64: 1e-9, torch.float32: 1e-4}
PROBE_EPS = {torch.float64: 1e-12, torch.float32: 1e-6}  # "this key moved this output"
PROBE_LEN = 13  # sequence length of the pattern probe
#: lengths of the shape sweep, all run on one module: 12 > dynamo's recompile limit (8); 24 and
#: 40 are 8 past a multiple of 16, the key lengths where a CPU micro-kernel overran its block
SWEEP_LENGTHS: tuple[int, ...] = (17, 19, 20, 23, 24, 25, 28, 31, 33, 36, 39, 40)
SWEEP_BATCH, SWEEP_DIM = 2, 16
GUARD_ROWS = 32  # NaN rows after every swept input: a kernel reading past its inputs gives NaN
#: the shapes of the running check_attention call (SHAPES, or QUICK_SHAPES in the quick profile)
active_shapes: ContextVar[tuple[tuple[int, int, int, int, int, int], ...]] = ContextVar("shapes", default=SHAPES)


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


def make_key_mask(batch: int, k_len: int, device: torch.device, seed: int) -> Tensor:
    """Padding at the end of each row (lengths differ per row) plus a few holes; never all False."""
    gen = torch.Generator().manual_seed(seed + 7)
    mask = torch.rand(batch, k_len, generator=gen) > 0.25  # (B, Nk)
    for b in range(batch):
        mask[b, max(1, k_len - 3 - 4 * b):] = False
        mask[b, 0] = True
    return mask.to(device)


def refusals(module: Attention, kernel: str, device, dtype, causal: bool, grad: bool,
             shape: tuple[int, ...] | None = None, key_mask: Tensor | None = None) -> list[str]:
    """Why ``kernel`` cannot run this case ([] = it can); without a ``shape``, any lengths."""
    lengths = {} if shape is None else {"q_len": shape[2], "k_len": shape[3], "head_dim": shape[4]}
    call = AttentionCall(device, dtype, causal, grad, has_key_mask=key_mask is not None, **lengths)
    return module.not_supported_reasons(call, kernel=kernel)


def in_precision(module: Attention, kernel: str, device, grad: bool) -> tuple[Attention, torch.dtype]:
    """A copy of ``module`` in float64 where the kernel supports it (tightest checks), else
    float32; the check is skipped when the kernel supports neither."""
    causal = causal_options(module)[0]
    for dtype in (torch.float64, torch.float32):
        if not refusals(module, kernel, device, dtype, causal, grad):
            return copy.deepcopy(module).to(dtype), dtype
    raise Skip("kernel supports neither float64 nor float32 here")


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
    """``(shape, causal, key_mask)`` for every active shape, causal option, with and without padding."""
    for shape in active_shapes.get():
        batch, _, q_len, k_len = shape[:4]
        for causal in causal_options(module):
            for masked in (False, True):
                key_mask = make_key_mask(batch, k_len, device, seed=q_len) if masked else None
                yield shape, causal, key_mask


def reference_output(module: Attention, q, k, v, causal, key_mask) -> Tensor:
    """The dense float64 reference built from the module's own mask_mod / score_mod."""
    ref_module = copy.deepcopy(module).to(torch.float64)
    return dense_attention(
        q.double(), k.double(), v.double(),
        mask_mod=ref_module.mask_mod(), score_mod=ref_module.score_mod(),
        causal=causal or module.forces_causal, key_mask=key_mask,
    )


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
    """Run ``body(shape, causal, key_mask)`` on every supported case; True if any ran.

    A case the kernel does not support, or that the module refuses with
    NotImplementedError, is skipped; the check is skipped only if no case ran.
    """
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


def for_both_precisions(module: Attention, kernel: str, device, body) -> bool:
    """``for_cases`` in float64 and float32 on a copy of ``module`` in each precision;
    ``body(typed_module, dtype, shape, causal, key_mask)``."""
    ran = False
    for dtype in (torch.float64, torch.float32):
        typed = copy.deepcopy(module).to(dtype)
        ran |= for_cases(typed, kernel, device, dtype, False, functools.partial(body, typed, dtype))
    return ran


def guarded(t: Tensor, rows: int = GUARD_ROWS) -> Tensor:
    """A copy of ``t (B, H, N, D)`` as a view into a buffer whose ``rows`` rows after N are NaN."""
    batch, heads, length, dim = t.shape
    buf = torch.full((batch, heads, length + rows, dim), float("nan"), dtype=t.dtype, device=t.device)
    buf[:, :, :length] = t
    return buf[:, :, :length]  # (B, H, N, D), strides of (B, H, N + rows, D)
