"""``kernel="auto"``: the fastest supported kernel for the call, by a fixed rule (docs/kernels.md,
which also holds the measurements behind it).

The pattern's kind picks a preference order per device type (:data:`AUTO_ORDER`; on CPU short
calls take :data:`SHORT_ORDER`); the first kernel the variant has that supports the call runs.
A variant's ``preferred_kernels`` come first, kernels the table omits next, ``reference`` last.
Kinds: *approximate* (not exact, or ``native``), *banded* (``band()`` set), *plain* (no mods),
*biased* (any other exact variant). Long packed calls try ``blocked`` first (one call per
document). On CUDA the CPU-tuned kernels (``blocked``, ``chunked``) come after flex and SDPA.

A tuning file written by ``attn-bench tune`` for this machine, device type, dtype and thread count
(:mod:`attn.kernels.tuning`) replaces a kind's orders and short-call limit per pass; the rest holds.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attn.call import AttentionCall
from attn.kernels import get_kernel, kernels_for
from attn.kernels.tuning import KindOrder, Tuning, active_tuning
from attn.pattern import Pattern

#: kernels tuned for CPU caches: on CUDA they come after every kernel built for the GPU
CPU_TUNED_KERNELS = ("blocked", "chunked")
#: kernels a packed call (``document_ids``) tries first, after the variant's own preferences
PACKED_FIRST: tuple[str, ...] = ("blocked",)
#: preference order per (device type, kind); kernels a variant lacks are skipped
AUTO_ORDER: dict[tuple[str, str], tuple[str, ...]] = {
    ("cpu", "banded"): ("blocked", "flex", "sdpa"),
    ("cpu", "plain"): ("sdpa", "chunked"),
    ("cpu", "biased"): ("relative", "chunked", "sdpa"),
    ("cpu", "approximate"): ("native",),
    ("cuda", "banded"): ("flex", "xformers", "sdpa", "blocked"),
    ("cuda", "plain"): ("sdpa", "xformers", "flex", "chunked"),
    ("cuda", "biased"): ("flex", "sdpa", "chunked"),
    ("cuda", "approximate"): ("native",),
}
#: short calls take another order: one dense call over a cached mask beats the O(N*w) / O(chunk*N) loops
SHORT_KEYS: dict[tuple[str, str], int] = {("cpu", "banded"): 768, ("cpu", "biased"): 1024}
SHORT_ORDER: dict[tuple[str, str], tuple[str, ...]] = {
    ("cpu", "banded"): ("sdpa", "blocked", "flex"),
    ("cpu", "biased"): ("sdpa", "relative", "chunked"),
}


def kernel_kind(pattern: Pattern) -> str:
    """``banded``, ``plain``, ``biased`` or ``approximate``: the row of the auto table."""
    if not pattern.exact or pattern.native is not None:
        return "approximate"
    if pattern.band is not None:
        return "banded"
    if pattern.mask_mod is None and pattern.score_mod is None:
        return "plain"
    return "biased"


def tuned_order(pattern: Pattern, device: torch.device, dtype: torch.dtype | None, grad: bool,
                tuning: Tuning | None = None) -> KindOrder | None:
    """The tuned order for ``pattern``'s kind on ``device`` (None: the fixed table). ``tuning`` None: the
    file in effect now (:func:`attn.kernels.tuning.active_tuning`); ``dtype`` None: the fixed table."""
    if tuning is None:
        if dtype is None:
            return None
        tuning = active_tuning(device, dtype)
    return tuning.order_for(kernel_kind(pattern), grad)


def auto_source(pattern: Pattern, device: torch.device | str, dtype: torch.dtype,
                tuning: Tuning | None = None) -> str:
    """Where ``auto``'s order for ``pattern`` comes from: ``tuned:<sha>``, ``default`` or ``default: <why>``."""
    tuning = active_tuning(device, dtype) if tuning is None else tuning
    return tuning.source_for(kernel_kind(pattern))


def short_keys(pattern: Pattern, device: torch.device, dtype: torch.dtype | None = None, grad: bool = False,
               *, tuning: Tuning | None = None) -> int | None:
    """Calls with fewer keys than this take the short-call order; None: no short order."""
    tuned = tuned_order(pattern, device, dtype, grad, tuning)
    if tuned is not None:
        return tuned.short_keys
    return SHORT_KEYS.get((torch.device(device).type, kernel_kind(pattern)))


def is_short(pattern: Pattern, device: torch.device, k_len: int | None, dtype: torch.dtype | None = None,
             grad: bool = False, *, tuning: Tuning | None = None) -> bool:
    """True when a call with ``k_len`` keys takes the short-call order."""
    limit = short_keys(pattern, device, dtype, grad, tuning=tuning)
    return limit is not None and k_len is not None and k_len < limit


def auto_order(pattern: Pattern, device: torch.device, k_len: int | None = None,
               preferred: Sequence[str] = (), *, dtype: torch.dtype | None = None, grad: bool = False,
               tuning: Tuning | None = None) -> list[str]:
    """The kernels ``auto`` tries, in order: ``preferred`` ones supported, the table's, the rest, ``reference``.

    The table is the tuned one for ``dtype`` and ``grad`` where a tuning file holds (:func:`tuned_order`)."""
    dev = torch.device(device).type
    kind = kernel_kind(pattern)
    tuned = tuned_order(pattern, device, dtype, grad, tuning)
    if tuned is not None:
        table: tuple[str, ...] | None = tuned.order(k_len)
    elif is_short(pattern, device, k_len):
        table = SHORT_ORDER[(dev, kind)]
    else:
        table = AUTO_ORDER.get((dev, kind))
    if table is None:  # other devices: the CPU rule (portable kernels first)
        table = AUTO_ORDER[("cpu", kind)]
    usable = kernels_for(pattern)
    order = [k for k in preferred if k in usable]
    order += [k for k in table if k in usable and k not in order]
    order += [k for k in usable if k not in order and k != "reference"]
    if "reference" in usable and "reference" not in order:
        order.append("reference")
    return order


def choose_kernel(pattern: Pattern, call: AttentionCall, preferred: Sequence[str] = (),
                  known: dict[str, list[str]] | None = None, *, tuning: Tuning | None = None) -> str:
    """Name of the kernel ``auto`` runs for ``call``; ``NotImplementedError`` if none.

    ``call.k_len`` None means a long call; ``known`` holds reasons already asked for this call;
    ``tuning``: the tuned orders to use (None: the file in effect, :mod:`attn.kernels.tuning`)."""
    known = {} if known is None else known
    where = {"dtype": call.dtype, "grad": call.requires_grad, "tuning": tuning}
    if call.has_document_ids and not is_short(pattern, call.device, call.k_len, **where):
        preferred = (*preferred, *PACKED_FIRST)
    reasons: list[str] = []
    for name in auto_order(pattern, call.device, call.k_len, preferred, **where):
        why = known[name] if name in known else get_kernel(name).not_supported_reasons(pattern, call)
        if not why:
            return name
        reasons.append(f"{name}: {'; '.join(why)}")
    raise NotImplementedError(
        f"{pattern.name}: no kernel supports this call ({call.describe()}): "
        f"{' | '.join(reasons) or 'none declared'}"
    )
