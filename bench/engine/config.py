"""Sweep configs: YAML (``yaml.safe_load`` within limits, :mod:`bench.engine.bounded_yaml`) into
frozen dataclasses, validated on load.

Every error is a :class:`ConfigError` (a ``ValueError``) whose message names the key and the
allowed values, so the CLI prints one line instead of a traceback; a value it echoes is cut
to a readable length (:func:`bench.engine.messages.shown`). A file over the limits of
:class:`bench.engine.bounded_yaml.YamlLimits` (its size, the items and characters it stands for
once its aliases are expanded, one string's length) is refused before it is expanded. Command-line overrides go
through the same validation (:func:`with_overrides` re-parses the config with them applied).

``plugins:`` imports the named modules: a config is as trusted as a script.
"""

from __future__ import annotations

import copy
import functools
import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from attn import attention_info, check_attention_params, list_attention, list_kernels
from attn.validation import (
    invalid,
    require_bool,
    require_choices,
    require_int_list,
    require_number,
)
from bench.engine.bounded_yaml import LIMITS, YamlLimitError, load_bounded
from bench.engine.labels import variant_label
from bench.engine.messages import cut, shown

PRESET_DIR = Path(__file__).resolve().parent.parent / "configs"  # bench/configs
PASSES = ("fwd", "bwd", "fwd_bwd")
#: what a case measures: one attention call, or one training step of a whole model
WORKLOADS = ("attention", "model_step")
#: the passes of a model-step case: the optimiser step included (forward, backward, update)
MODEL_PASSES = ("fwd", "train_step")
ALL_PASSES = (*PASSES, "train_step")
#: model settings a model-step sweep may give (encoder_classifier)
MODEL_KEYS = ("d_model", "num_heads", "num_layers", "d_ff", "vocab_size", "num_classes", "norm")
DEVICES = ("cpu", "cuda")
DTYPES = ("float32", "float16", "bfloat16", "float64")
_VARIANT_KEYS = {"name", "causal", "seq_len", "kernels"}


class ConfigError(ValueError):
    """An invalid sweep config; the message names the offending key (also in ``key``)."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


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
        """Display name naming every pattern parameter, defaults included, e.g.
        ``dilated(dilation=2, window=128)`` (:func:`bench.engine.labels.variant_label`)."""
        return variant_label(self.name, self.params_dict)


@dataclass(frozen=True)
class SweepConfig:
    """A whole sweep; :func:`bench.speed.cases.expand_cases` expands it into cases.

    The field defaults are the only place sweep defaults are written: a key the YAML leaves
    out takes its field's default. ``raw`` keeps the validated mapping (for overrides).
    """

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
    repeats: int = 10  # at most this many timed repeats per pass
    min_repeats: int = 5  # at least this many, even past time_budget_s
    warmup: int = 1
    causal: bool = False
    timeout_s: float = 300.0  # per case and pass
    max_memory_gb: float | None = 20.0  # CPU cases only (RLIMIT_AS); ignored on CUDA
    threads: int | None = None
    time_budget_s: float = 20.0  # the timed repeats of one pass aim to fit in this
    interleave: bool = True  # kernels of one variant at one length timed in rounds
    workload: str = "attention"  # or "model_step": a training step of encoder_classifier
    model: tuple[tuple[str, Any], ...] = ()  # model settings of a model_step sweep
    plugins: tuple[str, ...] = ()
    skip_larger_after_failure: bool = True
    peak_matmul_size: int | None = None  # side of the square matmul giving the FLOP/s peak
    fit_ranges: tuple[tuple[int, int], ...] = ()  # extra exponent fits in the report, [lo, hi] N
    description: str = ""
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


_TOP_KEYS = {f.name for f in fields(SweepConfig)} - {"raw"}


def _default(key: str) -> Any:
    return SweepConfig.__dataclass_fields__[key].default


def _subject(key: str) -> str:
    return f"config key {shown(key)}"


def _invalid(key: str, problem: str) -> ConfigError:
    """The error for config key ``key`` (in the one dialect of :mod:`attn.validation`)."""
    return invalid(_subject(key), problem, functools.partial(ConfigError, key=key))


def _check(check: Callable[..., Any], key: str, value: Any, **rules: Any) -> Any:
    """``check`` (one of :mod:`attn.validation`'s) applied to config key ``key``."""
    return check(_subject(key), value, error=functools.partial(ConfigError, key=key), **rules)


def _optional(check: Callable[..., Any], key: str, value: Any, **rules: Any) -> Any:
    return None if value is None else _check(check, key, value, **rules)


def _fit_ranges(key: str, value: Any) -> tuple[tuple[int, int], ...]:
    if not isinstance(value, (list, tuple)):
        raise _invalid(key, f"must be a list of [lo, hi] sequence lengths; got {shown(value)}")
    out = []
    for item in value:
        if (not isinstance(item, (list, tuple)) or len(item) != 2
                or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in item)
                or item[0] >= item[1]):
            raise _invalid(key, f"each range must be [lo, hi] with integers 1 <= lo < hi; got {shown(item)}")
        out.append((item[0], item[1]))
    return tuple(out)


