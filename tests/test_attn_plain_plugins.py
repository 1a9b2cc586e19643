"""Plain plug-ins: third-party nn.Modules that follow the tensor contract, registered as they are."""

from __future__ import annotations

import importlib
import math
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

import attn.registry as registry
from attn import KernelPath, PlainModuleAttention, attention_info, create_attention, register_attention
from attn.conformance import ConformanceReport, check_attention

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "attn_bench_plain_window"
STRUCTURAL = ("shape_dtype_finite", "gradients", "causal_no_leak", "key_mask", "batch_independence")


# ---- plain modules as a researcher writes them: no attn import, own math --------------------


def softmax_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, scale: float) -> Tensor:
    """Softmax over allowed keys ``(B|1, 1, Nq, Nk)``; rows with no allowed key give zeros."""
    scores = q @ k.transpose(-2, -1) * scale  # (B, H, Nq, Nk)
    has_key = allowed.any(dim=-1, keepdim=True)  # (B|1, 1, Nq, 1)
    scores = scores.masked_fill(~allowed, float("-inf")).masked_fill(~has_key, 0.0)
    return torch.softmax(scores, dim=-1).masked_fill(~has_key, 0.0) @ v  # (B, H, Nq, Dv)


def allowed_keys(q: Tensor, k: Tensor, causal: bool, key_mask: Tensor | None) -> Tensor:
    """Bool ``(B|1, 1, Nq, Nk)``: bottom-right causal alignment and key padding."""
    q_len, k_len = q.shape[2], k.shape[2]
    rows = torch.arange(q_len)[:, None] + (k_len - q_len)  # (Nq, 1) absolute positions
    allowed = torch.ones(q_len, k_len, dtype=torch.bool)
    if causal:
        allowed = torch.arange(k_len)[None, :] <= rows  # (Nq, Nk)
    allowed = allowed[None, None]  # (1, 1, Nq, Nk)
    return allowed if key_mask is None else allowed & key_mask[:, None, None, :]


class PlainFull(nn.Module):
    """Full softmax attention written by hand."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None):
        return softmax_attention(q, k, v, allowed_keys(q, k, causal, key_mask), q.shape[-1] ** -0.5)


class NoInit(nn.Module):
    """Full attention with no __init__ of its own."""

    def forward(self, q, k, v, causal=False, key_mask=None):
        return softmax_attention(q, k, v, allowed_keys(q, k, causal, key_mask), q.shape[-1] ** -0.5)


class PlainTemperature(nn.Module):
    """Softmax attention with a temperature: scores / (sqrt(D) * temperature)."""

    example_params = ({"temperature": 0.5},)

    def __init__(self, temperature: float = 1.0) -> None:
        super().__init__()
        self.temperature = temperature

    def forward(self, q, k, v, *, causal=False, key_mask=None):
        scale = 1.0 / (math.sqrt(q.shape[-1]) * self.temperature)
        return softmax_attention(q, k, v, allowed_keys(q, k, causal, key_mask), scale)


class PlainHeadGate(nn.Module):
    """Full attention with a learned gate per head; asks for num_heads and head_dim."""

    def __init__(self, num_heads: int, head_dim: int | None = None, init: float = 1.0) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.gate = nn.Parameter(torch.full((num_heads,), init))

    def forward(self, q, k, v, *, causal=False, key_mask=None):
        out = softmax_attention(q, k, v, allowed_keys(q, k, causal, key_mask), q.shape[-1] ** -0.5)
        return out * self.gate.to(out.dtype)[None, :, None, None]  # (B, H, Nq, Dv)


class PlainKwargs(PlainFull):
    """Full attention that keeps whatever keyword arguments it is given."""

    def __init__(self, **kwargs) -> None:
        super().__init__()
        self.received = kwargs


class PlainNoCausal(PlainFull):
    """Full attention that refuses causal calls by raising NotImplementedError."""

    def forward(self, q, k, v, *, causal=False, key_mask=None):
        if causal:
            raise NotImplementedError("no causal form")
        return super().forward(q, k, v, key_mask=key_mask)


class DeclaredNonCausal(PlainFull):
    """Full attention that declares it has no causal form."""

    supports_causal = False
    exact = True


class LeaksFuture(PlainFull):
    """Claims causal support but ignores ``causal``."""

    def forward(self, q, k, v, *, causal=False, key_mask=None):
        return super().forward(q, k, v, key_mask=key_mask)


class IgnoresKeyMask(PlainFull):
    """Forgets the padding mask."""

    def forward(self, q, k, v, *, causal=False, key_mask=None):
        return super().forward(q, k, v, causal=causal)


class WrongForward(nn.Module):
    """A module whose forward does not follow the contract."""

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        return x


class WrongShape(PlainFull):
    """Returns (B, H, Nq, D) instead of (B, H, Nq, Dv)."""

    def forward(self, q, k, v, *, causal=False, key_mask=None):
        return q


# ---- the hand reference ----------------------------------------------------------------------


def hand_reference(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None,
    temperature: float = 1.0, window: int | None = None,
) -> Tensor:
    """Softmax attention one (batch, query row) at a time over the keys that row may see."""
    batch, heads, q_len, dim = q.shape
    k_len = k.shape[2]
    out = torch.zeros(batch, heads, q_len, v.shape[-1], dtype=q.dtype)
    for b in range(batch):
        for r in range(q_len):
            i = k_len - q_len + r  # absolute position of query row r
            keys = [
                j for j in range(k_len)
                if (not causal or j <= i) and (key_mask is None or bool(key_mask[b, j]))
                and (window is None or abs(i - j) <= window)
            ]
            if not keys:
                continue
            scores = torch.einsum("hd,hkd->hk", q[b, :, r], k[b, :, keys]) / (math.sqrt(dim) * temperature)
            out[b, :, r] = torch.einsum("hk,hkv->hv", torch.softmax(scores, dim=-1), v[b, :, keys])
    return out


def inputs(seed: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """q (2, 3, 7, 8), k (2, 3, 11, 8), v (2, 3, 11, 5) in float64 and a key_mask (2, 11) with padding."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 3, 7, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 3, 11, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 3, 11, 5, generator=gen, dtype=torch.float64)
    key_mask = torch.ones(2, 11, dtype=torch.bool)
    key_mask[0, 8:] = False
    key_mask[1, [2, 5, 10]] = False
    return q, k, v, key_mask


