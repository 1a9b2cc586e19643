"""Imports run one way: bench on models on attn; inside bench the CLI on four products that
know nothing of each other (speed, quality, decoding, approx), the products on one engine; and inside
each package from the top layer down (the layers are the import-linter contracts in
pyproject.toml).

A lower module importing a higher one, or one product importing another, even inside a
function, breaks a contract here.
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


@pytest.mark.parametrize(("module", "imported", "broken"), [
    # the bottom of attn importing its registry
    ("attn/contract.py", "attn.registry", ["attn layers BROKEN", "attn.contract -> attn.registry"]),
    # the engine importing a product (upward inside bench)
    ("bench/engine/fsutil.py", "bench.speed.sweep",
     ["bench: the CLI on the products, the products on one engine BROKEN",
      "bench.engine is not allowed to import bench.speed",
      "bench.engine.fsutil -> bench.speed.sweep"]),
    # one product importing another (sideways)
    ("bench/quality/significance.py", "bench.speed.report",
     ["the products know nothing of each other BROKEN",
      "bench.quality is not allowed to import bench.speed",
      "bench.quality.significance -> bench.speed.report"]),
], ids=["attn-upward", "bench-upward", "bench-sideways"])
def test_the_contracts_catch_a_forbidden_import(tmp_path, module, imported, broken):
    """The same contracts over a copy of the code where ``module`` imports ``imported``
    (inside a function) report that import: the check is not vacuous."""
    for package in ("attn", "models", "bench"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    source = tmp_path / module
    source.write_text(source.read_text() + f"\n\ndef _forbidden():\n    import {imported}  # noqa: F401\n")
    result = lint(tmp_path)
    assert result.returncode == 1
    for line in broken:
        assert line in result.stdout, result.stdout


def module_cycles(packages: tuple[str, ...] = ("attn", "models", "bench")) -> list[list[str]]:
    """Every import cycle between the packages' modules (a function-local import counts),
    one per strongly connected group: the group's modules, sorted."""
    import grimp

    graph = grimp.build_graph(*packages, include_external_packages=False)
    modules = sorted(graph.modules)
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]

    def visit(module: str) -> None:  # Tarjan's strongly connected components
        index[module] = low[module] = counter[0]
        counter[0] += 1
        stack.append(module)
        on_stack.add(module)
        for other in sorted(graph.find_modules_directly_imported_by(module)):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for module in modules:
        if module not in index:
            visit(module)
    return found


def test_no_module_imports_itself_through_others():
    """No circles: no two modules import each other, directly or through others, even
    inside a function (the kernel and its packed path, the trainer and its run did)."""
    assert module_cycles() == []
