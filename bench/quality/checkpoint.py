"""Checkpoints as ``safetensors`` files (no pickle), written atomically.

A checkpoint holds named tensors and a JSON metadata record. Tensors that share storage
(tied embeddings) are stored once and their other names listed in the metadata, so loading
restores the sharing. The file is written to a temporary name, fsynced and renamed: a run
killed while saving leaves the previous checkpoint intact.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

_META = "attn_bench"


def save_checkpoint(path: str | Path, tensors: dict[str, Tensor], meta: dict[str, Any]) -> None:
    """Write ``tensors`` and ``meta`` to ``path`` atomically (shared tensors stored once)."""
    path = Path(path)
    unique: dict[str, Tensor] = {}
    aliases: dict[str, str] = {}
    owner_of: dict[tuple[int, int, tuple[int, ...]], str] = {}
    for name, tensor in tensors.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key in owner_of:
            aliases[name] = owner_of[key]
            continue
        owner_of[key] = name
        unique[name] = tensor.detach().to("cpu").contiguous().clone()
    record = json.dumps({"meta": meta, "aliases": aliases})
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        save_file(unique, tmp, metadata={_META: record})
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checkpoint(path: str | Path) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Tensors (with shared names restored) and the metadata of a checkpoint."""
    with safe_open(str(path), framework="pt") as f:
        record = json.loads((f.metadata() or {}).get(_META, "{}"))
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    for alias, owner in record.get("aliases", {}).items():
        tensors[alias] = tensors[owner]
    return tensors, record.get("meta", {})


def model_state(model: nn.Module) -> dict[str, Tensor]:
    """The model's parameters and buffers, prefixed ``model.``."""
    return {f"model.{k}": v for k, v in model.state_dict().items()}


def load_model_state(model: nn.Module, tensors: dict[str, Tensor]) -> None:
    """Load the ``model.`` tensors of a checkpoint into ``model`` (strict)."""
    state = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    model.load_state_dict(state, strict=True)


def optimizer_state(optimizer: torch.optim.Optimizer) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The optimizer's tensors (``optim.<param>.<key>``) and the rest of its state (JSON)."""
    state = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, entry in state["state"].items():
        for key, value in entry.items():
            if isinstance(value, Tensor):
                tensors[f"optim.{index}.{key}"] = value
            else:
                scalars[f"{index}.{key}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def load_optimizer_state(optimizer: torch.optim.Optimizer, tensors: dict[str, Tensor],
                         meta: dict[str, Any]) -> None:
    """Restore what :func:`optimizer_state` saved."""
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        if name.startswith("optim."):
            _, index, key = name.split(".", 2)
            state.setdefault(int(index), {})[key] = value
    for name, value in meta.get("scalars", {}).items():
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = value
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
