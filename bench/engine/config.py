"""The config layer every product shares: errors naming the key, presets, plug-ins (trusted as a script is)."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attn.validation import invalid
from bench.engine.bounded_yaml import LIMITS, YamlLimitError, load_bounded
from bench.engine.messages import cut, shown

PRESET_DIR = Path(__file__).resolve().parent.parent / "configs"  # bench/configs
DEVICES = ("cpu", "cuda")
DTYPES = ("float32", "float16", "bfloat16", "float64")


class ConfigError(ValueError):
    """An invalid config or override; the message names the offending key (also in ``key``)."""

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
    import torch  # here, not at import: the history of the results files needs no torch

    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("config key 'device': cuda is not available on this machine "
                          "(torch.cuda.is_available() is False); allowed here: ['cpu']", "device")


def is_plugin_file(plugin: str) -> bool:
    """True when a ``--plugin`` / ``plugins:`` entry names a ``.py`` file rather than a module."""
    return plugin.endswith(".py") or "/" in plugin or os.sep in plugin


def plugin_ref(plugin: str) -> str:
    """A plug-in entry as workers import it: a file's absolute path (they may start elsewhere), else as is."""
    return str(Path(plugin).expanduser().resolve()) if is_plugin_file(plugin) else plugin


def plugin_modules(raw: Any) -> tuple[str, ...]:
    """The checked ``plugins`` of a config mapping (paths made absolute); nothing is imported."""
    plugins = raw.get("plugins", []) if isinstance(raw, dict) else []
    if not isinstance(plugins, (list, tuple)) or not all(isinstance(p, str) for p in plugins):
        raise key_error("plugins", "must be a list of importable module names or .py file "
                                   f"paths; got {shown(plugins)}")
    return tuple(plugin_ref(p) for p in plugins)


def import_plugins(modules: tuple[str, ...]) -> None:
    """Import module names (the current directory too) or ``.py`` paths; ``ConfigError`` naming the failing entry."""
    for module in modules:
        try:
            if is_plugin_file(module):
                import_plugin_file(Path(module))
            else:
                _import_module(module)
        except ConfigError:
            raise
        except Exception as err:  # ImportError, SyntaxError, or the module's own failure
            detail = str(err).splitlines()[0] if str(err) else ""
            what = "file" if is_plugin_file(module) else "module"
            raise key_error("plugins", f"cannot import {what} {shown(module)}: "
                                      f"{type(err).__name__}: {cut(detail, 500)}") from None


def _import_module(name: str) -> None:
    """Import ``name``, also from the current directory (not on ``sys.path`` for the ``attn-bench`` script)."""
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as err:
        cwd = str(Path.cwd())
        top = name.partition(".")[0]
        if err.name not in (name, top) or cwd in sys.path or \
                not (Path(cwd, f"{top}.py").is_file() or Path(cwd, top).is_dir()):
            raise
        sys.path.append(cwd)  # after everything else: it shadows nothing; children inherit it
        importlib.import_module(name)


def import_plugin_file(path: Path) -> None:
    """Import ``path`` as the module its stem names, its directory on ``sys.path`` for child processes to unpickle."""
    path = path.expanduser().resolve()
    if not path.is_file():
        raise key_error("plugins", f"cannot import file {shown(str(path))}: no such file")
    name = path.stem
    if not name.isidentifier():
        raise key_error("plugins", f"cannot import file {shown(str(path))}: its name must be a "
                                   f"Python identifier to serve as a module name; got {shown(name)}")
    loaded = sys.modules.get(name)
    if loaded is not None:
        if Path(getattr(loaded, "__file__", "") or "").resolve() == path:
            return  # imported already (a worker that inherited it, a second --plugin)
        raise _taken(path, name, getattr(loaded, "__file__", None))
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))
    found = importlib.util.find_spec(name)
    if found is not None and found.origin and Path(found.origin).resolve() != path:
        raise _taken(path, name, found.origin)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise key_error("plugins", f"cannot import file {shown(str(path))}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise


def _taken(path: Path, name: str, other: str | None) -> ConfigError:
    return key_error("plugins", f"cannot import file {shown(str(path))}: module name "
                                f"{shown(name)} is taken by {other or 'a built-in module'}; "
                                "rename the file")


def resolve_config_path(config: str) -> Path:
    """A YAML path, or a config preset's name from ``bench/configs``."""
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
    """The file a config names (path or preset) and its YAML, read once within the limits."""
    path = resolve_config_path(str(config))
    return path, load_yaml(path)


def list_config_presets() -> list[str]:
    """Names of the sweep and grid presets in ``bench/configs`` (not the task presets)."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_yaml(path: Path) -> Any:
    """A YAML file read within the limits; ``ConfigError`` naming the file when unreadable or over one."""
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
