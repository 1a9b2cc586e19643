"""Sweep configs: YAML (``yaml.safe_load``) into frozen dataclasses, validated on load.

Every error is a :class:`ConfigError` (a ``ValueError``) whose message names the key and the
allowed values, so the CLI prints one line instead of a traceback.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

PRESET_DIR = Path(__file__).parent / "configs"
PASSES = ("fwd", "bwd", "fwd_bwd")
DEVICES = ("cpu", "cuda")
DTYPES = ("float32", "float16", "bfloat16", "float64")

_TOP_KEYS = {
    "name", "description", "device", "dtype", "passes", "batch", "heads", "head_dim", "seq_len",
    "variants", "kernels", "repeats", "warmup", "causal", "timeout_s", "max_memory_gb",
    "threads", "time_budget_s", "plugins", "skip_larger_after_failure", "peak_matmul_size",
    "fit_ranges",
}
_VARIANT_KEYS = {"name", "causal", "seq_len", "kernels"}


class ConfigError(ValueError):
    """An invalid sweep config; the message names the offending key."""


@dataclass(frozen=True)
class VariantSpec:
    """One attention variant of a sweep: registered name, its params, optional overrides."""

    name: str
    params: tuple[tuple[str, Any], ...] = ()
    causal: bool | None = None
    seq_len: tuple[int, ...] | None = None
    kernels: tuple[str, ...] | None = None

    @property
    def params_dict(self) -> dict[str, Any]:
        return dict(self.params)

    @property
    def label(self) -> str:
        """Short display name, e.g. ``sliding_window(window=128)``."""
        if not self.params:
            return self.name
        return f"{self.name}({', '.join(f'{k}={v}' for k, v in self.params)})"


@dataclass(frozen=True)
class SweepConfig:
    """A whole sweep; ``cases(config)`` in :mod:`bench.cases` expands it."""

    name: str
    variants: tuple[VariantSpec, ...]
    seq_len: tuple[int, ...]
    device: str = "cpu"
    dtype: str = "float32"
    passes: tuple[str, ...] = PASSES
    batch: tuple[int, ...] = (1,)
    heads: tuple[int, ...] = (8,)
    head_dim: tuple[int, ...] = (64,)
    kernels: tuple[str, ...] = ("auto",)
    repeats: int = 5
    warmup: int = 1
    causal: bool = False
    timeout_s: float = 300.0
    max_memory_gb: float | None = 20.0  # CPU cases only (RLIMIT_AS); ignored on CUDA
    threads: int | None = None
    time_budget_s: float = 20.0
    plugins: tuple[str, ...] = ()
    skip_larger_after_failure: bool = True
    peak_matmul_size: int | None = None  # side of the square matmul giving the FLOP/s peak
    fit_ranges: tuple[tuple[int, int], ...] = ()  # extra exponent fits in the report, [lo, hi] N
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


def _fail(key: str, message: str) -> ConfigError:
    return ConfigError(f"config key {key!r}: {message}")


def _int_list(key: str, value: Any, minimum: int = 1) -> tuple[int, ...]:
    values = value if isinstance(value, list) else [value]
    if not values:
        raise _fail(key, "must not be empty")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise _fail(key, f"must be an integer >= {minimum} or a list of them; got {v!r}")
        out.append(v)
    return tuple(out)


def _choices(key: str, value: Any, allowed: tuple[str, ...]) -> tuple[str, ...]:
    values = value if isinstance(value, list) else [value]
    if not values:
        raise _fail(key, f"must not be empty; allowed values are {list(allowed)}")
    for v in values:
        if v not in allowed:
            raise _fail(key, f"unknown value {v!r}; allowed values are {list(allowed)}")
    return tuple(values)


def _number(key: str, value: Any, minimum: float, integer: bool = False) -> Any:
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or value < minimum:
        kind = "an integer" if integer else "a number"
        raise _fail(key, f"must be {kind} >= {minimum}; got {value!r}")
    return value


def _fit_ranges(key: str, value: Any) -> tuple[tuple[int, int], ...]:
    if not isinstance(value, list):
        raise _fail(key, f"must be a list of [lo, hi] sequence lengths; got {value!r}")
    out = []
    for item in value:
        if (not isinstance(item, list) or len(item) != 2
                or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in item)
                or item[0] >= item[1]):
            raise _fail(key, f"each range must be [lo, hi] with integers 1 <= lo < hi; got {item!r}")
        out.append((item[0], item[1]))
    return tuple(out)


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _fail(key, f"must be true or false; got {value!r}")
    return value


def import_plugins(modules: tuple[str, ...]) -> None:
    """Import plug-in modules (which register attentions by decorator)."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise _fail("plugins", f"cannot import module {module!r}: {err}") from None


def _variant(index: int, raw: Any, kernel_names: tuple[str, ...]) -> VariantSpec:
    from attn import attention_info, list_attention

    key = f"variants[{index}]"
    if isinstance(raw, str):
        raw = {"name": raw}
    if not isinstance(raw, dict) or "name" not in raw:
        raise _fail(key, f"must be a mapping with a 'name' (e.g. {{name: full}}); got {raw!r}")
    name = raw["name"]
    known = list_attention()
    if name not in known:
        raise _fail(f"{key}.name", f"unknown variant {name!r}; registered variants are {known}")
    info = attention_info(name)
    params = {k: v for k, v in raw.items() if k not in _VARIANT_KEYS}
    unknown = sorted(set(params) - set(info.params))
    if unknown:
        raise _fail(
            f"{key}.{unknown[0]}",
            f"unknown parameter for {name!r}; allowed keys are "
            f"{sorted(set(info.params) | _VARIANT_KEYS)}",
        )
    for pkey, pval in params.items():
        if not isinstance(pval, (int, float, str, bool, type(None))):
            raise _fail(f"{key}.{pkey}", f"must be a number, string, bool or null; got {pval!r}")
    try:  # let the variant's own validation speak (bad window, bad bias, ...)
        from attn import create_attention

        create_attention(name, num_heads=8, head_dim=64, **params)
    except (ValueError, TypeError) as err:
        raise _fail(f"{key}", str(err)) from None
    causal = _bool(f"{key}.causal", raw["causal"]) if "causal" in raw else None
    seq_len = _int_list(f"{key}.seq_len", raw["seq_len"]) if "seq_len" in raw else None
    kernels = None
    if "kernels" in raw:
        kernels = _choices(f"{key}.kernels", raw["kernels"], kernel_names)
    return VariantSpec(name, tuple(sorted(params.items())), causal, seq_len, kernels)