def _model_settings(value: Any, workload: str) -> tuple[tuple[str, Any], ...]:
    """The ``model`` mapping of a model-step sweep (required there, refused elsewhere)."""
    if workload != "model_step":
        if value:
            raise _invalid("model", "only a 'workload: model_step' sweep takes model settings")
        return ()
    if not isinstance(value, dict) or not {"d_model", "num_heads", "num_layers"} <= set(value):
        raise _invalid("model", "a model_step sweep needs model settings with at least d_model, "
                             f"num_heads and num_layers; allowed keys are {list(MODEL_KEYS)}")
    unknown = sorted(set(value) - set(MODEL_KEYS))
    if unknown:
        raise _invalid(f"model.{unknown[0]}", f"unknown model setting; allowed keys are {list(MODEL_KEYS)}")
    for key, item in value.items():
        if key != "norm":
            _check(require_number, f"model.{key}", item, minimum=1, integer=True)
    if value["d_model"] % value["num_heads"]:
        raise _invalid("model.d_model", f"must be divisible by num_heads={value['num_heads']}; "
                                     f"got {value['d_model']}")
    return tuple(sorted(value.items()))


def import_plugins(modules: tuple[str, ...]) -> None:
    """Import plug-in modules (which register attentions by decorator); importing runs their
    code, so a config that names plug-ins is as trusted as a script."""
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as err:  # ImportError, SyntaxError, or the module's own failure
            detail = str(err).splitlines()[0] if str(err) else ""
            raise _invalid("plugins", f"cannot import module {shown(module)}: "
                                   f"{type(err).__name__}: {cut(detail, 500)}") from None


def _variant(index: int, raw: Any, kernel_names: tuple[str, ...]) -> VariantSpec:
    key = f"variants[{index}]"
    if isinstance(raw, str):
        raw = {"name": raw}
    if not isinstance(raw, dict) or "name" not in raw:
        raise _invalid(key, f"must be a mapping with a 'name' (e.g. {{name: full}}); got {shown(raw)}")
    name = raw["name"]
    known = list_attention()
    if name not in known:
        raise _invalid(f"{key}.name", f"unknown variant {shown(name)}; registered variants are {known}")
    info = attention_info(name)
    params = {k: v for k, v in raw.items() if k not in _VARIANT_KEYS}
    unknown = sorted(set(params) - set(info.params))
    if unknown:
        raise _invalid(
            f"{key}.{unknown[0]}",
            f"unknown parameter for {name!r}; allowed keys are "
            f"{sorted(set(info.params) | _VARIANT_KEYS)}",
        )
    for pkey, pval in params.items():
        if not isinstance(pval, (int, float, str, bool, type(None))):
            raise _invalid(f"{key}.{pkey}", f"must be a number, string, bool or null; got {shown(pval)}")
    try:  # the variant's own rules speak (bad window, bad bias, ...), from its class
        check_attention_params(name, num_heads=8, head_dim=64, **params)
    except (ValueError, TypeError) as err:
        raise _invalid(f"{key}", cut(str(err), 1000)) from None
    causal = _check(require_bool, f"{key}.causal", raw["causal"]) if "causal" in raw else None
    seq_len = _check(require_int_list, f"{key}.seq_len", raw["seq_len"]) if "seq_len" in raw else None
    kernels = None
    if "kernels" in raw:
        kernels = _check(require_choices, f"{key}.kernels", raw["kernels"], allowed=kernel_names)
    return VariantSpec(name, tuple(sorted(params.items())), causal, seq_len, kernels)


