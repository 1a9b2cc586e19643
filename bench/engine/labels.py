"""The display name of an attention configuration, shared by speed sweeps and quality grids.

A label names every parameter that defines the pattern, the variant's defaults included
(from the registry, :func:`attn.attention_info`), so two configurations never share a
label: ``dilated(dilation=2, window=16)``, ``relative(bias=learned, max_distance=128)``.
Left out are the parameters that do not define it: ``kernel``, ``num_heads`` and
``head_dim`` (how and at what size it runs), a parameter left at a ``None`` default (e.g. no
``position_bias``), and ``max_distance`` unless a learned relative bias uses it (ALiBi has no
clipping distance: ``relative(bias=alibi)``). Model-setting overrides follow in brackets:
``full [position=none]``.
"""

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
    if _LEARNED_ONLY in shown and bias_params:
        kinds = {merged.get(k) for k in bias_params}
        if "learned" not in kinds:
            del shown[_LEARNED_ONLY]
    return dict(sorted(shown.items()))


def overrides_text(overrides: dict[str, Any] | None) -> str:
    """``position=none, train.steps=10``: model settings bare, other sections prefixed."""
    parts = []
    for section, values in sorted((overrides or {}).items()):
        for key, value in sorted((values or {}).items()):
            parts.append(f"{key}={_value(value)}" if section == "model"
                         else f"{section}.{key}={_value(value)}")
    return ", ".join(parts)


def variant_label(name: str, params: dict[str, Any],
                  overrides: dict[str, Any] | None = None) -> str:
    """``name(k=v, ...)`` over the pattern parameters (defaults included, keys sorted), then
    any settings ``overrides`` (``{"model": {...}}``) in brackets: ``full [position=none]``.

    A model whose ``mixer`` override replaces self-attention by a recurrent layer is named
    by that layer, since its attention is unused: ``lstm (no attention)``,
    ``gru (no attention) [d_model=96]``."""
    model = dict((overrides or {}).get("model") or {})
    mixer = model.pop("mixer", "attention")
    if mixer != "attention":
        rest = overrides_text({**(overrides or {}), "model": model})
        return f"{mixer} (no attention)" + (f" [{rest}]" if rest else "")
    shown = pattern_params(name, params)
    text = name if not shown else f"{name}({', '.join(f'{k}={_value(v)}' for k, v in shown.items())})"
    extra = overrides_text(overrides)
    return f"{text} [{extra}]" if extra else text
