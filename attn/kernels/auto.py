"""``kernel="auto"``: the fastest supported kernel for the call, by a fixed documented rule.

Rule: the pattern's *kind* picks a preference order per device type (table below), and on
CPU a short call (few keys) another one; the first kernel in that order that the variant
has (:func:`attn.kernels.kernels_for` its pattern) and that supports the call (its
``not_supported_reasons`` for the :class:`~attn.call.AttentionCall` is empty) runs; kernels
the variant has but the table omits come next, and ``reference`` (the O(N^2) ground truth)
always last. A variant may name kernels it prefers (``Attention.preferred_kernels``): those
it has are tried first, in its order. Each module
remembers its choice per call description (device, dtype, causal, grad, key mask given,
short or long), so a decoding step does not re-run every kernel's check: only the chosen
kernel's, for the step's lengths (see :meth:`attn.Attention.resolve_kernel`).

================  ==========================================  ================================
kind              cpu                                          cuda
================  ==========================================  ================================
banded            blocked, flex, sdpa                          flex, xformers, sdpa, blocked
plain             sdpa, chunked                                sdpa, xformers, flex, chunked
biased / masked   relative, chunked, sdpa                      flex, sdpa, chunked
approximate       native                                       native
================  ==========================================  ================================

* *approximate*: not exact, or the variant brings its own implementation (``native``).
  *banded*: ``band()`` is not None (sliding_window, dilated, global_tokens, with or without
  a position bias). *plain*: no mask_mod and no score_mod (full, causal). *biased /
  masked*: any other exact variant (``relative``, plug-ins with a mask_mod).
* Why, on CPU. ``results/linear-cpu`` (``attn-bench sweep linear-cpu``: fp32, B=1, H=8,
  D=64, w=128, 2 threads, side by side in one run) at N=16384, forward: blocked / compiled
  flex / sdpa-with-mask = 148 / 152 / 7755 ms (sliding), 184 / 498 / 9850 ms (dilated r=2),
  213 / 412 / 9160 ms (global g=16); peak memory above the inputs 37 / 32 / 4100 MiB
  (sliding). Forward+backward at 16K: blocked 462 ms against sdpa 20.7 s (flex has no CPU
  backward). So ``blocked`` is the fastest CPU kernel for banded variants in both passes,
  and it needs no compilation (flex compiles for seconds per new shape, which models and
  KV-cache decoding, with a new Nk every step, would pay on every call); ``flex`` stays
  selectable by name. ``sdpa`` unmasked / ``is_causal`` is PyTorch's fused flash path (O(N)
  memory) for full and causal. ``chunked`` computes a score_mod per query chunk in
  O(chunk*N) memory, where ``sdpa`` must materialise an N x N float bias (0.5 GB at 4K for
  H=8, 32 GB at 32K); measured at 4K (relative, alibi) chunked / sdpa = 3.1 / 2.3 s forward
  and 2.2 / 2.0 s fwd+bwd, a small price for memory that stays O(chunk*N). A pattern whose
  score term is exactly a relative position bias (``Pattern.relative_bias``: ``relative``,
  and full or causal with a ``position_bias``) runs on ``relative`` first: torch's CPU flash
  kernel with the bias as a strided view of a per-head offset vector, O(N) memory, at about
  the time of full attention: ``results/relative-cpu`` (fp32, B=1, H=8, D=64, M=128, 2
  threads, interleaved with full attention, 5 rounds, a quiet machine) gives relative / full
  forward 1.05 / 1.03 / 1.05 / 1.09 (learned) and 1.00 / 1.02 / 1.05 / 1.00 (ALiBi) at
  N=2K / 4K / 8K / 16K; forward+backward 1.33 / 1.24 / 1.23 / 1.22 (learned: the table's
  gradient adds its band and one tail) and 1.03 / 1.10 / 1.07 / 1.09 (ALiBi). ``chunked``
  stays the fallback for every other score term and mask. Below 1024 keys ``sdpa`` over its
  cached mask stays first (a shared-machine check at N=256-512: ALiBi sdpa / relative about
  0.5-0.8, learned forward+backward about even).
* Short calls on CPU. Below ``SHORT_KEYS`` keys the per-stream loops of ``blocked`` and the
  checkpointed chunks of ``chunked`` cost more than one dense SDPA call over a mask cached
  per shape. Measured forward+backward, fp32, 2 threads, D=32 (B*H = 8 and 64): sliding
  window w=16, blocked / sdpa = 13.6 and 8.3 at N=128, 1.1 and 1.4 at 512, 0.40 and 0.43 at
  1024 (w=128: 2.2 at 512, 0.76 at 1024); relative ALiBi, chunked / sdpa = 1.15 up to 1024,
  1.5-1.7 at 2048, where SDPA's cached (H, N, N) bias starts to cost real memory. So banded
  variants take sdpa below 768 keys and relative below 1024: training at LRA-like lengths
  and KV-cache decoding over short contexts.
* Long packed calls (``document_ids``; a short one takes the short-call order) try
  ``blocked`` first, on every device: it runs each
  document as its own call (banded, or one fused SDPA product per document for full and
  causal), so a packed row costs what its documents cost; ``sdpa`` and ``chunked`` run a packed
  call over the whole row (a dense ``(B, H|1, N, N)`` mask, or the row's every pair). Measured
  in ``results/packed-cpu`` (``attn-bench sweep packed-cpu``).
* On CUDA flex has a backward pass and is the block-sparse kernel of choice; xformers'
  local/causal biases follow; the rule there is by design, not yet measured here. The
  kernels tuned for CPU caches (``blocked``, ``chunked``: Python loops over chunks, one
  launch per chunk and stream) come after flex and SDPA there, so ``auto`` on CUDA never
  picks one where flex or SDPA serves (their chunk sizes are still chosen per device, for
  when they are named or nothing else serves).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attn.call import AttentionCall
from attn.kernels import get_kernel, kernels_for
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
#: short calls (fewer keys than the limit) take another order: a dense kernel over a mask
#: cached per shape is faster there than the O(N*w) or O(chunk*N) kernel (see above)
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


def short_keys(pattern: Pattern, device: torch.device) -> int | None:
    """Calls with fewer keys than this take the short-call order; None: no short order."""
    return SHORT_KEYS.get((torch.device(device).type, kernel_kind(pattern)))


def is_short(pattern: Pattern, device: torch.device, k_len: int | None) -> bool:
    """True when a call with ``k_len`` keys takes the short-call order."""
    limit = short_keys(pattern, device)
    return limit is not None and k_len is not None and k_len < limit


def auto_order(pattern: Pattern, device: torch.device, k_len: int | None = None,
               preferred: Sequence[str] = ()) -> list[str]:
    """The kernels ``auto`` tries for ``pattern`` on this device, in order: those of
    ``preferred`` the pattern supports, then the table's, then the pattern's other kernels,
    ``reference`` last."""
    dev = torch.device(device).type
    kind = kernel_kind(pattern)
    table = SHORT_ORDER[(dev, kind)] if is_short(pattern, device, k_len) else AUTO_ORDER.get((dev, kind))
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
                  known: dict[str, list[str]] | None = None) -> str:
    """Name of the kernel ``kernel="auto"`` runs for ``call``; NotImplementedError if none.

    The call's ``k_len`` selects the short-call order; None means a long call. ``known``
    holds reasons already asked of kernels for this call (not asked again).
    """
    known = {} if known is None else known
    if call.has_document_ids and not is_short(pattern, call.device, call.k_len):
        preferred = (*preferred, *PACKED_FIRST)
    reasons: list[str] = []
    for name in auto_order(pattern, call.device, call.k_len, preferred):
        why = known[name] if name in known else get_kernel(name).not_supported_reasons(pattern, call)
        if not why:
            return name
        reasons.append(f"{name}: {'; '.join(why)}")
    raise NotImplementedError(
        f"{pattern.name}: no kernel supports this call ({call.describe()}): "
        f"{' | '.join(reasons) or 'none declared'}"
    )
