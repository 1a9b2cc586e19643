"""Registry and plug-ins: register, create, list, info, entry points."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import pytest
import torch

import attn.registry as registry
from attn import ExactAttention, attention_info, create_attention, list_attention, register_attention
from attn.conformance import check_attention

PLUGIN = Path(__file__).resolve().parents[1] / "examples" / "attn_bench_block_local"


def test_register_create_list_info() -> None:
    @register_attention("test_strided")
    class Strided(ExactAttention):
        """Strided test pattern: j visible to i iff (i - j) % stride == 0."""

        kernels: ClassVar[tuple[str, ...]] = ("reference", "sdpa")
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
        assert info.params["stride"] == 2 and info.kernels == ("reference", "sdpa")
        assert info.description.startswith("Strided test pattern")
        att = create_attention("test_strided", stride=3)
        assert isinstance(att, Strided) and att.stride == 3
        check_attention("test_strided").raise_if_failed()
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
        with pytest.raises(TypeError, match="must return an attn.Attention"):
            create_attention("test_bad_factory")
    finally:
        registry.unregister_attention("test_bad_factory")


def test_plugin_package_registers_through_entry_point(tmp_path, monkeypatch) -> None:
    """Install the example plug-in into a temporary site dir; it is found, created and passes the kit."""
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target), str(PLUGIN)],
        check=True, capture_output=True, text=True, timeout=300,
    )
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
        check_attention("block_local").raise_if_failed()
    finally:
        registry.unregister_attention("block_local")
        sys.modules.pop("attn_bench_block_local", None)
