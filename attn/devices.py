"""Where a module's tensors live, and waiting for a device's queued work."""

from __future__ import annotations

import torch
from torch import nn


def module_device(module: nn.Module) -> torch.device:
    """The device of ``module``'s first parameter (or buffer), where code evaluating its functions outside a call
    builds its tensors; the CPU for a module with neither."""
    for tensor in (*module.parameters(), *module.buffers()):
        return tensor.device
    return torch.device("cpu")


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued work where it runs asynchronously (CUDA); a no-op on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