def parse_config(raw: Any, *, source: str = "<config>") -> SweepConfig:
    """Validate a loaded YAML mapping into a :class:`SweepConfig`."""
    from attn import list_kernels

    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: a sweep config must be a YAML mapping; got {type(raw).__name__}")
    unknown = sorted(set(raw) - _TOP_KEYS)
    if unknown:
        raise _fail(unknown[0], f"unknown key; allowed keys are {sorted(_TOP_KEYS)}")
    for required in ("name", "variants", "seq_len"):
        if required not in raw:
            raise _fail(required, "is required")
    plugins = raw.get("plugins", [])
    if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins):
        raise _fail("plugins", f"must be a list of importable module names; got {plugins!r}")
    import_plugins(tuple(plugins))
    name = raw["name"]
    if not isinstance(name, str) or not name:
        raise _fail("name", f"must be a non-empty string; got {name!r}")
    kernel_names = ("auto", "all", *list_kernels())
    variants = raw["variants"]
    if not isinstance(variants, list) or not variants:
        raise _fail("variants", "must be a non-empty list like [{name: full}]")
    threads = raw.get("threads")
    max_mem = raw.get("max_memory_gb", 20.0)
    return SweepConfig(
        name=name,
        description=str(raw.get("description", "")),
        variants=tuple(_variant(i, v, kernel_names) for i, v in enumerate(variants)),
        seq_len=_int_list("seq_len", raw["seq_len"]),
        device=_choices("device", raw.get("device", "cpu"), DEVICES)[0],
        dtype=_choices("dtype", raw.get("dtype", "float32"), DTYPES)[0],
        passes=_choices("passes", raw.get("passes", list(PASSES)), PASSES),
        batch=_int_list("batch", raw.get("batch", 1)),
        heads=_int_list("heads", raw.get("heads", 8)),
        head_dim=_int_list("head_dim", raw.get("head_dim", 64)),
        kernels=_choices("kernels", raw.get("kernels", ["auto"]), kernel_names),
        repeats=_number("repeats", raw.get("repeats", 5), 1, integer=True),
        warmup=_number("warmup", raw.get("warmup", 1), 1, integer=True),
        causal=_bool("causal", raw.get("causal", False)),
        timeout_s=float(_number("timeout_s", raw.get("timeout_s", 300.0), 0.1)),
        max_memory_gb=None if max_mem is None else float(_number("max_memory_gb", max_mem, 0.1)),
        threads=None if threads is None else _number("threads", threads, 1, integer=True),
        time_budget_s=float(_number("time_budget_s", raw.get("time_budget_s", 20.0), 0.0)),
        plugins=tuple(plugins),
        peak_matmul_size=(None if raw.get("peak_matmul_size") is None
                          else _number("peak_matmul_size", raw["peak_matmul_size"], 64, integer=True)),
        skip_larger_after_failure=_bool(
            "skip_larger_after_failure", raw.get("skip_larger_after_failure", True)
        ),
        fit_ranges=_fit_ranges("fit_ranges", raw.get("fit_ranges", [])),
    )


def resolve_config_path(config: str) -> Path:
    """A YAML path, or a preset name from ``bench/configs`` (``quick``, ``scaling-cpu``, ...)."""
    path = Path(config)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise ConfigError(f"config file {config!r} does not exist")
        return path
    preset = PRESET_DIR / f"{config}.yaml"
    if not preset.is_file():
        raise ConfigError(f"unknown config {config!r}; presets are {list_presets()}")
    return preset


def list_presets() -> list[str]:
    """Names of the preset configs shipped in ``bench/configs``."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_config(config: str | Path) -> SweepConfig:
    """Load and validate a sweep config from a YAML file or a preset name."""
    path = resolve_config_path(str(config))
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: invalid YAML: {err}") from None
    return parse_config(raw, source=str(path))


def with_overrides(config: SweepConfig, **overrides: Any) -> SweepConfig:
    """A copy of ``config`` with the non-None overrides applied (CLI options).

    ``seq_len`` and ``kernels`` given here also replace the per-variant lists.
    """
    changes = {k: v for k, v in overrides.items() if v is not None}
    if "variants" not in changes:
        cleared = {k: None for k in ("seq_len", "kernels") if k in changes}
        if cleared:
            changes["variants"] = tuple(replace(s, **cleared) for s in config.variants)
    if "variants" in changes and not isinstance(changes["variants"][0], VariantSpec):
        from attn import list_attention

        known = list_attention()
        specs = []
        for name in changes["variants"]:
            if name not in known:
                raise _fail("variant", f"unknown variant {name!r}; registered variants are {known}")
            specs.append(VariantSpec(name))
        changes["variants"] = tuple(specs)
    return replace(config, **changes)


def safe_name(text: str) -> str:
    """A file-name-safe version of a config value (no separators, no leading dots)."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+|\.{2,}", "_", text)
    cleaned = re.sub(r"_+", "_", cleaned).strip("._")
    return cleaned[:80] or "run"
