"""Tuned ``auto`` orders: the file ``attn-bench tune`` writes, where it lives, and whether it holds here.

docs/kernels.md, "Tuning `auto` for this machine". Nothing is read at import: a file is read when
``auto`` first asks for it, parsed once per (path, inode, mtime, size), and checked against this machine
(:func:`machine_identity`), device, dtype and thread count on every lookup. Without a file that
holds here, ``auto`` keeps its fixed table (:mod:`attn.kernels.auto`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import torch

from attn.machine import cpu_identity

#: a path to the tuning file, or one of :data:`OFF` (``auto`` keeps its fixed table)
TUNING_ENV = "ATTN_BENCH_TUNING"
#: values of :data:`TUNING_ENV` that turn tuning off
OFF = ("off", "none", "0")
FILE_NAME = "tuning.json"
FORMAT = "attn-bench tuning"
VERSION = 1
#: the passes a table holds: a call without gradients takes ``fwd``'s order, one with them ``fwd_bwd``'s
PASSES = ("fwd", "fwd_bwd")
#: the kinds of pattern a table may order (:func:`attn.kernels.auto.kernel_kind`)
KINDS = ("banded", "plain", "biased", "approximate")
#: what must match between a file and this process (besides device, dtype and CPU threads)
IDENTITY_FIELDS = ("cpu_model", "cpu_vendor", "cpu_capability", "cpu_flags", "blas", "torch_version")


@dataclass(frozen=True)
class KindOrder:
    """``auto``'s order for one (kind, pass): ``long`` calls, and ``short`` ones (fewer keys than ``short_keys``).

    ``crossover``: the shortest measured length from which ``long[0]`` won at every longer one (a record);
    ``short_keys`` lies between it and the length before, where the two kernels' times cross."""

    long: tuple[str, ...]
    short: tuple[str, ...] = ()
    short_keys: int | None = None
    crossover: int | None = None

    def is_short(self, k_len: int | None) -> bool:
        """True when a call with ``k_len`` keys (None: a long call) takes :attr:`short`."""
        return self.short_keys is not None and k_len is not None and k_len < self.short_keys

    def order(self, k_len: int | None) -> tuple[str, ...]:
        """The order for a call with ``k_len`` keys."""
        return self.short if self.is_short(k_len) else self.long


@dataclass(frozen=True)
class KernelTime:
    """One kernel's time for one (variant, pass, length): median of ``times_ms``, spread = IQR / median."""

    kind: str
    variant: str
    pass_name: str
    seq_len: int
    kernel: str
    time_ms: float
    spread: float
    times_ms: tuple[float, ...] = ()


@dataclass(frozen=True)
class TuningTable:
    """The orders of one device type, dtype and thread count, and the times they were derived from."""

    device: str
    device_name: str
    dtype: str
    threads: int
    orders: Mapping[tuple[str, str], KindOrder]  # (kind, pass) -> order
    times: tuple[KernelTime, ...] = ()
    #: how it was measured: shape, lengths, repeats, date (a record; never read by ``auto``)
    settings: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, int]:
        """(device, dtype, threads): a file holds one table per key."""
        return self.device, self.dtype, self.threads


@dataclass(frozen=True)
class TuningFile:
    """A tuning file: the machine and torch it was measured with, and its tables."""

    identity: Mapping[str, str]
    tables: tuple[TuningTable, ...]

    def table(self, device: str, dtype: str, threads: int) -> TuningTable | None:
        """The table for ``device``, ``dtype`` and (on the CPU) ``threads``; None when there is none."""
        return next((t for t in self.tables if t.device == device and t.dtype == dtype
                     and (device != "cpu" or t.threads == threads)), None)


class TuningFileError(ValueError):
    """A tuning file that cannot be used (the message says why)."""


def _order_json(order: KindOrder) -> dict[str, Any]:
    return {"long": list(order.long), "short": list(order.short), "short_keys": order.short_keys,
            "crossover": order.crossover}


