"""Checkpoints as ``safetensors`` files, written atomically, verified on load by a SHA-256 digest of the
metadata and every tensor (one from before digests with the other checks only); shared tensors stored once."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from bench.engine.fsutil import new_file_mode

_META = "attn_bench"
_DIGEST = "attn_bench_sha256"
#: suffix of a checkpoint moved aside because it failed verification
CORRUPT_SUFFIX = ".corrupt"


class CheckpointError(ValueError):
    """A checkpoint that cannot be trusted: unreadable, cut short, or not what was written."""


def checkpoint_digest(record: str, tensors: dict[str, Tensor]) -> str:
    """SHA-256 of a checkpoint's metadata record and its tensors (name, dtype, shape, bytes)."""
    digest = hashlib.sha256(record.encode())
    for name in sorted(tensors):
        tensor = tensors[name].detach().to("cpu").contiguous()
        digest.update(b"\0" + f"{name}|{tensor.dtype}|{tuple(tensor.shape)}".encode() + b"\0")
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


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
    metadata = {_META: record, _DIGEST: checkpoint_digest(record, unique)}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        save_file(unique, tmp, metadata=metadata)
        os.chmod(tmp, new_file_mode())  # readable as results and plots are, not mkstemp's 0600
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checkpoint(path: str | Path) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Tensors and metadata of a verified checkpoint; :class:`CheckpointError` when it does not parse, its digest
    does not match or a tensor is not finite."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no checkpoint there")
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            text = metadata.get(_META, "{}")
            tensors = {name: f.get_tensor(name) for name in f.keys()}
        record = json.loads(text)
        aliases = record.get("aliases", {})
        meta = record.get("meta", {})
        if not isinstance(aliases, dict) or not isinstance(meta, dict):
            raise ValueError("its metadata record is not a mapping")
    except Exception as err:  # safetensors' own error, a JSON error, an OSError, ...
        detail = " ".join(str(err).split())[:300] or type(err).__name__
        raise CheckpointError(f"{path}: not a readable checkpoint ({detail}); it was cut short "
                              "or overwritten") from None
    expected = metadata.get(_DIGEST)
    if expected is not None and checkpoint_digest(text, tensors) != expected:
        raise CheckpointError(f"{path}: its contents do not match the digest written with it "
                              "(the file was changed or damaged after it was saved)")
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise CheckpointError(f"{path}: tensor {name!r} holds NaN or inf values")
    try:
        for alias, owner in aliases.items():
            tensors[alias] = tensors[owner]
    except KeyError as err:
        raise CheckpointError(f"{path}: its metadata names a tensor it lacks ({err})") from None
    return tensors, meta


def move_aside(path: str | Path) -> Path:
    """Rename a checkpoint that failed verification to ``<name>.corrupt`` (``.corrupt.2``, ...); the new path."""
    path = Path(path)
    target = path.with_name(path.name + CORRUPT_SUFFIX)
    for index in range(2, 1000):
        if not target.exists():
            break
        target = path.with_name(f"{path.name}{CORRUPT_SUFFIX}.{index}")
    os.replace(path, target)
    return target


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
