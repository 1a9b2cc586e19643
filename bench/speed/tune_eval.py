"""``attn-bench tune --evaluate``: how close ``auto`` comes to the fastest kernel per case of a sweep config,
with its fixed table and with a tuning file (docs/kernels.md, "Tuning `auto` for this machine").

Per (variant, length, pass) of the config every kernel the variant has runs in interleaved rounds
(:func:`bench.speed.tune.interleaved_times`); ``auto``'s choice for the same call is asked of
:func:`attn.kernels.auto.choose_kernel` twice, without tuning and with the file, and is one of the
kernels timed, so its time is read from the same rounds.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attn import create_attention
from attn.kernels import get_kernel
from attn.kernels.auto import choose_kernel
from attn.kernels.tuning import Tuning, default_loader
from attn.validation import require_choices, require_int, require_number
from bench.engine.cache import use_compile_cache
from bench.engine.config import read_config
from bench.engine.measure import start_autograd
from bench.engine.threads import torch_threads
from bench.speed.cases import Case, expand_cases
from bench.speed.config import PASSES, SweepConfig, apply_overrides, parse_config
from bench.speed.tune import MIN_REPEATS, Progress, interleaved_times

#: ``auto`` counts as right in a case when its time is within this share of the fastest kernel's
TOLERANCE = 0.05


@dataclass(frozen=True)
class EvalOptions:
    """Which cases of which sweep config, how many rounds, and the tuning file to judge."""

    tuning_path: Path
    config: str = "quick"
    variants: tuple[str, ...] = ()  # variant names to keep (empty: all of the config's)
    seq_len: tuple[int, ...] = ()  # empty: the config's
    passes: tuple[str, ...] = ()  # empty: the config's
    repeats: int = MIN_REPEATS
    threads: int | None = None
    tolerance: float = TOLERANCE
    #: leave out kernels that compile per shape (flex): faster, but their cases lack a candidate
    no_compile: bool = False

    def __post_init__(self) -> None:
        require_int("repeats", self.repeats, minimum=MIN_REPEATS)
        require_number("tolerance", self.tolerance, minimum=0.0)
        if self.passes:
            require_choices("passes", list(self.passes), PASSES)
        if self.threads is not None:
            require_int("threads", self.threads, minimum=1)


@dataclass(frozen=True)
class CaseResult:
    """One case: each kernel's median time, the kernels that compile per shape, and ``auto``'s two choices."""

    label: str
    seq_len: int
    pass_name: str
    times_ms: Mapping[str, float]
    compiling: tuple[str, ...]
    default_pick: str
    tuned_pick: str

    def fastest(self, no_compile: bool = False) -> tuple[str, float]:
        """The fastest kernel and its time (``no_compile``: among those that do not compile per shape)."""
        times = {k: v for k, v in self.times_ms.items() if not (no_compile and k in self.compiling)}
        if not times:
            return "", math.nan
        kernel = min(times, key=times.__getitem__)
        return kernel, times[kernel]

    def ratio(self, pick: str, no_compile: bool = False) -> float:
        """``pick``'s time over the fastest's (NaN when ``pick`` did not run)."""
        _, best = self.fastest(no_compile)
        return self.times_ms[pick] / best if pick in self.times_ms else math.nan


@dataclass(frozen=True)
class Evaluation:
    """Every case's result, and the share of cases where ``auto`` is within ``tolerance`` of the fastest."""

    cases: tuple[CaseResult, ...]
    tolerance: float
    source: str  # the tuning's ``tuned:<sha>``

    def share(self, tuned: bool, no_compile: bool = False) -> float:
        """Share of cases where ``auto``'s (tuned or fixed) choice is within ``tolerance`` of the fastest."""
        ratios = [c.ratio(c.tuned_pick if tuned else c.default_pick, no_compile) for c in self.cases]
        ok = [r <= 1 + self.tolerance for r in ratios if math.isfinite(r)]
        return sum(ok) / len(ok) if ok else math.nan

    def to_json(self) -> dict[str, Any]:
        return {"tolerance": self.tolerance, "tuning": self.source,
                "share_within": {"default": self.share(False), "tuned": self.share(True),
                                 "default_no_compile": self.share(False, True),
                                 "tuned_no_compile": self.share(True, True)},
                "cases": [dataclasses.asdict(c) for c in self.cases]}


