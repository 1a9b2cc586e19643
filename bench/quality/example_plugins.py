"""A grid plug-in (``plugins: [bench.quality.example_plugins]``): importing it registers each attention package
under ``examples/`` that is not installed, from its folder and under its entry-point name, so a preset that names
them runs from a checkout without ``pip install -e examples/...``; an installed package (registered by its entry
point) is left alone. It reads a checkout: without ``examples/`` beside the packages it raises ``ImportError``."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from attn import list_attention, register_attention
from attn.registry import ENTRY_POINT_GROUP

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def entry_points(pyproject: Path) -> dict[str, str]:
    """``{name: "module:Class"}``: the ``attn_bench.attention`` entry points a package's ``pyproject.toml``
    declares (``name = "module:Class"`` lines of that one table)."""
    table = f'[project.entry-points."{ENTRY_POINT_GROUP}"]'
    found, inside = {}, False
    for line in pyproject.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("["):
            inside = line == table
        elif inside and "=" in line:
            name, _, value = line.partition("=")
            found[name.strip()] = value.strip().strip("\"'")
    return found


def register_examples(root: Path = EXAMPLES) -> list[str]:
    """Register every example attention under ``root`` whose name is not registered yet; the names it registered."""
    if not root.is_dir():
        raise ImportError(f"{root}: no examples folder; bench.quality.example_plugins reads a checkout of "
                          "the repository (elsewhere, pip install the packages instead)")
    known, added = set(list_attention()), []
    for pyproject in sorted(root.glob("*/pyproject.toml")):
        for name, target in entry_points(pyproject).items():
            if name in known:
                continue
            module, _, attribute = target.partition(":")
            source = str(pyproject.parent / "src")
            if source not in sys.path:
                sys.path.append(source)  # after site-packages: an installed copy would win
            register_attention(name)(getattr(importlib.import_module(module), attribute))
            added.append(name)
    return added


register_examples()