def parse_config(raw: Any, *, source: str = "<config>") -> SweepConfig:
    """Validate a loaded YAML mapping into a :class:`SweepConfig`."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: a sweep config must be a YAML mapping; got {type(raw).__name__}")
    unknown = sorted(set(raw) - _TOP_KEYS)
    if unknown:
        raise _invalid(unknown[0], f"unknown key; allowed keys are {sorted(_TOP_KEYS)}")
    for required in ("name", "variants", "seq_len"):
        if required not in raw:
            raise _invalid(required, "is required")

    def get(key: str) -> Any:
        return raw.get(key, _default(key))

    plugins = get("plugins")
    if not isinstance(plugins, (list, tuple)) or not all(isinstance(p, str) for p in plugins):
        raise _invalid("plugins", f"must be a list of importable module names; got {shown(plugins)}")
    import_plugins(tuple(plugins))
    name = raw["name"]
    if not isinstance(name, str) or not name:
        raise _invalid("name", f"must be a non-empty string; got {shown(name)}")
    kernel_names = ("auto", "all", *list_kernels())
    variants = raw["variants"]
    if not isinstance(variants, (list, tuple)) or not variants:
        raise _invalid("variants", "must be a non-empty list like [{name: full}]")
    workload = _check(require_choices, "workload", get("workload"), allowed=WORKLOADS)[0]
    model = _model_settings(get("model"), workload)
    passes = MODEL_PASSES if workload == "model_step" else PASSES
    if model:  # the model's own heads and head size
        sizes = dict(model)
        heads, head_dim = (sizes["num_heads"],), (sizes["d_model"] // sizes["num_heads"],)
    else:
        heads = _check(require_int_list, "heads", get("heads"))
        head_dim = _check(require_int_list, "head_dim", get("head_dim"))
    repeats = _check(require_number, "repeats", get("repeats"), minimum=1, integer=True)
    min_repeats = _check(require_number, "min_repeats", get("min_repeats"), minimum=1, integer=True)
    if "min_repeats" not in raw:
        min_repeats = min(min_repeats, repeats)
    if min_repeats > repeats:
        raise _invalid("min_repeats", f"must be <= repeats={repeats}; got {min_repeats}")
    return SweepConfig(
        name=name,
        description=str(get("description")),
        variants=tuple(_variant(i, v, kernel_names) for i, v in enumerate(variants)),
        seq_len=_check(require_int_list, "seq_len", raw["seq_len"]),
        device=_check(require_choices, "device", get("device"), allowed=DEVICES)[0],
        dtype=_check(require_choices, "dtype", get("dtype"), allowed=DTYPES)[0],
        passes=_check(require_choices, "passes", raw.get("passes", list(passes)), allowed=passes),
        batch=_check(require_int_list, "batch", get("batch")),
        heads=heads,
        head_dim=head_dim,
        workload=workload,
        model=model,
        kernels=_check(require_choices, "kernels", get("kernels"), allowed=kernel_names),
        repeats=repeats,
        min_repeats=min_repeats,
        warmup=_check(require_number, "warmup", get("warmup"), minimum=1, integer=True),
        causal=_check(require_bool, "causal", get("causal")),
        timeout_s=float(_check(require_number, "timeout_s", get("timeout_s"), minimum=0.1)),
        max_memory_gb=_optional(require_number, "max_memory_gb", get("max_memory_gb"), minimum=0.1),
        threads=_optional(require_number, "threads", get("threads"), minimum=1, integer=True),
        time_budget_s=float(_check(require_number, "time_budget_s", get("time_budget_s"), minimum=0.0)),
        interleave=_check(require_bool, "interleave", get("interleave")),
        plugins=tuple(plugins),
        peak_matmul_size=_optional(require_number, "peak_matmul_size", get("peak_matmul_size"), minimum=64,
                                   integer=True),
        skip_larger_after_failure=_check(require_bool, "skip_larger_after_failure",
                                         get("skip_larger_after_failure")),
        fit_ranges=_fit_ranges("fit_ranges", get("fit_ranges")),
        raw=copy.deepcopy(raw),
    )


def resolve_config_path(config: str) -> Path:
    """A YAML path, or a preset name from ``bench/configs`` (``quick``, ``scaling-cpu``, ...)."""
    path = Path(config)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise ConfigError(f"config file {shown(config)} does not exist")
        return path
    preset = PRESET_DIR / f"{config}.yaml"
    if not preset.is_file():
        raise ConfigError(f"unknown config {shown(config)}; presets are {list_presets()}")
    return preset


def list_presets() -> list[str]:
    """Names of the preset configs shipped in ``bench/configs``."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_yaml(path: Path) -> Any:
    """``yaml.safe_load`` of a file within :class:`bench.engine.bounded_yaml.YamlLimits`;
    ``ConfigError`` naming the file when it is not YAML, cannot be read or is over a limit."""
    try:
        size = path.stat().st_size
        if size > LIMITS.max_bytes:  # not read at all
            raise ConfigError(f"{path}: {size:,} bytes; a config may have at most "
                              f"{LIMITS.max_bytes:,}")
        return load_bounded(path.read_text(), str(path))
    except YamlLimitError as err:
        raise ConfigError(str(err)) from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read the config: {err}") from None


