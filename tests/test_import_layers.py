"""Imports run one way: bench on models on attn, and inside each package from the
registry down to the contract (the layers are the import-linter contracts in pyproject.toml).

A lower module importing a higher one, even inside a function, breaks a contract here.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter")

ROOT = Path(__file__).resolve().parents[1]
LINT = (
    "import sys; from importlinter.cli import lint_imports; "
    "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True))"
)


def lint(tree: Path) -> subprocess.CompletedProcess[str]:
    """import-linter over the packages in ``tree`` (run there, so ``tree``'s copies are analysed)."""
    return subprocess.run(
        [sys.executable, "-c", LINT], cwd=tree, capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tree)},
    )


def test_every_import_layer_contract_is_kept():
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_contracts_catch_an_upward_import(tmp_path):
    """The same contracts over a copy of the code whose bottom module imports the registry
    (inside a function) report that import: the check is not vacuous."""
    for package in ("attn", "models", "bench"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    contract = tmp_path / "attn" / "contract.py"
    contract.write_text(contract.read_text() + "\n\ndef _upward():\n    import attn.registry  # noqa: F401\n")
    result = lint(tmp_path)
    assert result.returncode == 1
    assert "attn.contract -> attn.registry" in result.stdout