def assert_matches_hand_reference(att: torch.nn.Module, **reference_kwargs) -> None:
    q, k, v, key_mask = inputs()
    for causal in (False, True):
        for mask in (None, key_mask):
            expected = hand_reference(q, k, v, causal=causal, key_mask=mask, **reference_kwargs)
            torch.testing.assert_close(att(q, k, v, causal=causal, key_mask=mask), expected)


def statuses(report: ConformanceReport) -> dict[str, set[str]]:
    """{check name: statuses seen}."""
    seen: dict[str, set[str]] = {}
    for result in report.results:
        seen.setdefault(result.check, set()).add(result.status)
    return seen


@pytest.fixture
def registered() -> Iterator[Callable[[str, object], None]]:
    """Register objects under names for one test; unregistered afterwards."""
    names: list[str] = []

    def register(name: str, obj: object) -> None:
        register_attention(name)(obj)
        names.append(name)

    yield register
    for name in names:
        registry.unregister_attention(name)


# ---- creation by name ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "params", "reference"),
    [
        (PlainFull, {}, {}),
        (NoInit, {}, {}),
        (PlainTemperature, {"temperature": 0.5}, {"temperature": 0.5}),
        (PlainHeadGate, {}, {}),
    ],
    ids=["no_params", "no_init", "own_param", "asks_num_heads"],
)
def test_plain_plugin_created_by_name_matches_hand_reference(registered, cls, params, reference) -> None:
    registered("test_plain", cls)
    att = create_attention("test_plain", num_heads=3, head_dim=8, **params)
    assert isinstance(att, PlainModuleAttention) and type(att.inner) is cls
    assert att.name == "test_plain" and att.kernel == "auto"
    assert_matches_hand_reference(att, **reference)
    assert att.last_path == KernelPath("native", f"plain module {cls.__module__}.{cls.__qualname__}")


