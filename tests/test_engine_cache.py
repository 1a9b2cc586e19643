"""One compile cache per torch, Triton and device kind, under the suite's cache directory,
shared by every worker; a directory the user set is kept."""

from __future__ import annotations

import torch
from torch._inductor.runtime.cache_dir_utils import cache_dir as inductor_cache_dir

from bench.engine import cache
from bench.engine.provenance import environment


def test_workers_compile_into_the_shared_cache(monkeypatch, tmp_path):
    monkeypatch.setenv(cache.ENV_VAR, str(tmp_path))
    monkeypatch.delenv(cache.INDUCTOR_VAR, raising=False)
    chosen = cache.use_compile_cache("cpu")
    expected = tmp_path.resolve() / "inductor" / f"torch-{torch.__version__}-triton-none-cpu"
    assert chosen == str(expected) and cache.compile_cache_dir("cpu") == expected
    assert inductor_cache_dir() == str(expected)  # what Inductor itself will use
    assert environment("cpu", 1, probe=False)["compile_cache"] == str(expected)


def test_a_cache_directory_the_user_set_is_kept(monkeypatch, tmp_path):
    monkeypatch.setenv(cache.INDUCTOR_VAR, str(tmp_path / "mine"))
    assert cache.use_compile_cache("cuda") == str(tmp_path / "mine")
    assert environment("cpu", 1, probe=False)["compile_cache"] == str(tmp_path / "mine")
