"""The display name of an attention configuration, for speed sweeps and quality grids (docs/quality.md, labels)."""

from __future__ import annotations

from typing import Any

from attn import attention_info

#: parameters that say how or at what size a variant runs, not which pairs it weighs how
NOT_PATTERN = ("kernel", "num_heads", "head_dim")
#: the parameters that choose a relative position bias, and the one only a learned bias uses
_BIAS_KEYS = ("position_bias", "bias")
_LEARNED_ONLY = "max_distance"


def _value(value: Any) -> str:
    """Compact text of a parameter value: lists as tuples (``(1, 2)``), strings bare."""
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_value(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    return str(value)


def pattern_params(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with the variant's defaults, less what does not define the pattern; sorted by key."""
    try:
        defaults = attention_info(name).params
    except ValueError:  # a plug-in not loaded here: only what the caller gave is known
        defaults = {}
    merged = {**defaults, **params}
    shown = {k: v for k, v in merged.items()
             if k not in NOT_PATTERN and not (v is None and defaults.get(k) is None)}
    bias_params = [k for k in _BIAS_KEYS if k in defaults]
    if _LEARNED_ONLY in shown and bias_params and "learned" not in {merged.get(k) for k in bias_params}:
        del shown[_LEARNED_ONLY]
    return dict(sorted(shown.items()))


def overrides_text(overrides: dict[str, Any] | None) -> str:
    """``position=none, train.steps=10``: model settings bare, other sections prefixed."""
    return ", ".join(f"{'' if section == 'model' else section + '.'}{key}={_value(value)}"
                     for section, values in sorted((overrides or {}).items())
                     for key, value in sorted((values or {}).items()))


def variant_label(name: str, params: dict[str, Any],
                  overrides: dict[str, Any] | None = None) -> str:
    """``name(k=v, ...)`` and ``overrides`` in brackets; a recurrent ``mixer``: ``gru (no attention) [d_model=96]``."""
    model = dict((overrides or {}).get("model") or {})
    mixer = model.pop("mixer", "attention")
    if mixer != "attention":
        rest = overrides_text({**(overrides or {}), "model": model})
        return f"{mixer} (no attention)" + (f" [{rest}]" if rest else "")
    shown = pattern_params(name, params)
    text = name if not shown else f"{name}({', '.join(f'{k}={_value(v)}' for k, v in shown.items())})"
    extra = overrides_text(overrides)
    return f"{text} [{extra}]" if extra else text