def test_plain_plugin_gets_only_the_arguments_it_asks_for(registered) -> None:
    registered("test_gate", PlainHeadGate)
    registered("test_kwargs", PlainKwargs)
    registered("test_full", PlainFull)
    gate = create_attention("test_gate", num_heads=3, head_dim=8, init=0.5)
    assert gate.inner.gate.shape == (3,) and gate.inner.head_dim == 8
    assert create_attention("test_kwargs", num_heads=3, head_dim=8).inner.received == {"num_heads": 3, "head_dim": 8}
    assert create_attention("test_kwargs").inner.received == {}  # None means "not given"
    assert create_attention("test_full", num_heads=3, head_dim=8, kernel="native").kernel == "native"
    with pytest.raises(ValueError, match="parameter 'num_heads' is required"):
        create_attention("test_gate")
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) 'window'; allowed parameters are none"):
        create_attention("test_full", window=3)


def test_plain_plugin_kernel_must_be_auto_or_native(registered) -> None:
    registered("test_full", PlainFull)
    with pytest.raises(ValueError, match=r"'kernel': unknown value 'sdpa'; allowed values are \['auto', 'native'\]"):
        create_attention("test_full", kernel="sdpa")


def test_wrapper_validates_inputs_and_output(registered) -> None:
    registered("test_full", PlainFull)
    registered("test_wrong_shape", WrongShape)
    att = create_attention("test_full", num_heads=3)
    q, k, v, _ = inputs()
    with pytest.raises(ValueError, match="test_full: argument 'q' must be 4-D"):
        att(q[0], k, v)
    with pytest.raises(ValueError, match="argument 'key_mask' must have dtype torch.bool"):
        att(q, k, v, key_mask=torch.ones(2, 11))
    with pytest.raises(ValueError, match="'q' has 2 heads but the module was built with num_heads=3"):
        att(q[:, :2], k[:, :2], v[:, :2])
    with pytest.raises(ValueError, match=r"returned shape \(2, 3, 7, 8\); .* \(B, H, Nq, Dv\) = \(2, 3, 7, 5\)"):
        create_attention("test_wrong_shape")(q, k, v)


def test_inner_parameters_train_and_move_with_the_wrapper(registered) -> None:
    registered("test_gate", PlainHeadGate)
    att = create_attention("test_gate", num_heads=3).to(torch.float64)
    assert [name for name, _ in att.named_parameters()] == ["inner.gate"]
    assert att.inner.gate.dtype == torch.float64
    q, k, v, key_mask = inputs()
    att(q, k, v, causal=True, key_mask=key_mask).sum().backward()
    assert att.inner.gate.grad is not None and torch.isfinite(att.inner.gate.grad).all()


def test_factory_returning_a_plain_module_is_wrapped(registered) -> None:
    def make_plain(temperature: float = 1.0) -> nn.Module:
        """Factory of a temperature attention."""
        return PlainTemperature(temperature)

    registered("test_factory", make_plain)
    att = create_attention("test_factory", num_heads=3, head_dim=8, temperature=2.0)
    assert isinstance(att, PlainModuleAttention) and att.name == "test_factory"
    assert_matches_hand_reference(att, temperature=2.0)


def test_non_contract_module_is_rejected_at_registration() -> None:
    with pytest.raises(ValueError, match=r"must follow forward\(q, k, v, \*, causal=False, key_mask=None\)"):
        register_attention("test_wrong_forward")(WrongForward)
    with pytest.raises(ValueError, match="not an nn.Module"):
        register_attention("test_not_module")(type("NotAModule", (), {}))
    assert "test_wrong_forward" not in registry.list_attention()


# ---- info and causal support -----------------------------------------------------------------


def test_attention_info_describes_a_plain_plugin(registered) -> None:
    registered("test_temperature", PlainTemperature)
    registered("test_gate", PlainHeadGate)
    registered("test_non_causal", DeclaredNonCausal)
    info = attention_info("test_temperature")
    assert info.params == {"temperature": 1.0} and info.kernels == ("native",)
    assert info.supports_causal and not info.exact and not info.forces_causal
    assert info.description == "Softmax attention with a temperature: scores / (sqrt(D) * temperature)."
    assert info.example_params == ({"temperature": 0.5},)
    assert info.source.endswith(":PlainTemperature")
    assert attention_info("test_gate").params == {"init": 1.0}  # num_heads / head_dim are not its own
    declared = attention_info("test_non_causal")
    assert not declared.supports_causal and declared.exact and declared.params == {}


def test_declared_non_causal_plain_plugin_refuses_causal(registered) -> None:
    registered("test_non_causal", DeclaredNonCausal)
    att = create_attention("test_non_causal")
    assert not att.supports_causal and att.exact
    q, k, v, _ = inputs()
    with pytest.raises(NotImplementedError, match="argument 'causal' must be False"):
        att(q, k, v, causal=True)


