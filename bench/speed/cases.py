"""Expanding a sweep config into cases, and cases into chains (increasing lengths) of same-length groups."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from itertools import product
from typing import Any

from attn import attention_info
from attn.kernels import get_kernel, kernel_names
from attn.pattern import Pattern
from bench.speed.config import SweepConfig
from bench.speed.memory import estimate_bytes, fits, pattern_of
from bench.speed.noise import DEFAULT_THRESHOLD
from bench.speed.packing import packing_text


@dataclass(frozen=True)
class Case:
    """Everything a worker needs to measure one configuration; plain data (picklable, JSON-able)."""

    variant: str
    label: str
    params: tuple[tuple[str, Any], ...]
    kernel: str  # requested kernel ("auto" or a name); the row records the one that ran
    seq_len: int
    batch: int
    heads: int
    head_dim: int
    dtype: str
    device: str
    causal: bool
    passes: tuple[str, ...]
    repeats: int
    warmup: int
    timeout_s: float
    max_memory_gb: float | None
    threads: int | None
    time_budget_s: float
    plugins: tuple[str, ...]
    min_repeats: int = 5
    workload: str = "attention"  # or "model_step" (see bench.speed.model_step)
    model: tuple[tuple[str, Any], ...] = ()  # model settings of a model_step case
    #: how a row is flagged, not what is measured: not in the id (a resume compares it)
    noise_threshold: float = DEFAULT_THRESHOLD
    #: packed documents per row (0: unpacked), one by one or not, and the padding fraction
    documents: int = 0
    one_by_one: bool = False
    pad_fraction: float = 0.0
    #: added to ``timeout_s`` for the first call where the kernel may compile (not in the id)
    compile_timeout_s: float = 600.0

    @property
    def packing(self) -> str:
        """The packing and padding in words (``""``: an unpacked, unpadded call)."""
        return packing_text(self.documents, self.one_by_one, self.pad_fraction)

    #: key/value heads (grouped-query attention); None: as many as ``heads``
    kv_heads: int | None = None

    @property
    def key_heads(self) -> int:
        """The heads of ``k`` and ``v``: ``kv_heads``, or ``heads`` when it is None."""
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def params_dict(self) -> dict[str, Any]:
        return dict(self.params)

    @property
    def params_json(self) -> str:
        return json.dumps(self.params_dict, sort_keys=True)

    @property
    def group(self) -> tuple[Any, ...]:
        """Cases that differ only in ``seq_len`` (a scaling curve)."""
        return (self.variant, self.params, self.kernel, self.batch, self.heads, self.key_heads,
                self.head_dim, self.dtype, self.device, self.causal, self.packing)

    @property
    def comparison(self) -> tuple[Any, ...]:
        """Cases that differ only in ``kernel``, ``kv_heads`` and ``seq_len`` (timed in the same rounds)."""
        return (self.variant, self.params, self.batch, self.heads, self.head_dim, self.dtype,
                self.device, self.causal)

    @property
    def case_id(self) -> str:
        """Stable id of what is measured (not how long it may take): the resume key."""
        key = {
            "variant": self.variant, "params": self.params_dict, "kernel": self.kernel,
            "seq_len": self.seq_len, "batch": self.batch, "heads": self.heads,
            "head_dim": self.head_dim, "dtype": self.dtype, "device": self.device,
            "causal": self.causal, "passes": list(self.passes),
        }
        if self.workload != "attention":  # attention cases keep their ids of earlier runs
            key.update(workload=self.workload, model=dict(self.model))
        if self.packing:  # so do unpacked, unpadded ones
            key.update(documents=self.documents, one_by_one=self.one_by_one, pad_fraction=self.pad_fraction)
        if self.key_heads != self.heads:  # multi-head cases keep theirs too
            key["kv_heads"] = self.key_heads
        return hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]

    def describe(self) -> str:
        """One-line description for progress bars and ``--dry-run``."""
        causal = " causal" if self.causal else ""
        kv = f" H_kv={self.key_heads}" if self.key_heads != self.heads else ""
        return (f"{self.label} [{self.kernel}] N={self.seq_len} B={self.batch} H={self.heads}{kv} "
                f"D={self.head_dim} {self.dtype}{causal} {'/'.join(self.passes)}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Case:
        """Inverse of :meth:`to_dict` (lists back to tuples)."""
        fixed = {k: tuple(map(tuple, v)) if k in ("params", "model") else
                 (tuple(v) if isinstance(v, list) else v) for k, v in data.items()}
        return cls(**fixed)


def expand_cases(config: SweepConfig) -> list[Case]:
    """Every case of a sweep by curve, lengths increasing, less those past a CUDA cap or ``device_memory_gb``."""
    cases: list[Case] = []
    for spec in config.variants:
        info = attention_info(spec.name)
        requested = spec.kernels or config.kernels
        if "all" in requested:  # every kernel the variant has
            requested = (*(k for k in requested if k != "all"), *info.kernels)
        kernels = [k for k in dict.fromkeys(requested) if k == "auto" or k in info.kernels]
        causal = config.causal if spec.causal is None else spec.causal
        causal = causal or info.forces_causal
        lengths = sorted(set(spec.seq_len or config.seq_len))
        patterns: dict[tuple[int, int], Pattern] = {}
        for kernel, batch, heads, kv_heads, head_dim, (documents, one_by_one, pad) in product(
            kernels, config.batch, config.heads, config.kv_heads or (None,), config.head_dim,
            _packings(config)
        ):
            suffix = packing_text(documents, one_by_one, pad)
            label = f"{spec.label} [{suffix}]" if suffix else spec.label
            for n in lengths:
                if documents > n or _past_cuda_cap(config.device, kernel, n) or not _fits(
                        config, spec.name, spec.params_dict, kernel, n, batch, heads, head_dim, causal,
                        patterns):
                    continue
                cases.append(Case(
                    variant=spec.name, label=label, params=spec.params, kernel=kernel,
                    seq_len=n, batch=batch, heads=heads, head_dim=head_dim, dtype=config.dtype,
                    device=config.device, causal=causal, passes=config.passes,
                    repeats=config.repeats, warmup=config.warmup, timeout_s=config.timeout_s,
                    compile_timeout_s=config.compile_timeout_s,
                    max_memory_gb=config.max_memory_gb, threads=config.threads,
                    time_budget_s=config.time_budget_s, plugins=config.plugins,
                    min_repeats=config.min_repeats, workload=config.workload, model=config.model,
                    noise_threshold=config.noise_threshold, documents=documents,
                    one_by_one=one_by_one, pad_fraction=pad, kv_heads=kv_heads,
                ))
    return cases


def _packings(config: SweepConfig) -> list[tuple[int, bool, float]]:
    """``(documents, one_by_one, pad_fraction)`` of every case of a shape."""
    return [(documents, way, pad) for documents in config.packing
            for way in ((False, True) if documents and config.one_by_one else (False,)) for pad in config.pad_fraction]


def _past_cuda_cap(device: str, kernel: str, n: int) -> bool:
    """Whether ``kernel``, written for the CPU, refuses ``n`` keys on this device."""
    return kernel in kernel_names() and get_kernel(kernel).past_cuda_cap(device, n)


def _fits(config: SweepConfig, variant: str, params: dict[str, Any], kernel: str, n: int,
          batch: int, heads: int, head_dim: int, causal: bool,
          patterns: dict[tuple[int, int], Pattern]) -> bool:
    """Whether the estimate fits ``config.device_memory_gb`` (unset, or not attention: always)."""
    if config.device_memory_gb is None or config.workload != "attention":
        return True
    if (heads, head_dim) not in patterns:
        patterns[heads, head_dim] = pattern_of(variant, params, heads, head_dim)
    estimate = estimate_bytes(patterns[heads, head_dim], kernel, n=n,
                              batch=batch, heads=heads, head_dim=head_dim, dtype=config.dtype,
                              device=config.device, passes=config.passes, params=params,
                              causal=causal)
    return fits(estimate, config.device_memory_gb)


def chains(cases: list[Case], interleave: bool | str) -> list[list[list[Case]]]:
    """Cases as chains of same-length groups: a variant's kernels', a shape's (``"variants"``) or a curve's."""
    by_chain: dict[tuple[Any, ...], dict[int, list[Case]]] = {}
    for case in cases:
        if interleave == "variants":
            key = (case.batch, case.heads, case.head_dim, case.dtype, case.device, case.causal)
        else:
            key = case.comparison if interleave else case.group
        by_chain.setdefault(key, {}).setdefault(case.seq_len, []).append(case)
    return [[groups[n] for n in sorted(groups)] for groups in by_chain.values()]