def load_config(config: str | Path) -> SweepConfig:
    """Load and validate a sweep config from a YAML file or a preset name (a training grid,
    ``kind: quality``, is loaded by :func:`bench.quality.grid.parse_grid` instead)."""
    path = resolve_config_path(str(config))
    raw = load_yaml(path)
    if isinstance(raw, dict) and raw.get("kind") == "quality":
        raise ConfigError(f"{path}: a training grid (kind: quality), not a speed sweep; run it "
                          "with `attn-bench sweep` or load it with bench.quality.grid.parse_grid",
                          "kind")
    return parse_config(raw, source=str(path))


def with_overrides(config: SweepConfig, **overrides: Any) -> SweepConfig:
    """``config`` re-validated with the non-None overrides (config keys) applied.

    ``variants`` is a list of names (default parameters); ``seq_len`` and ``kernels`` given
    here also replace the per-variant lists. Errors are :class:`ConfigError` naming the key.
    """
    changes = {k: list(v) if isinstance(v, tuple) else v
               for k, v in overrides.items() if v is not None}
    unknown = sorted(set(changes) - _TOP_KEYS)
    if unknown:
        raise _invalid(unknown[0], f"unknown key; allowed keys are {sorted(_TOP_KEYS)}")
    raw = copy.deepcopy(config.raw) or {"name": config.name, "seq_len": list(config.seq_len)}
    if "variants" in changes:
        raw["variants"] = [{"name": name} for name in changes.pop("variants")]
    elif not raw.get("variants"):
        raw["variants"] = [{"name": v.name, **v.params_dict} for v in config.variants]
    for key in ("seq_len", "kernels"):
        if key in changes:
            raw["variants"] = [{k: v for k, v in (item if isinstance(item, dict) else {"name": item})
                                .items() if k != key} for item in raw["variants"]]
    raw.update(changes)
    return parse_config(raw, source=f"{config.name} with overrides")


def safe_name(text: str) -> str:
    """A file-name-safe version of a config value (no separators, no leading dots)."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+|\.{2,}", "_", text)
    cleaned = re.sub(r"_+", "_", cleaned).strip("._")
    return cleaned[:80] or "run"