# ---- the conformance kit ---------------------------------------------------------------------


@pytest.mark.parametrize("cls", [PlainFull, PlainTemperature, PlainHeadGate], ids=lambda c: c.__name__)
def test_kit_runs_structural_checks_on_a_correct_plain_plugin(registered, cls) -> None:
    registered("test_plain", cls)
    report = check_attention("test_plain")
    report.raise_if_failed()
    seen = statuses(report)
    assert all(seen[check] == {"pass"} for check in STRUCTURAL), str(report)
    assert seen["matches_reference"] == {"skip"} and seen["pattern"] == {"skip"}  # no mask_mod


def test_kit_compares_an_exact_plain_plugin_with_the_full_reference(registered) -> None:
    registered("test_non_causal", DeclaredNonCausal)  # exact = True and no mask_mod: full attention
    report = check_attention("test_non_causal")
    report.raise_if_failed()
    seen = statuses(report)
    assert seen["matches_reference"] == {"pass"} and seen["pattern"] == {"pass"}
    assert seen["causal_no_leak"] == {"skip"}


def test_kit_reports_a_refused_causal_call_as_unsupported(registered) -> None:
    registered("test_no_causal", PlainNoCausal)
    report = check_attention("test_no_causal")
    report.raise_if_failed()
    leak = [r for r in report.results if r.check == "causal_no_leak"]
    assert leak and all(r.status == "skip" and "refused" in r.message for r in leak)


def test_kit_fails_a_plain_plugin_that_leaks_the_future(registered) -> None:
    registered("test_leaks", LeaksFuture)
    report = check_attention("test_leaks")
    assert not report.passed
    leak = [f for f in report.failures if "causal_no_leak" in f]
    assert leak and "future leakage" in leak[0]


def test_kit_fails_a_plain_plugin_that_ignores_key_mask(registered) -> None:
    registered("test_mask_blind", IgnoresKeyMask)
    report = check_attention("test_mask_blind")
    assert not report.passed
    masked = [f for f in report.failures if f.startswith("[FAIL] key_mask")]
    assert masked and "key_mask ignored" in masked[0]


# ---- through a real entry point --------------------------------------------------------------


def tree(root: Path) -> dict[str, int]:
    """Every path under ``root`` with its modification time (ns): what a build may change."""
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*"))}


def install_distribution(project: Path, target: Path) -> Path:
    """pip-install a copy of ``project`` (no dependencies, no index) into the directory
    ``target``: the build's ``build/`` and ``*.egg-info`` go next to the copy, beside
    ``target``, never into the repository's ``examples/``."""
    copy = target.parent / f"{project.name}-src"
    shutil.copytree(project, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--no-compile", "--target", str(target), str(copy)],
        check=True, capture_output=True, text=True, timeout=300,
    )
    return target


def test_plain_plugin_registers_through_entry_point(tmp_path, monkeypatch) -> None:
    """The example package (no attn import) is found, created by name, matches and passes the kit."""
    before = tree(EXAMPLE)
    monkeypatch.syspath_prepend(str(install_distribution(EXAMPLE, tmp_path / "site")))
    assert tree(EXAMPLE) == before  # built out of the repository's tree: no build/, no egg-info
    importlib.invalidate_caches()
    try:
        errors = registry.load_plugins(reload=True)
        assert "plain_window" not in errors
        info = attention_info("plain_window")
        assert info.source == "entry point attn_bench_plain_window:LocalWindowAttention"
        assert info.params == {"window": 4} and info.kernels == ("native",) and info.exact
        att = create_attention("plain_window", num_heads=3, head_dim=8, window=2)
        assert isinstance(att, PlainModuleAttention) and att.inner.window == 2
        assert_matches_hand_reference(att, window=2)
        assert att.last_path.path == "plain module attn_bench_plain_window.LocalWindowAttention"
        report = check_attention("plain_window")
        report.raise_if_failed()
        seen = statuses(report)
        assert seen["matches_reference"] == {"pass"} and seen["pattern"] == {"pass"}  # it has a mask_mod
    finally:
        registry.unregister_attention("plain_window")
        sys.modules.pop("attn_bench_plain_window", None)
