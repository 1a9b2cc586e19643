"""Registry and plug-ins: register, create, list, info, entry points."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import attn.registry as registry
from attn import ExactAttention, attention_info, create_attention, get_kernel, list_attention, register_attention
from attn.conformance import check_attention


def quick_kernels(name: str) -> list[str]:
    """The kernels of ``name`` that compile nothing per call shape (flex on CPU takes ~10 s a
    shape: it is checked in test_attn_conformance, on the quick profile)."""
    return [k for k in attention_info(name).kernels if not get_kernel(k).compiles_per_shape]

PLUGIN = Path(__file__).resolve().parents[1] / "examples" / "attn_bench_block_local"


def tree(root: Path) -> dict[str, int]:
    """Every path under ``root`` with its modification time (ns): what a build may change."""
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*"))}


def test_register_create_list_info() -> None:
    @register_attention("test_strided")
    class Strided(ExactAttention):
        """Strided test pattern: j visible to i iff (i - j) % stride == 0."""

        example_params = ({"stride": 3},)

        def __init__(self, stride: int = 2, **common) -> None:
            super().__init__(**common)
            self.stride = stride

        def mask_mod(self):
            s = self.stride
            return lambda b, h, i, j: (i - j) % s == 0

    try:
        assert "test_strided" in list_attention()
        info = attention_info("test_strided")
        # its kernels are derived: every kernel that runs a mask_mod it has no band for
        assert info.params["stride"] == 2 and info.kernels == ("reference", "sdpa", "chunked", "flex")
        assert info.description.startswith("Strided test pattern")
        att = create_attention("test_strided", stride=3)
        assert isinstance(att, Strided) and att.stride == 3
        check_attention("test_strided", kernels=quick_kernels("test_strided")).raise_if_failed()
        with pytest.raises(ValueError, match="already registered"):
            register_attention("test_strided")(type("Other", (ExactAttention,), {}))
    finally:
        registry.unregister_attention("test_strided")
    assert "test_strided" not in list_attention()


def test_info_of_every_builtin() -> None:
    info = attention_info("sliding_window")
    assert info.params["window"] == 128 and info.supports_causal and info.exact
    nys = attention_info("nystrom")
    assert not nys.supports_causal and not nys.exact and nys.kernels == ("native",)
    assert nys.params == {"num_landmarks": 64, "pinv_iters": 6, "conv_kernel": None}


def test_factory_returning_non_attention_is_rejected() -> None:
    register_attention("test_bad_factory")(lambda **kw: torch.nn.Identity())
    try:
        with pytest.raises(TypeError, match=r"must return an attn.Attention .* or an nn.Module with forward\(q, k, v"):
            create_attention("test_bad_factory")
    finally:
        registry.unregister_attention("test_bad_factory")


def test_plugin_package_registers_through_entry_point(tmp_path, monkeypatch) -> None:
    """Install the example plug-in into a temporary site dir; it is found, created and passes the kit."""
    target = tmp_path / "site"
    before = tree(PLUGIN)
    copy = tmp_path / "src"  # built from a copy: build/ and *.egg-info stay out of examples/
    shutil.copytree(PLUGIN, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target), str(copy)],
        check=True, capture_output=True, text=True, timeout=300,
    )
    assert tree(PLUGIN) == before
    monkeypatch.syspath_prepend(str(target))
    importlib.invalidate_caches()
    try:
        errors = registry.load_plugins(reload=True)
        assert "block_local" not in errors
        assert "block_local" in list_attention()
        assert "entry point attn_bench_block_local:BlockLocalAttention" in attention_info("block_local").source
        att = create_attention("block_local", block_size=4)
        q = torch.randn(1, 2, 8, 4)
        out = att(q, q, q)
        # block-local: the first block's outputs ignore the second block entirely
        q2 = q.clone()
        q2[:, :, 4:] += 5
        torch.testing.assert_close(att(q2, q2, q2)[:, :, :4], out[:, :, :4])
        check_attention("block_local", kernels=quick_kernels("block_local")).raise_if_failed()
    finally:
        registry.unregister_attention("block_local")
        sys.modules.pop("attn_bench_block_local", None)


# ---- broken plug-ins never break the built-ins -----------------------------------------------

BROKEN_PACKAGE = "attn_bench_broken_plugins"
#: entry point name -> (object reference, what its one-line error must say)
BROKEN_ENTRY_POINTS = {
    "my-attn": (f"{BROKEN_PACKAGE}:Fine", "is not a valid attention name; it must be an identifier"),
    "syntax_broken": (f"{BROKEN_PACKAGE}.syntax_error:Anything", "SyntaxError"),
    "import_fails": (f"{BROKEN_PACKAGE}.raises_on_import:Anything", "RuntimeError: needs a library that is missing"),
    "missing_object": (f"{BROKEN_PACKAGE}:DoesNotExist", "AttributeError"),
    "not_callable": (f"{BROKEN_PACKAGE}:NOT_CALLABLE", "which is not callable"),
    "wrong_forward": (f"{BROKEN_PACKAGE}:WrongForward", "a plain module must follow forward(q, k, v"),
    "full": (f"{BROKEN_PACKAGE}:Impostor", "'full' is already registered by attn.variants.full:FullAttention"),
}
BROKEN_SOURCES = {
    "__init__.py": '''
        """Plug-ins, most of them broken on purpose."""
        import torch
        from torch import nn

        NOT_CALLABLE = 42


        class Fine(nn.Module):
            """A working plain plug-in: full attention."""

            def forward(self, q, k, v, *, causal=False, key_mask=None):
                from attn.kernels.reference import dense_attention

                return dense_attention(q, k, v, causal=causal, key_mask=key_mask)


        class Impostor(Fine):
            """Wants the built-in name 'full' and returns zeros."""

            def forward(self, q, k, v, *, causal=False, key_mask=None):
                return torch.zeros(*q.shape[:3], v.shape[-1], dtype=q.dtype)


        class WrongForward(nn.Module):
            def forward(self, x):
                return x
    ''',
    "syntax_error.py": "def broken(:\n    pass\n",
    "raises_on_import.py": 'raise RuntimeError("needs a library that is missing\\nsecond line of the message")\n',
}


def _write_broken_project(root: Path) -> Path:
    """A distribution whose entry points are BROKEN_ENTRY_POINTS plus one working plug-in."""
    package = root / "src" / BROKEN_PACKAGE
    package.mkdir(parents=True)
    for filename, text in BROKEN_SOURCES.items():
        (package / filename).write_text(textwrap.dedent(text).lstrip())
    entry_points = {**{name: ref for name, (ref, _) in BROKEN_ENTRY_POINTS.items()},
                    "working_plain": f"{BROKEN_PACKAGE}:Fine"}
    lines = "\n".join(f'"{name}" = "{ref}"' for name, ref in entry_points.items())
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "attn-bench-broken-plugins"\nversion = "0.1.0"\n\n'
        f'[project.entry-points."attn_bench.attention"]\n{lines}\n\n'
        '[tool.setuptools.packages.find]\nwhere = ["src"]\n'
    )
    return root


@pytest.fixture(scope="module")
def broken_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The broken distribution installed into a temporary directory on sys.path, plug-ins loaded."""
    root = tmp_path_factory.mktemp("broken_plugins")
    site = root / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--no-compile", "--target", str(site), str(_write_broken_project(root / "project"))],
        check=True, capture_output=True, text=True, timeout=300,
    )
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    try:
        registry.load_plugins(reload=True)
        yield site
    finally:
        sys.path.remove(str(site))
        importlib.invalidate_caches()
        registry.unregister_attention("working_plain")
        for module in [m for m in sys.modules if m.split(".")[0] == BROKEN_PACKAGE]:
            sys.modules.pop(module)
        registry.load_plugins(reload=True)  # forget the errors of the uninstalled distribution


