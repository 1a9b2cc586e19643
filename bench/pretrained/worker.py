"""The worker process of a pretrained-model unit: it loads the model once and runs the task; ``transformers`` is
imported at the top, so the forkserver preloads it once for every unit (:func:`bench.engine.process.Worker`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import transformers  # noqa: F401  (preloaded by the forkserver: see above)

from bench.engine.cache import cache_dir, use_compile_cache
from bench.engine.config import import_plugins
from bench.engine.process import failure
from bench.engine.threads import torch_threads
from bench.pretrained.config import PretrainedConfig
from models.pretrained import load_causal_lm, resolve_source


def unit_worker_main(unit: Any, rows_of: Callable[..., list[dict[str, Any]]], conn: Any) -> None:
    """Entry point of a unit's worker: load the model, send ``rows_of(unit, model, encode)`` (this module imports
    no unit)."""
    use_compile_cache("cpu")
    try:
        import_plugins(unit.config.plugins)
        with torch_threads(unit.config.threads), torch.no_grad():
            rows = rows_of(unit, *_model(unit.config))
    except Exception as err:
        conn.send(("failed", failure(err, "cpu")))
        return
    conn.send(("rows", rows))


def _model(config: PretrainedConfig) -> tuple[Any, Any]:
    """The model and a function that encodes text into token ids (no special tokens)."""
    model, tokenizer = load_causal_lm(resolve_source(config.model), cache=cache_dir())
    return model, lambda text: tokenizer(text, add_special_tokens=False).input_ids
