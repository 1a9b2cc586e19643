"""``attn-bench tune``: each candidate kernel's time per kind, pass and length on this machine, and the
tuned ``auto`` table derived from them (docs/kernels.md, "Tuning `auto` for this machine").

The candidates of a kind are the kernels of ``auto``'s fixed orders for the device; their calls run in
one process, in interleaved rounds (A, B, C, A, B, C, ...) per (variant, length, pass), each call timed
by the suite's :class:`bench.engine.measure.CallTimer` through the sweep's own pass runner
(:class:`bench.speed.worker.PassRunner`: the same inputs, warm-up and forward+backward call).
"""

from __future__ import annotations

import datetime as dt
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attn import AttentionCall, create_attention
from attn.kernels import get_kernel, kernel_names
from attn.kernels.auto import AUTO_ORDER, SHORT_ORDER
from attn.kernels.tuning import (
    KernelTime,
    TuningFile,
    TuningFileError,
    TuningTable,
    device_name,
    identity_problem,
    machine_identity,
    read_tuning_file,
    to_json,
)
from attn.oom import is_oom_error
from attn.validation import require_choice, require_choices, require_int, require_int_list
from bench.engine.cache import use_compile_cache
from bench.engine.config import DEVICES, DTYPES
from bench.engine.fsutil import atomic_write_json
from bench.engine.measure import start_autograd
from bench.engine.threads import torch_threads
from bench.speed.cases import Case
from bench.speed.noise import relative_spread
from bench.speed.tune_orders import derive_orders
from bench.speed.worker import PassRunner

#: the kinds whose fixed order has a choice to tune (``approximate`` runs the variant's own code)
TUNED_KINDS = ("banded", "biased", "plain")
#: a call without gradients takes ``fwd``'s order, one with them ``fwd_bwd``'s
TUNE_PASSES = ("fwd", "fwd_bwd")
LENGTHS = (256, 512, 1024, 2048, 4096)
QUICK_LENGTHS = (256, 1024)
#: fewest timed repeats per kernel (the median of at least this many)
MIN_REPEATS = 5
#: a kernel slower than the fastest by more than ``PRUNE_RATIO`` at two lengths in a row, its ratio grown by
#: ``PRUNE_GROWTH`` or more between them, is not timed at longer ones (it ranks after those timed there):
#: a dense kernel against a linear one (the ratio doubles with N), not a noisy one whose ratio falls
PRUNE_RATIO = 3.0
PRUNE_GROWTH = 1.25
Progress = Callable[[str], None]


@dataclass(frozen=True)
class TuneVariant:
    """One variant a kind is measured on."""

    kind: str
    name: str
    params: tuple[tuple[str, Any], ...] = ()


#: the quick sweep's variants and parameters (bench/configs/quick.yaml), by kind; ``--quick``: the first of each
WORKLOAD = (
    TuneVariant("banded", "sliding_window", (("window", 128),)),
    TuneVariant("banded", "dilated", (("dilation", 2), ("window", 64))),
    TuneVariant("banded", "global_tokens", (("num_global", 16), ("window", 128))),
    TuneVariant("biased", "relative", (("bias", "alibi"),)),
    TuneVariant("plain", "full"),
    TuneVariant("plain", "causal"),  # plain too: a causal call takes the same order, so it is measured
)


@dataclass(frozen=True)
class TuneOptions:
    """What ``attn-bench tune`` measures; the shape is the quick sweep's (B=1, H=8, D=64)."""

    device: str = "cpu"
    dtype: str = "float32"
    threads: int | None = None
    seq_len: tuple[int, ...] = LENGTHS
    repeats: int = MIN_REPEATS
    kinds: tuple[str, ...] = TUNED_KINDS
    quick: bool = False
    batch: int = 1
    heads: int = 8
    head_dim: int = 64
    warmup: int = 2  # the first call (masks, caches) and one more, untimed

    def __post_init__(self) -> None:
        require_choice("device", self.device, DEVICES)
        require_choice("dtype", self.dtype, DTYPES)
        require_choices("kinds", list(self.kinds), TUNED_KINDS)
        require_int("repeats", self.repeats, minimum=MIN_REPEATS)
        require_int_list("seq_len", list(self.seq_len), minimum=1)
        if self.threads is not None:
            require_int("threads", self.threads, minimum=1)

    @property
    def variants(self) -> tuple[TuneVariant, ...]:
        """The variants measured: every one of the chosen kinds, or the first of each with ``quick``."""
        chosen = [v for v in WORKLOAD if v.kind in self.kinds]
        if self.quick:
            chosen = [v for i, v in enumerate(chosen) if v.kind not in {w.kind for w in chosen[:i]}]
        return tuple(chosen)

    @property
    def lengths(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.seq_len)))


