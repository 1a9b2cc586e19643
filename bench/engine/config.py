"""The config layer every product shares: errors that name the key, YAML read within limits,
preset files, plug-ins, the device check and file-name-safe names.

Every error is a :class:`ConfigError` (a ``ValueError``) whose message names the key and the
allowed values, so the CLI prints one line instead of a traceback; a value it echoes is cut
to a readable length (:func:`bench.engine.messages.shown`). A file over the limits of
:class:`bench.engine.bounded_yaml.YamlLimits` (its size, the items and characters it stands
for once its aliases are expanded, one string's length) is refused before it is expanded
(:func:`load_yaml`). A speed sweep's config is :mod:`bench.speed.config`, a training grid's
:mod:`bench.quality.grid_config`; both live in ``bench/configs`` beside each other
(:func:`resolve_config_path`, :func:`read_config`), and :func:`bench.runner.load_run` reads
either once.

``plugins:`` names modules a run imports (:func:`import_plugins`) before its config is
parsed, and each worker before its unit: a config is as trusted as a script. Parsing a
config imports nothing (:func:`plugin_modules` only checks the key).
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from attn.validation import invalid
from bench.engine.bounded_yaml import LIMITS, YamlLimitError, load_bounded
from bench.engine.messages import cut, shown

PRESET_DIR = Path(__file__).resolve().parent.parent / "configs"  # bench/configs
DEVICES = ("cpu", "cuda")
DTYPES = ("float32", "float16", "bfloat16", "float64")


class ConfigError(ValueError):
    """An invalid config (a sweep, a grid, a task preset, an option that overrides one); the
    message names the offending key (also in ``key``)."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


def key_subject(key: str) -> str:
    """``config key 'KEY'``: how an error names config key ``key``."""
    return f"config key {shown(key)}"


def key_error(key: str, problem: str) -> ConfigError:
    """The error for config key ``key`` (in the one dialect of :mod:`attn.validation`)."""
    return invalid(key_subject(key), problem, functools.partial(ConfigError, key=key))


def check_key(check: Callable[..., Any], key: str, value: Any, **rules: Any) -> Any:
    """``check`` (one of :mod:`attn.validation`'s) applied to config key ``key``."""
    return check(key_subject(key), value, error=functools.partial(ConfigError, key=key), **rules)


def check_device(device: str) -> None:
    """``ConfigError`` before anything runs when the config's device is not available here."""
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("config key 'device': cuda is not available on this machine "
                              "(torch.cuda.is_available() is False); allowed here: ['cpu']",
                              "device")


def plugin_modules(raw: Any) -> tuple[str, ...]:
    """The ``plugins`` key of a config mapping ``raw`` (none: ``()``), checked to be a list of
    module names; nothing is imported."""
    plugins = raw.get("plugins", []) if isinstance(raw, dict) else []
    if not isinstance(plugins, (list, tuple)) or not all(isinstance(p, str) for p in plugins):
        raise key_error("plugins", f"must be a list of importable module names; got {shown(plugins)}")
    return tuple(plugins)


def import_plugins(modules: tuple[str, ...]) -> None:
    """Import plug-in modules (which register attentions by decorator); importing runs their
    code, so a config that names plug-ins is as trusted as a script."""
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as err:  # ImportError, SyntaxError, or the module's own failure
            detail = str(err).splitlines()[0] if str(err) else ""
            raise key_error("plugins", f"cannot import module {shown(module)}: "
                                      f"{type(err).__name__}: {cut(detail, 500)}") from None


def resolve_config_path(config: str) -> Path:
    """A YAML path, or a config preset's name from ``bench/configs`` (``quick``, ``scaling-cpu``,
    ...)."""
    path = Path(config)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise ConfigError(f"config file {shown(config)} does not exist")
        return path
    preset = PRESET_DIR / f"{config}.yaml"
    if not preset.is_file():
        raise ConfigError(f"unknown config {shown(config)}; presets are {list_config_presets()}")
    return preset


def read_config(config: str | Path) -> tuple[Path, Any]:
    """The file a config names (a YAML path or a config preset's name) and its YAML, read
    once within the limits (:func:`resolve_config_path`, :func:`load_yaml`)."""
    path = resolve_config_path(str(config))
    return path, load_yaml(path)


def list_config_presets() -> list[str]:
    """Names of the config presets: the sweep and grid configs shipped in ``bench/configs``
    (``attn-bench sweep NAME``; not the task presets of ``bench/configs/tasks``, which are
    :func:`bench.quality.settings.list_task_presets`)."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_yaml(path: Path) -> Any:
    """``yaml.safe_load`` of a file within :class:`bench.engine.bounded_yaml.YamlLimits`;
    ``ConfigError`` naming the file when it is not YAML, cannot be read or is over a limit."""
    try:
        size = path.stat().st_size
        if size > LIMITS.max_bytes:  # not read at all
            raise ConfigError(f"{path}: {size:,} bytes; a config may have at most "
                              f"{LIMITS.max_bytes:,}")
        return load_bounded(path.read_text(), str(path))
    except YamlLimitError as err:
        raise ConfigError(str(err)) from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read the config: {err}") from None


def safe_name(text: str) -> str:
    """A file-name-safe version of a config value (no separators, no leading dots)."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+|\.{2,}", "_", text)
    cleaned = re.sub(r"_+", "_", cleaned).strip("._")
    return cleaned[:80] or "run"