def to_json(tuning: TuningFile) -> dict[str, Any]:
    """``tuning`` as the JSON object of a tuning file."""
    tables = []
    for table in tuning.tables:
        kinds: dict[str, dict[str, Any]] = {}
        for (kind, pass_name), order in sorted(table.orders.items()):
            kinds.setdefault(kind, {})[pass_name] = _order_json(order)
        tables.append({
            "device": table.device, "device_name": table.device_name, "dtype": table.dtype,
            "threads": table.threads, "settings": dict(table.settings), "orders": kinds,
            "times": [{"kind": t.kind, "variant": t.variant, "pass": t.pass_name, "seq_len": t.seq_len,
                       "kernel": t.kernel, "time_ms": t.time_ms, "spread": t.spread,
                       "times_ms": list(t.times_ms)} for t in table.times],
        })
    return {"format": FORMAT, "version": VERSION, "identity": dict(tuning.identity), "tables": tables}


def _names(where: str, value: Any) -> tuple[str, ...]:
    """Kernel names of an order, without ``reference`` (always last) and repeats."""
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise TuningFileError(f"{where}: must be a list of kernel names; got {value!r}")
    return tuple(dict.fromkeys(v for v in value if v != "reference"))


def _order(where: str, raw: Any) -> KindOrder:
    if not isinstance(raw, dict):
        raise TuningFileError(f"{where}: must be an object with 'long', 'short', 'short_keys'; got {raw!r}")
    long, short = _names(f"{where}.long", raw.get("long")), _names(f"{where}.short", raw.get("short", []))
    limit, crossover = raw.get("short_keys"), raw.get("crossover")
    for name, value in (("short_keys", limit), ("crossover", crossover)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise TuningFileError(f"{where}.{name}: must be null or an integer >= 1; got {value!r}")
    if limit is not None and not short:
        raise TuningFileError(f"{where}.short: must name kernels when short_keys is {limit}")
    return KindOrder(long, short if limit is not None else (), limit, crossover)


def _orders(where: str, raw: Any) -> dict[tuple[str, str], KindOrder]:
    if not isinstance(raw, dict):
        raise TuningFileError(f"{where}: must be an object of kinds; got {raw!r}")
    orders = {}
    for kind, passes in raw.items():
        if kind not in KINDS:
            raise TuningFileError(f"{where}: unknown kind {kind!r}; allowed kinds are {list(KINDS)}")
        if not isinstance(passes, dict):
            raise TuningFileError(f"{where}.{kind}: must be an object of passes {list(PASSES)}")
        for pass_name, order in passes.items():
            if pass_name not in PASSES:
                raise TuningFileError(f"{where}.{kind}: unknown pass {pass_name!r}; allowed passes are "
                                      f"{list(PASSES)}")
            orders[kind, pass_name] = _order(f"{where}.{kind}.{pass_name}", order)
    return orders


def _times(where: str, raw: Any) -> tuple[KernelTime, ...]:
    try:
        return tuple(KernelTime(t["kind"], t["variant"], t["pass"], int(t["seq_len"]), t["kernel"],
                                float(t["time_ms"]), float(t["spread"]),
                                tuple(float(x) for x in t.get("times_ms", ()))) for t in raw)
    except (KeyError, TypeError, ValueError) as err:
        raise TuningFileError(f"{where}: a time must have kind, variant, pass, seq_len, kernel, time_ms "
                              f"and spread ({type(err).__name__}: {err})") from None


def _table(index: int, raw: Any) -> TuningTable:
    where = f"tables[{index}]"
    if not isinstance(raw, dict):
        raise TuningFileError(f"{where}: must be an object; got {raw!r}")
    missing = [k for k in ("device", "dtype", "threads", "orders") if k not in raw]
    if missing:
        raise TuningFileError(f"{where}: lacks {missing}")
    if not isinstance(raw["threads"], int) or raw["threads"] < 1:
        raise TuningFileError(f"{where}.threads: must be an integer >= 1; got {raw['threads']!r}")
    return TuningTable(str(raw["device"]), str(raw.get("device_name", "")), str(raw["dtype"]), raw["threads"],
                       _orders(f"{where}.orders", raw["orders"]), _times(f"{where}.times", raw.get("times", [])),
                       dict(raw.get("settings") or {}))


def from_json(data: Any) -> TuningFile:
    """The :class:`TuningFile` of a parsed JSON object; :class:`TuningFileError` naming what is wrong."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TuningFileError(f"not a tuning file (its 'format' must be {FORMAT!r})")
    if data.get("version") != VERSION:
        raise TuningFileError(f"format version {data.get('version')!r}; this code reads version {VERSION}")
    identity = data.get("identity")
    if not isinstance(identity, dict):
        raise TuningFileError("identity: must be an object naming the CPU and torch it was measured with")
    tables = data.get("tables")
    if not isinstance(tables, list):
        raise TuningFileError(f"tables: must be a list; got {tables!r}")
    return TuningFile({str(k): str(v) for k, v in identity.items()},
                      tuple(_table(i, t) for i, t in enumerate(tables)))


def read_tuning_file(path: str | Path) -> tuple[TuningFile, str]:
    """The file at ``path`` and the first 12 hex digits of its SHA-256; :class:`TuningFileError` if unusable."""
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise TuningFileError(f"cannot read it: {err.strerror or err}") from None
    try:
        parsed = json.loads(data)
    except ValueError as err:
        raise TuningFileError(f"invalid JSON: {err}") from None
    return from_json(parsed), hashlib.sha256(data).hexdigest()[:12]


def default_tuning_path() -> Path:
    """Where ``attn-bench tune`` writes and ``auto`` reads by default: the suite's cache directory.

    ``$ATTN_BENCH_CACHE/tuning.json``, else ``$XDG_CACHE_HOME/attn-bench/tuning.json``, else
    ``~/.cache/attn-bench/tuning.json`` (the directories of ``bench.engine.cache.cache_dir``)."""
    if os.environ.get("ATTN_BENCH_CACHE"):
        return Path(os.environ["ATTN_BENCH_CACHE"]).expanduser() / FILE_NAME
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "attn-bench" / FILE_NAME
    return Path.home() / ".cache" / "attn-bench" / FILE_NAME


def tuning_path() -> Path | None:
    """The file ``auto`` reads: ``$ATTN_BENCH_TUNING`` or :func:`default_tuning_path`; None when turned off."""
    value = os.environ.get(TUNING_ENV)
    if value is None:
        return default_tuning_path()
    if value.strip().lower() in (*OFF, ""):
        return None
    return Path(value).expanduser()


@cache
def machine_identity() -> dict[str, str]:
    """This process's CPU (:func:`attn.machine.cpu_identity`) and torch version: what a file must match."""
    return {**cpu_identity(), "torch_version": torch.__version__}


@cache
def device_name(device_type: str) -> str:
    """The name a table of ``device_type`` records: the GPU's for ``cuda``, else the CPU model's."""
    if device_type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return machine_identity()["cpu_model"]


def identity_problem(theirs: Mapping[str, str], ours: Mapping[str, str]) -> str | None:
    """Why a file measured on ``theirs`` does not hold on ``ours`` (None: it does)."""
    differ = [f"{name} {theirs.get(name, '?')!r} there, {ours.get(name, '?')!r} here"
              for name in IDENTITY_FIELDS if theirs.get(name) != ours.get(name)]
    return f"measured elsewhere: {'; '.join(differ)}" if differ else None


@dataclass(frozen=True)
class Tuning:
    """What ``auto`` uses for one device type, dtype and thread count: tuned orders by (kind, pass), or none.

    ``source``: ``tuned:<sha>`` (the file's first 12 hex digits of SHA-256) or ``default``; ``reason``:
    why no table is used (empty when one is, or when there is no file); ``path``: the file asked for."""

    orders: Mapping[tuple[str, str], KindOrder] = field(default_factory=dict)
    source: str = "default"
    reason: str = ""
    path: Path | None = None

    def order_for(self, kind: str, grad: bool) -> KindOrder | None:
        """The tuned order of ``kind`` for a call with (``grad``) or without gradients; None: the fixed table."""
        return self.orders.get((kind, "fwd_bwd" if grad else "fwd"))

    def source_for(self, kind: str, grad: bool | None = None) -> str:
        """Where ``auto``'s order for ``kind`` comes from: ``tuned:<sha>``, ``default``, or
        ``default: <why the file was ignored>`` (``grad`` None: either pass)."""
        passes = PASSES if grad is None else ("fwd_bwd" if grad else "fwd",)
        if any((kind, p) in self.orders for p in passes):
            return self.source
        return f"default: {self.reason}" if self.reason else "default"


class TuningLoader:
    """Reads tuning files for ``auto``: each parsed once per (path, inode, mtime, size), checked per lookup
    (an atomic rewrite is a new inode: seen even within one tick of the clock that stamps mtime)."""

    def __init__(self) -> None:
        self._parsed: dict[Path, tuple[tuple[int, int, int], TuningFile | str, str]] = {}

    def _read(self, path: Path) -> tuple[TuningFile | str, str] | None:
        """The parsed file (or why it is unusable) and its short hash; None when there is no file."""
        try:
            stat = path.stat()
        except OSError:
            return None
        stamp = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        cached = self._parsed.get(path)
        if cached is None or cached[0] != stamp:
            try:
                parsed, sha = read_tuning_file(path)
                entry: TuningFile | str = parsed
            except TuningFileError as err:
                entry, sha = str(err), ""
            self._parsed[path] = cached = (stamp, entry, sha)
        return cached[1], cached[2]

    def tuning(self, path: str | Path | None, device_type: str, dtype: torch.dtype | str,
               threads: int | None = None) -> Tuning:
        """The :class:`Tuning` in the file at ``path`` (None: tuning turned off) for ``device_type``, ``dtype``
        and ``threads`` (default: torch's now)."""
        if path is None:
            return Tuning()
        path = Path(path)
        read = self._read(path)
        if read is None:
            return Tuning(path=path)
        parsed, sha = read
        if isinstance(parsed, str):
            return Tuning(reason=f"tuning file {path} ignored: {parsed}", path=path)
        problem = identity_problem(parsed.identity, machine_identity())
        if problem:
            return Tuning(reason=f"tuning file {path} ignored: {problem}", path=path)
        dtype_name = str(dtype).removeprefix("torch.")
        threads = threads or torch.get_num_threads()
        table = parsed.table(device_type, dtype_name, threads)
        if table is None:
            held = ", ".join(f"{t.device}/{t.dtype}/{t.threads} threads" for t in parsed.tables) or "none"
            return Tuning(reason=f"tuning file {path} has no table for {device_type}/{dtype_name}"
                                 f"{f'/{threads} threads' if device_type == 'cpu' else ''} (it holds: {held})",
                          path=path)
        if device_type != "cpu" and table.device_name and table.device_name != device_name(device_type):
            return Tuning(reason=f"tuning file {path} ignored: measured on {table.device_name!r}, "
                                 f"this is {device_name(device_type)!r}", path=path)
        return Tuning(dict(table.orders), f"tuned:{sha}", "", path)


@cache
def default_loader() -> TuningLoader:
    """The loader ``auto`` asks (made on first use)."""
    return TuningLoader()


def active_tuning(device: torch.device | str, dtype: torch.dtype | str) -> Tuning:
    """The tuning ``auto`` uses now for ``device`` and ``dtype`` (:data:`TUNING_ENV`, the default file)."""
    return default_loader().tuning(tuning_path(), torch.device(device).type, dtype)
