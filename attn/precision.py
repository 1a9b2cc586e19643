"""Kernels that compute half inputs in float32 (:func:`upcast`), decorated with :func:`without_autocast` so their
float32 sections stay float32: autocast would recast their matmuls (and mix dtypes in ``addmm_``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import Tensor

F = TypeVar("F", bound=Callable[..., Any])
#: the dtypes upcasting kernels compute in float32
HALF_DTYPES = (torch.float16, torch.bfloat16)


def upcast(dtype: torch.dtype) -> torch.dtype:
    """The dtype an upcasting kernel computes ``dtype`` inputs in: float32 for :data:`HALF_DTYPES`."""
    return torch.float32 if dtype in HALF_DTYPES else dtype


def without_autocast(fn: F) -> F:
    """Run ``fn`` with autocast off on the device type of its first tensor argument (if any)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        first = next((a for a in (*args, *kwargs.values()) if isinstance(a, Tensor)), None)
        if first is None or not torch.is_autocast_enabled(first.device.type):
            return fn(*args, **kwargs)
        with torch.autocast(device_type=first.device.type, enabled=False):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
