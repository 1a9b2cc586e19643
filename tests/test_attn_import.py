"""The package's bottom layer loads without torch: ``attn/__init__.py`` resolves its public names
on first use (PEP 562), so ``import attn.validation`` (what the CLI imports at start-up) stays
cheap, while ``from attn import create_attention`` works as before."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """``python -c code`` in a fresh interpreter that imports this tree's packages."""
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})


@pytest.mark.parametrize("module", ["attn.validation", "attn.supervise", "bench.cli.common", "bench.decoding.options"])
def test_the_bottom_layer_and_the_cli_helpers_import_without_torch(module: str) -> None:
    result = run_python(f"import {module}, sys; assert 'torch' not in sys.modules, sorted(sys.modules)")
    assert result.returncode == 0, result.stderr[-2000:]


def test_the_public_names_resolve_lazily() -> None:
    result = run_python(
        "import sys, attn\n"
        "assert 'torch' not in sys.modules\n"
        "assert set(attn.__all__) <= set(dir(attn))\n"
        "for name in attn.__all__:\n"
        "    getattr(attn, name)\n"
        "assert 'sliding_window' in attn.list_attention()\n"
        "from attn import create_attention\n"
        "assert create_attention('full').kernel == 'auto'\n"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        import attn

        attn.no_such_name  # noqa: B018
