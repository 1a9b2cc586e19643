"""Every row says which code made it: the commit of the source checkout (committed results
being rewritten do not make the code dirty), and nothing from an unrelated repository."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

import bench.engine.provenance as provenance

ROOT = Path(__file__).resolve().parents[1]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A git checkout of an ``attn-bench`` source tree with committed results."""
    repo = tmp_path / "repo"
    (repo / "results" / "quick").mkdir(parents=True)
    (repo / "bench").mkdir()
    (repo / "pyproject.toml").write_text('[project]\nname = "attn-bench"\n')
    (repo / "bench" / "code.py").write_text("x = 1\n")
    (repo / "results" / "quick" / "results.csv").write_text("a,b\n")
    _git(repo, "init", "-q")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    monkeypatch.setattr(provenance, "source_root", lambda: repo)
    provenance.code_version.cache_clear()
    yield repo
    provenance.code_version.cache_clear()


def test_rewritten_results_do_not_make_the_code_dirty(checkout):
    sha = _git(checkout, "rev-parse", "HEAD")
    (checkout / "results" / "quick" / "results.csv").unlink()  # as --overwrite used to do
    assert provenance.code_version() == sha


def test_committed_results_and_docs_keep_the_code_version_and_code_changes_it(checkout):
    sha = _git(checkout, "rev-parse", "HEAD")
    (checkout / "docs").mkdir()
    (checkout / "docs" / "method.md").write_text("how\n")
    (checkout / "bench" / "README.md").write_text("the harness\n")  # Markdown anywhere
    (checkout / "results" / "quick" / "results.csv").write_text("a,b\n1,2\n")
    _commit(checkout, "results and docs")
    assert _git(checkout, "rev-parse", "HEAD") != sha
    assert provenance.code_version() == sha  # a sweep resumed now is still the same code
    (checkout / "bench" / "code.py").write_text("x = 3\n")
    code_sha = _commit(checkout, "code")
    provenance.code_version.cache_clear()
    assert provenance.code_version() == code_sha


def _commit(repo: Path, message: str) -> str:
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message)
    return _git(repo, "rev-parse", "HEAD")


def test_a_changed_code_file_does(checkout):
    (checkout / "bench" / "code.py").write_text("x = 2\n")
    assert provenance.code_version() == _git(checkout, "rev-parse", "HEAD") + "+dirty"


def test_an_installed_package_never_reads_the_repository_around_it(tmp_path):
    """The package copied into a virtual environment's site-packages that sits inside some
    git repository: the version says "installed package", not that repository's commit."""
    outer = tmp_path / "project"
    site = outer / ".venv" / "lib" / "site-packages" / "bench" / "engine"
    site.mkdir(parents=True)
    shutil.copy(ROOT / "bench" / "engine" / "provenance.py", site / "provenance.py")
    (outer / "pyproject.toml").write_text('[project]\nname = "attn-bench"\n')  # the outer repo
    _git(outer, "init", "-q")
    spec = importlib.util.spec_from_file_location("installed_provenance", site / "provenance.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.source_root() is None
    assert module.code_version() == "installed package (no source checkout)"


def test_this_checkout_and_the_installed_version_are_recorded():
    env = provenance.environment("cpu", None)
    assert env["package_version"] == provenance.package_version() != "unknown"
    sha = env["git_sha"].split("+")[0]
    excluded = [provenance._exclude(p) for p in provenance.NOT_CODE]
    assert _git(ROOT, "diff", "--stat", sha, "HEAD", "--", ".", *excluded) == ""  # same code as HEAD
    assert sha == _git(ROOT, "rev-parse", "HEAD") or _git(ROOT, "diff", "--stat", sha, "HEAD")
