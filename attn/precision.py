"""Float32 sections stay float32 under autocast.

Kernels that compute half-precision inputs in float32 (``reference``, ``chunked``,
``blocked``, Nystrom's masked landmark path and pseudo-inverse) upcast their operands; under
``torch.autocast`` (mixed-precision training) the matmuls would be recast to the autocast
dtype, undoing the upcast (and mixing dtypes in in-place ops such as ``addmm_``). Such
functions are decorated with :func:`without_autocast`: autocast is off inside them, on the
device of their first tensor argument; their callers still get the dtype they gave.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import Tensor

F = TypeVar("F", bound=Callable[..., Any])


def without_autocast(fn: F) -> F:
    """Run ``fn`` with autocast disabled on the device type of its first tensor argument
    (positional or keyword; ``self``/``ctx`` are skipped as non-tensors). A call with no
    tensor argument runs as is."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        first = next((a for a in (*args, *kwargs.values()) if isinstance(a, Tensor)), None)
        if first is None or not torch.is_autocast_enabled(first.device.type):
            return fn(*args, **kwargs)
        with torch.autocast(device_type=first.device.type, enabled=False):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