def eval_config(options: EvalOptions) -> SweepConfig:
    """The config's cases for every kernel (``kernels: [all]``), narrowed by the options."""
    path, raw = read_config(options.config)
    raw = apply_overrides(raw, {"kernels": ["all"], "seq_len": list(options.seq_len) or None,
                                "passes": list(options.passes) or None, "threads": options.threads})
    config = parse_config(raw, source=str(path))
    if options.variants:
        names = [v.name for v in config.variants]
        require_choices("variants", list(options.variants), names)
        config = dataclasses.replace(config, variants=tuple(v for v in config.variants
                                                            if v.name in options.variants))
    return config


def _groups(cases: list[Case]) -> dict[tuple[Any, ...], list[Case]]:
    """Cases that differ only in their kernel, in config order."""
    groups: dict[tuple[Any, ...], list[Case]] = {}
    for case in cases:
        groups.setdefault((case.comparison, case.label, case.seq_len), []).append(case)
    return groups


def tuned_for(options: EvalOptions, config: SweepConfig, threads: int) -> Tuning:
    """The file's tuning for the config's device and dtype; ``ValueError`` saying why when it does not hold."""
    tuning = default_loader().tuning(options.tuning_path, config.device, config.dtype, threads)
    if not tuning.source.startswith("tuned:"):
        why = tuning.reason or f"no tuning file at {options.tuning_path}"
        raise ValueError(f"tuning_path: {why}; run `attn-bench tune` first (same --dtype and --threads)")
    return tuning


def evaluate(options: EvalOptions, progress: Progress | None = None) -> Evaluation:
    """Time every case of the config and judge ``auto``'s fixed and tuned choices (see the module docstring)."""
    say = progress or (lambda _: None)
    config = eval_config(options)
    use_compile_cache(config.device)
    results = []
    with torch_threads(options.threads) as threads:
        tuning = tuned_for(options, config, threads)
        start_autograd()
        for group in _groups(expand_cases(config)).values():
            first = group[0]
            pattern = create_attention(first.variant, num_heads=first.heads, head_dim=first.head_dim,
                                       **first.params_dict).pattern()
            kernels = [c for c in group if not (options.no_compile and get_kernel(c.kernel).compiles_per_shape)]
            for pass_name in config.passes:
                cases = [dataclasses.replace(c, passes=(pass_name,), warmup=2) for c in kernels]
                timed = interleaved_times(cases, pass_name, options.repeats)
                if timed.call is None:
                    say(f"{first.label} N={first.seq_len} {pass_name}: no kernel ran")
                    continue
                medians = {k: timed.median_ms(k) for k in timed.times_ms}
                result = CaseResult(
                    first.label, first.seq_len, pass_name, medians,
                    tuple(k for k in medians if get_kernel(k).compiles_per_shape),
                    choose_kernel(pattern, timed.call, tuning=Tuning()),
                    choose_kernel(pattern, timed.call, tuning=tuning))
                results.append(result)
                say(case_line(result, options.tolerance))
    return Evaluation(tuple(results), options.tolerance, tuning.source)


def case_line(result: CaseResult, tolerance: float) -> str:
    """One line per case: the fastest kernel, and ``auto``'s choices with their ratios to it."""
    best, best_ms = result.fastest()

    def judged(pick: str) -> str:
        ratio = result.ratio(pick)
        mark = "ok" if ratio <= 1 + tolerance else "slow"
        return f"{pick} {ratio:.2f}x {mark}"

    return (f"{result.label:40} N={result.seq_len:<5} {result.pass_name:8} fastest {best} {best_ms:.2f} ms | "
            f"auto default {judged(result.default_pick)} | tuned {judged(result.tuned_pick)}")


def summary_lines(evaluation: Evaluation) -> list[str]:
    """The acceptance figure: share of cases where ``auto`` is within the tolerance, before and after."""
    n = len(evaluation.cases)
    tol = f"{evaluation.tolerance:.0%}"

    def pair(no_compile: bool) -> str:
        return (f"default table {evaluation.share(False, no_compile):.0%}, "
                f"tuned ({evaluation.source}) {evaluation.share(True, no_compile):.0%}")

    return [f"auto within {tol} of the fastest kernel in {n} cases: {pair(False)}",
            f"  ... of the fastest that does not compile per shape: {pair(True)}"]