def fixed_orders(kind: str, device: str) -> tuple[tuple[str, ...], tuple[str, ...] | None]:
    """``auto``'s fixed (long, short or None) orders of ``kind`` on ``device`` (other devices: the CPU's)."""
    long = AUTO_ORDER.get((device, kind)) or AUTO_ORDER[("cpu", kind)]
    return long, SHORT_ORDER.get((device, kind))


def candidates(kind: str, device: str, quick: bool = False) -> tuple[str, ...]:
    """The kernels of ``kind``'s fixed orders that tuning times. Not those that compile per shape on the CPU
    (``auto`` avoids a compile per new shape there) nor, with ``quick``, anywhere: they keep their place."""
    long, short = fixed_orders(kind, device)
    names = [k for k in dict.fromkeys((*long, *(short or ()))) if k in kernel_names()]
    return tuple(k for k in names if not (get_kernel(k).compiles_per_shape and (device == "cpu" or quick)))


@dataclass(frozen=True)
class Timed:
    """Interleaved rounds of one (variant, length, pass): ms per kernel per round, and kernels that did not run."""

    times_ms: dict[str, tuple[float, ...]]
    skipped: dict[str, str] = field(default_factory=dict)  # kernel -> why
    call: AttentionCall | None = None  # the call they all ran

    def median_ms(self, kernel: str) -> float:
        return float(statistics.median(self.times_ms[kernel]))


def _runner(case: Case, pass_name: str) -> PassRunner:
    module = create_attention(case.variant, num_heads=case.heads, head_dim=case.head_dim,
                              kernel=case.kernel, **case.params_dict).to(case.device)
    return PassRunner(case, module, pass_name)


def interleaved_times(cases: Sequence[Case], pass_name: str, repeats: int) -> Timed:
    """Warm each case's kernel for ``pass_name``, then ``repeats`` rounds of one timed call each, in turn.

    A kernel that refuses the call or runs out of memory is skipped with the reason; other errors raise."""
    runners: dict[str, PassRunner] = {}
    skipped: dict[str, str] = {}
    for case in cases:
        try:
            runner = _runner(case, pass_name)
            runner.warm()
        except NotImplementedError as err:
            skipped[case.kernel] = f"unsupported: {err}"
            continue
        except Exception as err:
            if not is_oom_error(err):
                raise
            skipped[case.kernel] = f"out of memory: {str(err)[:200]}"
            continue
        runners[case.kernel] = runner
    times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(repeats):
        for kernel, runner in runners.items():
            times[kernel].append(runner.timer.time_once() * 1e3)
    call = None
    if runners:
        r = next(iter(runners.values()))
        call = AttentionCall.from_tensors(r.q, r.k, r.v, r.case.causal, r.key_mask, r.grad, r.document_ids)
    return Timed({k: tuple(v) for k, v in times.items()}, skipped, call)


def case_of(options: TuneOptions, variant: TuneVariant, kernel: str, n: int, pass_name: str) -> Case:
    """The sweep case of one kernel's calls (what :class:`bench.speed.worker.PassRunner` runs)."""
    return Case(variant=variant.name, label=variant.name, params=variant.params, kernel=kernel, seq_len=n,
                batch=options.batch, heads=options.heads, head_dim=options.head_dim, dtype=options.dtype,
                device=options.device, causal=False, passes=(pass_name,), repeats=options.repeats,
                warmup=options.warmup, timeout_s=600.0, max_memory_gb=None, threads=options.threads,
                time_budget_s=0.0, plugins=(), min_repeats=options.repeats)


