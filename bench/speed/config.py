"""Speed sweep configs: a YAML mapping validated into frozen dataclasses (pure: no plug-in imported, no file read)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from attn import attention_info, check_attention_params, list_attention, list_kernels
from attn.validation import require_bool, require_choices, require_int_list, require_number
from bench.engine.config import DEVICES, DTYPES, ConfigError, check_key, key_error, plugin_modules
from bench.engine.labels import variant_label
from bench.engine.messages import cut, shown
from bench.speed.noise import DEFAULT_THRESHOLD

PASSES = ("fwd", "bwd", "fwd_bwd")
#: what a case measures: one attention call, or one training step of a whole model
WORKLOADS = ("attention", "model_step")
#: the passes of a model-step case: the optimiser step included (forward, backward, update)
MODEL_PASSES = ("fwd", "train_step")
#: model settings a model-step sweep may give (encoder_classifier)
MODEL_KEYS = ("d_model", "num_heads", "num_layers", "d_ff", "vocab_size", "num_classes", "norm")
_VARIANT_KEYS = {"name", "causal", "seq_len", "kernels"}


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
        """Display name with every pattern parameter, e.g. ``dilated(dilation=2, window=128)``."""
        return variant_label(self.name, self.params_dict)


@dataclass(frozen=True)
class SweepConfig:
    """A whole sweep (:func:`bench.speed.cases.expand_cases`); the field defaults are the sweep defaults."""

    name: str
    variants: tuple[VariantSpec, ...]
    seq_len: tuple[int, ...]
    device: str = "cpu"
    dtype: str = "float32"
    passes: tuple[str, ...] = PASSES
    batch: tuple[int, ...] = (1,)
    heads: tuple[int, ...] = (8,)
    #: key/value heads (each divides every ``heads``); None: as many as ``heads``
    kv_heads: tuple[int, ...] | None = None
    head_dim: tuple[int, ...] = (64,)
    kernels: tuple[str, ...] = ("auto",)
    repeats: int = 10  # at most this many timed repeats per pass
    min_repeats: int = 5  # at least this many, even past time_budget_s
    warmup: int = 1
    causal: bool = False
    timeout_s: float = 300.0  # per case and pass
    #: more for the first call of a kernel that compiles per shape (a ``compile_timeout`` row)
    compile_timeout_s: float = 600.0
    max_memory_gb: float | None = 20.0  # CPU cases only (RLIMIT_AS); ignored on CUDA
    #: the device's memory (GiB): cases whose estimate does not fit are left out; None: all tried
    device_memory_gb: float | None = None
    threads: int | None = None
    time_budget_s: float = 20.0  # the timed repeats of one pass aim to fit in this
    #: True: a variant's kernels at one length share rounds; "variants": every variant and kernel of a shape
    interleave: bool | str = True
    workload: str = "attention"  # or "model_step": a training step of encoder_classifier
    model: tuple[tuple[str, Any], ...] = ()  # model settings of a model_step sweep
    plugins: tuple[str, ...] = ()
    skip_larger_after_failure: bool = True
    peak_matmul_size: int | None = None  # side of the square matmul giving the FLOP/s peak
    fit_ranges: tuple[tuple[int, int], ...] = ()  # extra exponent fits in the report, [lo, hi] N
    #: spread or probe change above this flags a row noisy (bench.speed.noise)
    noise_threshold: float = DEFAULT_THRESHOLD
    #: documents packed per row (0: unpacked); ``one_by_one`` adds the same documents run one by one
    packing: tuple[int, ...] = (0,)
    one_by_one: bool = False
    #: fractions of each row's keys that are padding (a ``key_mask``), each its own case
    pad_fraction: tuple[float, ...] = (0.0,)
    description: str = ""


_TOP_KEYS = {f.name for f in fields(SweepConfig)}


def _interleave(value: Any) -> bool | str:
    """``interleave``: true, false or "variants"."""
    if value == "variants" or isinstance(value, bool):
        return value
    raise key_error("interleave", f"must be true, false or 'variants'; got {shown(value)}")


def _fit_ranges(key: str, value: Any) -> tuple[tuple[int, int], ...]:
    if not isinstance(value, (list, tuple)):
        raise key_error(key, f"must be a list of [lo, hi] sequence lengths; got {shown(value)}")
    out = []
    for item in value:
        if (not isinstance(item, (list, tuple)) or len(item) != 2
                or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in item)
                or item[0] >= item[1]):
            raise key_error(key, f"each range must be [lo, hi] with integers 1 <= lo < hi; got {shown(item)}")
        out.append((item[0], item[1]))
    return tuple(out)


def _pad_fractions(key: str, value: Any) -> tuple[float, ...]:
    """A fraction in [0, 1) or a non-empty list of them (the padding axis)."""
    values = value if isinstance(value, (list, tuple)) else [value]
    ok = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1]
    if not values or len(ok) != len(values):
        raise key_error(key, f"must be a number in [0, 1) or a list of them; got {shown(value)}")
    return tuple(dict.fromkeys(float(v) for v in values))


def _model_settings(value: Any, workload: str) -> tuple[tuple[str, Any], ...]:
    """The ``model`` mapping of a model-step sweep (required there, refused elsewhere)."""
    if workload != "model_step":
        if value:
            raise key_error("model", "only a 'workload: model_step' sweep takes model settings")
        return ()
    if not isinstance(value, dict) or not {"d_model", "num_heads", "num_layers"} <= set(value):
        raise key_error("model", "a model_step sweep needs model settings with at least d_model, "
                                f"num_heads and num_layers; allowed keys are {list(MODEL_KEYS)}")
    unknown = sorted(set(value) - set(MODEL_KEYS))
    if unknown:
        raise key_error(f"model.{unknown[0]}", f"unknown model setting; allowed keys are {list(MODEL_KEYS)}")
    for key, item in value.items():
        if key != "norm":
            check_key(require_number, f"model.{key}", item, minimum=1, integer=True)
    if value["d_model"] % value["num_heads"]:
        raise key_error("model.d_model", f"must be divisible by num_heads={value['num_heads']}; "
                                        f"got {value['d_model']}")
    return tuple(sorted(value.items()))


def _kv_heads(value: Any, heads: tuple[int, ...], workload: str) -> tuple[int, ...] | None:
    """The ``kv_heads`` axis: None, or integers dividing every ``heads`` (attention sweeps only)."""
    if value is None:
        return None
    if workload != "attention":
        raise key_error("kv_heads", "only a 'workload: attention' sweep takes kv_heads (a model's "
                                    "key heads are its own)")
    kv_heads = check_key(require_int_list, "kv_heads", value)
    for kv in kv_heads:
        bad = [h for h in heads if h % kv]
        if bad:
            raise key_error("kv_heads", f"each value must divide every heads value {list(heads)} "
                                        f"(H % H_kv == 0); got {kv} for heads={bad[0]}")
    return kv_heads


def _variant(index: int, raw: Any, kernel_names: tuple[str, ...]) -> VariantSpec:
    key = f"variants[{index}]"
    if isinstance(raw, str):
        raw = {"name": raw}
    if not isinstance(raw, dict) or "name" not in raw:
        raise key_error(key, f"must be a mapping with a 'name' (e.g. {{name: full}}); got {shown(raw)}")
    name = raw["name"]
    known = list_attention()
    if name not in known:
        raise key_error(f"{key}.name", f"unknown variant {shown(name)}; registered variants are {known}")
    info = attention_info(name)
    params = {k: v for k, v in raw.items() if k not in _VARIANT_KEYS}
    unknown = sorted(set(params) - set(info.params))
    if unknown:
        raise key_error(f"{key}.{unknown[0]}", f"unknown parameter for {name!r}; allowed keys are "
                                               f"{sorted(set(info.params) | _VARIANT_KEYS)}")
    for pkey, pval in params.items():
        if not isinstance(pval, (int, float, str, bool, type(None))):
            raise key_error(f"{key}.{pkey}", f"must be a number, string, bool or null; got {shown(pval)}")
    try:  # the variant's own rules speak (bad window, bad bias, ...), from its class
        check_attention_params(name, num_heads=8, head_dim=64, **params)
    except (ValueError, TypeError) as err:
        raise key_error(f"{key}", cut(str(err), 1000)) from None
    causal = check_key(require_bool, f"{key}.causal", raw["causal"]) if "causal" in raw else None
    seq_len = check_key(require_int_list, f"{key}.seq_len", raw["seq_len"]) if "seq_len" in raw else None
    kernels = (check_key(require_choices, f"{key}.kernels", raw["kernels"], allowed=kernel_names)
               if "kernels" in raw else None)
    return VariantSpec(name, tuple(sorted(params.items())), causal, seq_len, kernels)


def parse_config(raw: Any, *, source: str = "<config>") -> SweepConfig:
    """Validate a loaded YAML mapping into a :class:`SweepConfig`."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: a sweep config must be a YAML mapping; got {type(raw).__name__}")
    unknown = sorted(set(raw) - _TOP_KEYS)
    if unknown:
        raise key_error(unknown[0], f"unknown key; allowed keys are {sorted(_TOP_KEYS)}")
    for required in ("name", "variants", "seq_len"):
        if required not in raw:
            raise key_error(required, "is required")

    def get(key: str) -> Any:
        return raw.get(key, SweepConfig.__dataclass_fields__[key].default)

    def check(fn: Callable[..., Any], key: str, **rules: Any) -> Any:
        return check_key(fn, key, get(key), **rules)

    def optional(key: str, **rules: Any) -> Any:
        return None if get(key) is None else check(require_number, key, **rules)

    plugins = plugin_modules(raw)  # checked, not imported
    name = raw["name"]
    if not isinstance(name, str) or not name:
        raise key_error("name", f"must be a non-empty string; got {shown(name)}")
    kernel_names = ("auto", "all", *list_kernels())
    variants = raw["variants"]
    if not isinstance(variants, (list, tuple)) or not variants:
        raise key_error("variants", "must be a non-empty list like [{name: full}]")
    workload = check(require_choices, "workload", allowed=WORKLOADS)[0]
    model = _model_settings(get("model"), workload)
    passes = MODEL_PASSES if workload == "model_step" else PASSES
    if model:  # the model's own heads and head size
        sizes = dict(model)
        heads, head_dim = (sizes["num_heads"],), (sizes["d_model"] // sizes["num_heads"],)
    else:
        heads, head_dim = check(require_int_list, "heads"), check(require_int_list, "head_dim")
    kv_heads = _kv_heads(get("kv_heads"), heads, workload)
    repeats = check(require_number, "repeats", minimum=1, integer=True)
    min_repeats = check(require_number, "min_repeats", minimum=1, integer=True)
    if "min_repeats" not in raw:
        min_repeats = min(min_repeats, repeats)
    if min_repeats > repeats:
        raise key_error("min_repeats", f"must be <= repeats={repeats}; got {min_repeats}")
    config = SweepConfig(
        name=name,
        description=str(get("description")),
        variants=tuple(_variant(i, v, kernel_names) for i, v in enumerate(variants)),
        seq_len=check_key(require_int_list, "seq_len", raw["seq_len"]),
        device=check(require_choices, "device", allowed=DEVICES)[0],
        dtype=check(require_choices, "dtype", allowed=DTYPES)[0],
        passes=check_key(require_choices, "passes", raw.get("passes", list(passes)), allowed=passes),
        batch=check(require_int_list, "batch"),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        workload=workload,
        model=model,
        kernels=check(require_choices, "kernels", allowed=kernel_names),
        repeats=repeats,
        min_repeats=min_repeats,
        warmup=check(require_number, "warmup", minimum=1, integer=True),
        causal=check(require_bool, "causal"),
        timeout_s=float(check(require_number, "timeout_s", minimum=0.1)),
        compile_timeout_s=float(check(require_number, "compile_timeout_s", minimum=0.0)),
        max_memory_gb=optional("max_memory_gb", minimum=0.1),
        device_memory_gb=optional("device_memory_gb", minimum=0.1),
        threads=optional("threads", minimum=1, integer=True),
        time_budget_s=float(check(require_number, "time_budget_s", minimum=0.0)),
        interleave=_interleave(get("interleave")),
        plugins=tuple(plugins),
        peak_matmul_size=optional("peak_matmul_size", minimum=64, integer=True),
        skip_larger_after_failure=check(require_bool, "skip_larger_after_failure"),
        fit_ranges=_fit_ranges("fit_ranges", get("fit_ranges")),
        noise_threshold=float(check(require_number, "noise_threshold", minimum=0.01)),
        packing=tuple(dict.fromkeys(check(require_int_list, "packing", minimum=0))),
        one_by_one=check(require_bool, "one_by_one"),
        pad_fraction=_pad_fractions("pad_fraction", get("pad_fraction")),
    )
    # a float16 train_step would not train: without loss scaling its gradients underflow
    if config.workload == "model_step" and config.dtype == "float16" and "train_step" in config.passes:
        allowed = [d for d in DTYPES if d != "float16"]
        raise key_error("dtype", f"a model_step train_step cannot train float16 weights (no loss "
                                 f"scaling); allowed values are {allowed}, or passes: [fwd]")
    _check_has_cases(config)
    return config


def _check_has_cases(config: SweepConfig) -> None:
    """Refuse a sweep where no variant has any of the kernels asked of it."""
    def has_case(variant: VariantSpec) -> bool:
        kernels = attention_info(variant.name).kernels
        return any(k == "auto" or k in kernels or (k == "all" and bool(kernels))
                   for k in variant.kernels or config.kernels)

    if any(has_case(v) for v in config.variants):
        return
    requested = sorted({k for v in config.variants for k in (v.kernels or config.kernels)})
    have = "; ".join(f"{v.label} has {['auto', 'all', *attention_info(v.name).kernels]}"
                     for v in config.variants)
    raise key_error("kernels", f"the sweep has no cases: no variant has any of the requested "
                               f"kernels {requested}; allowed values: {have}")


#: config keys a command line may override (:func:`apply_overrides`)
OVERRIDES = ("variants", "kernels", "seq_len", "passes", "repeats", "timeout_s", "compile_timeout_s", "device",
             "dtype", "threads", "plugins")


def apply_overrides(raw: Any, overrides: dict[str, Any]) -> Any:
    """A copy of ``raw`` with the non-None ``overrides`` (``seq_len`` and ``kernels``: per variant too), unchecked."""
    changes = {k: list(v) if isinstance(v, tuple) else v
               for k, v in overrides.items() if v is not None}
    unknown = sorted(set(changes) - _TOP_KEYS)
    if unknown:
        raise key_error(unknown[0], f"unknown key; allowed keys are {sorted(_TOP_KEYS)}")
    if not changes or not isinstance(raw, dict):
        return raw
    raw = copy.deepcopy(raw)
    if "variants" in changes:
        raw["variants"] = [{"name": name} for name in changes.pop("variants")]
    for key in ("seq_len", "kernels"):
        if key in changes and isinstance(raw.get("variants"), list):
            raw["variants"] = [{k: v for k, v in (item if isinstance(item, dict) else {"name": item})
                                .items() if k != key} for item in raw["variants"]]
    raw.update(changes)
    return raw
