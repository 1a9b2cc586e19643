"""The four baseline plug-in packages under examples/, imported from their folders (no pip
install) and registered under their entry-point names, for the tests that need them."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import attn.registry as registry
from attn import register_attention

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
PACKAGES = {"linear_attention": "attn_bench_linear", "performer": "attn_bench_performer",
            "linformer": "attn_bench_linformer", "bigbird": "attn_bench_bigbird",
            "retention": "attn_bench_retention", "gla": "attn_bench_gla", "ssd": "attn_bench_ssd"}
CLASSES = {"linear_attention": "LinearAttention", "performer": "PerformerAttention",
           "linformer": "LinformerAttention", "bigbird": "BigBirdAttention",
           "retention": "RetentionAttention", "gla": "GatedLinearAttention", "ssd": "SSDAttention"}


def load(package: str) -> ModuleType:
    """Import a package from its folder under examples/ (no pip install)."""
    src = str(EXAMPLES / package / "src")
    if src not in sys.path:
        sys.path.insert(0, src)
    return importlib.import_module(package)


@contextmanager
def baselines_registered() -> Iterator[dict[str, type]]:
    """Register the four packages' classes under their entry-point names while inside."""
    classes = {name: getattr(load(PACKAGES[name]), cls) for name, cls in CLASSES.items()}
    for name, cls in classes.items():
        register_attention(name, overwrite=True)(cls)
    try:
        yield classes
    finally:
        for name in classes:
            registry.unregister_attention(name)
