"""The four registries (attentions, kernels, model kinds, quality tasks) follow one set of
rules, those of :class:`attn.table.Table`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from attn import ExactAttention
from attn.kernels import BUILTIN_KERNELS, KERNELS, register_kernel, unregister_kernel
from attn.kernels.reference import ReferenceKernel
from attn.registration import REGISTRY, register_attention, unregister_attention
from attn.table import RegistrationError, Table
from bench.quality.tasks import TASKS, ClassificationTask, register_task, unregister_task
from models import EncoderClassifier, EncoderClassifierConfig, register_model, unregister_model
from models.registration import MODELS


@dataclass(frozen=True)
class Domain:
    """One registry: its table, the name its register function's errors give the name, a
    class to register (``make(name, tag)``; a new definition per tag) and how to (un)register it."""

    table: Table[Any]
    arg: str
    make: Callable[[Any, str], type]
    register: Callable[[Any, type, bool], object]
    unregister: Callable[[str], None]


def subclass(base: type, tag: str, **attrs: Any) -> type:
    """A new class ``tag`` defined in this module."""
    return type(tag, (base,), {"__module__": __name__, **attrs})


DOMAINS = {
    "attention": Domain(REGISTRY, "name", lambda name, tag: subclass(ExactAttention, tag),
                        lambda name, cls, overwrite: register_attention(name, overwrite=overwrite)(cls),
                        unregister_attention),
    "kernel": Domain(KERNELS, "name", lambda name, tag: subclass(ReferenceKernel, tag, name=name),
                     lambda name, cls, overwrite: register_kernel(cls, overwrite=overwrite),
                     unregister_kernel),
    "model": Domain(MODELS, "kind",
                    lambda name, tag: subclass(EncoderClassifier, tag),
                    lambda name, cls, overwrite: register_model(name, EncoderClassifierConfig,
                                                                overwrite=overwrite)(cls),
                    unregister_model),
    "task": Domain(TASKS, "name", lambda name, tag: subclass(ClassificationTask, tag),
                   lambda name, cls, overwrite: register_task(name, presets={}, overwrite=overwrite)(cls),
                   unregister_task),
}


@pytest.fixture(params=list(DOMAINS))
def domain(request: pytest.FixtureRequest) -> Domain:
    return DOMAINS[request.param]


@pytest.mark.parametrize("bad", ["bad-name", "1st", "", 3])
def test_a_name_that_is_no_identifier_is_refused(domain: Domain, bad: Any) -> None:
    with pytest.raises(ValueError, match=rf"'{domain.arg}' must be an identifier string .*; got") as caught:
        domain.register(bad, domain.make(bad, "Bad"), False)
    assert isinstance(caught.value, RegistrationError)
    assert bad not in domain.table


def test_a_taken_name_is_replaced_only_with_overwrite(domain: Domain) -> None:
    first, second = domain.make("shared_rules", "First"), domain.make("shared_rules", "Second")
    domain.register("shared_rules", first, False)
    domain.register("shared_rules", first, False)  # the same definition again: no change
    with pytest.raises(ValueError, match=rf"{domain.arg} 'shared_rules' is already registered by "
                                         rf"{__name__}:First; pass overwrite=True"):
        domain.register("shared_rules", second, False)
    assert domain.table.sources["shared_rules"] == f"{__name__}:First"
    domain.register("shared_rules", second, True)
    assert domain.table.sources["shared_rules"] == f"{__name__}:Second"


def test_unregister_removes_the_name(domain: Domain) -> None:
    domain.register("shared_gone", domain.make("shared_gone", "Gone"), False)
    assert "shared_gone" in domain.table
    domain.unregister("shared_gone")
    assert "shared_gone" not in domain.table and "shared_gone" not in domain.table.sources
    domain.unregister("shared_gone")  # absent: no error


def test_builtin_sources_are_recorded() -> None:
    assert REGISTRY.sources["full"] == "attn.variants.full:FullAttention"
    assert KERNELS.sources["sdpa"] == "attn.kernels.sdpa:SdpaKernel" and len(KERNELS) >= len(BUILTIN_KERNELS)
    assert MODELS.sources["vit"] == "models.vit:ViT"
    assert TASKS.sources["listops"].startswith("bench.quality.tasks.listops:")


def test_a_kernel_registration_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="register_kernel: 'cls' must be a Kernel subclass; got 42"):
        register_kernel(42)  # type: ignore[arg-type]