@pytest.mark.parametrize("name", sorted(BROKEN_ENTRY_POINTS))
def test_broken_plugin_is_recorded_with_a_one_line_reason(broken_site, name) -> None:
    errors = registry.plugin_errors()
    ref, reason = BROKEN_ENTRY_POINTS[name]
    assert name in errors, errors
    assert reason in errors[name] and f"entry point {name} = {ref}" in errors[name]
    assert "\n" not in errors[name]


def test_broken_plugins_leave_builtins_and_other_plugins_working(broken_site) -> None:
    from attn.variants.full import FullAttention

    assert set(BROKEN_ENTRY_POINTS) <= set(registry.load_plugins())  # loading again raises nothing
    full = create_attention("full")
    assert type(full) is FullAttention  # the colliding plug-in did not replace the built-in
    assert attention_info("full").source == "attn.variants.full:FullAttention"
    names = list_attention()
    assert "working_plain" in names and "my-attn" not in names and "not_callable" not in names
    q = torch.randn(1, 2, 5, 4)
    torch.testing.assert_close(create_attention("working_plain")(q, q, q), full(q, q, q))


def test_broken_plugins_do_not_break_a_fresh_process(broken_site) -> None:
    """First use in a new interpreter (as every command does) loads the plug-ins and still works."""
    code = (
        "import json; from attn import create_attention, list_attention, plugin_errors; "
        "att = create_attention('full'); "
        "print(json.dumps([type(att).__name__, 'working_plain' in list_attention(), list(plugin_errors())]))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(broken_site), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    kind, has_working, broken = json.loads(done.stdout.splitlines()[-1])
    assert kind == "FullAttention" and has_working and set(BROKEN_ENTRY_POINTS) <= set(broken)


def test_attn_bench_list_shows_broken_plugins(broken_site) -> None:
    env = {**os.environ, "PYTHONPATH": str(broken_site), "COLUMNS": "400"}
    done = subprocess.run(
        [sys.executable, "-c", "from bench.cli import app; app()", "list"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "working_plain" in done.stdout
    for name in BROKEN_ENTRY_POINTS:
        assert f"plug-in {name} failed to load" in done.stdout