def _pruned(timed: Timed, ratios: dict[str, float]) -> list[str]:
    """Kernels past :data:`PRUNE_RATIO` of the fastest here and at the length before, their ratio grown by
    :data:`PRUNE_GROWTH`; ``ratios`` (the length before's) is updated."""
    medians = {k: timed.median_ms(k) for k in timed.times_ms}
    if not medians:
        return []
    best = min(medians.values())
    drop = []
    for kernel, ms in medians.items():
        ratio = ms / best
        before = ratios.get(kernel)
        if before is not None and before > PRUNE_RATIO and ratio >= PRUNE_GROWTH * before:
            drop.append(kernel)
        ratios[kernel] = ratio
    return drop


def measure(options: TuneOptions, progress: Progress | None = None) -> list[KernelTime]:
    """The times of every candidate kernel per variant, pass and length (lengths in increasing order)."""
    say = progress or (lambda _: None)
    out: list[KernelTime] = []
    for variant in options.variants:
        kernels = candidates(variant.kind, options.device, options.quick)
        for pass_name in TUNE_PASSES:
            active, ratios = list(kernels), {}
            for n in options.lengths:
                cases = [case_of(options, variant, k, n, pass_name) for k in active]
                timed = interleaved_times(cases, pass_name, options.repeats)
                for kernel, times in timed.times_ms.items():
                    out.append(KernelTime(variant.kind, variant.name, pass_name, n, kernel, timed.median_ms(kernel),
                                          relative_spread(np.asarray(times)), times))
                say(f"{variant.kind:7} {variant.name:15} {pass_name:8} N={n:<6} " + "  ".join(
                    f"{k} {timed.median_ms(k):.2f} ms" for k in timed.times_ms) +
                    "".join(f"  ({k}: {why.split(':')[0]})" for k, why in timed.skipped.items()))
                for kernel in _pruned(timed, ratios):
                    active.remove(kernel)
                    say(f"  {kernel}: over {PRUNE_RATIO:g}x the fastest, and growing: not timed at longer lengths")
    return out


def tune(options: TuneOptions, progress: Progress | None = None) -> TuningTable:
    """Measure (:func:`measure`) and derive the table of ``options.device``, dtype and thread count."""
    use_compile_cache(options.device)
    with torch_threads(options.threads) as threads:
        start_autograd()
        times = measure(options, progress)
    kinds = {v.kind for v in options.variants}
    orders = derive_orders(times, {kind: fixed_orders(kind, options.device) for kind in kinds})
    settings = {"batch": options.batch, "heads": options.heads, "head_dim": options.head_dim,
                "seq_len": list(options.lengths), "repeats": options.repeats, "quick": options.quick,
                "variants": [{"kind": v.kind, "name": v.name, "params": dict(v.params)} for v in options.variants],
                "measured": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    return TuningTable(options.device, device_name(options.device), options.dtype, threads, orders,
                       tuple(times), settings)


def write_tuning(path: str | Path, table: TuningTable) -> TuningFile:
    """Write ``table`` into the tuning file at ``path`` (atomically), keeping its tables of other devices,
    dtypes and thread counts when the file is of this machine and torch; returns what was written."""
    path = Path(path)
    identity = machine_identity()
    tables: list[TuningTable] = []
    if path.exists():
        try:
            earlier, _ = read_tuning_file(path)
        except TuningFileError:
            earlier = None
        if earlier is not None and identity_problem(earlier.identity, identity) is None:
            tables = [t for t in earlier.tables if t.key != table.key]
    written = TuningFile(identity, (*tables, table))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, to_json(written))
    return written


def describe_orders(table: TuningTable) -> list[str]:
    """One line per (kind, pass) of ``table``: long order, short order and where it starts."""
    lines = []
    for (kind, pass_name), order in sorted(table.orders.items()):
        short = (f"; below {order.short_keys} keys: {', '.join(order.short)} (long order wins from "
                 f"N={order.crossover} measured)") if order.short_keys else f" (wins from N={order.crossover})"
        lines.append(f"{table.device} {kind:7} {pass_name:8} {', '.join(order.long)}{short}")
    return lines
