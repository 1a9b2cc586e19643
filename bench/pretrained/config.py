"""A pretrained-model run's config (``kind: pretrained``): the model, the patterns placed into
it, and the settings of each task. Parsing is pure: it imports no model and reads no text."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bench.engine.config import ConfigError, plugin_modules
from bench.engine.labels import variant_label
from bench.pretrained.streaming import POSITIONS, CachePolicy

KIND = "pretrained"
TASKS = ("perplexity", "passkey", "streaming", "prefill", "decode")
_TOP = {"kind", "name", "description", "model", "device", "threads", "kernel", "plugins",
        "patterns", "timeout_s", "text", *TASKS}


def is_pretrained(raw: Any) -> bool:
    """True for a pretrained-model config (``kind: pretrained``)."""
    return isinstance(raw, dict) and raw.get("kind") == KIND


@dataclass(frozen=True)
class PatternEntry:
    """One attention placed into the model: variant, parameters, the layers it replaces
    (``None``: all) and its label in tables."""

    variant: str
    params: dict[str, Any] = field(default_factory=dict)
    layers: tuple[int, ...] | None = None
    label: str = ""

    @property
    def name(self) -> str:
        shown = self.label or variant_label(self.variant, self.params)
        return shown if self.layers is None else f"{shown} [layers {list(self.layers)}]"


@dataclass(frozen=True)
class Perplexity:
    documents: tuple[str, ...] = ("kjv-genesis", "enwiki-longest", "attn-bench-docs")
    lengths: tuple[int, ...] = (1024, 2048, 4096, 8192)


@dataclass(frozen=True)
class Passkey:
    lengths: tuple[int, ...] = (1024, 2048, 4096)
    depths: tuple[float, ...] = (0.1, 0.5, 0.9)
    keys: int = 4
    seed: int = 0


@dataclass(frozen=True)
class Streaming:
    document: str = "attn-bench-docs"  # or "text": the run's --text file
    tokens: int = 32768
    chunk: int = 512
    bin: int = 2048
    positions: tuple[str, ...] = ("cache",)
    policies: tuple[CachePolicy, ...] = ()


@dataclass(frozen=True)
class Prefill:
    lengths: tuple[int, ...] = (1024, 2048, 4096, 8192)
    repeats: int = 5


@dataclass(frozen=True)
class Decode:
    contexts: tuple[int, ...] = (1024, 4096, 16384, 32768)
    steps: int = 10


@dataclass(frozen=True)
class PretrainedConfig:
    """A validated pretrained-model run; a task left out of the file is not run."""

    name: str
    description: str = ""
    model: str = "default"
    device: str = "cpu"
    threads: int | None = None
    kernel: str = "auto"
    plugins: tuple[str, ...] = ()
    patterns: tuple[PatternEntry, ...] = ()
    timeout_s: float = 3600.0
    text: str | None = None  # a user's file, added to the perplexity documents
    perplexity: Perplexity | None = None
    passkey: Passkey | None = None
    streaming: Streaming | None = None
    prefill: Prefill | None = None
    decode: Decode | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False)


def _int_list(key: str, value: Any, minimum: int = 1) -> tuple[int, ...]:
    if (not isinstance(value, list) or not value
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= minimum for v in value)):
        raise ConfigError(f"{key}: must be a non-empty list of integers >= {minimum}; got {value!r}", key)
    return tuple(value)


def _int(key: str, value: Any, minimum: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{key}: must be an integer >= {minimum}; got {value!r}", key)
    return value


def _section(raw: dict[str, Any], key: str, allowed: set[str]) -> dict[str, Any] | None:
    section = raw.get(key)
    if section is None:
        return None
    if not isinstance(section, dict):
        raise ConfigError(f"{key}: must be a mapping of settings; got {section!r}", key)
    unknown = sorted(set(section) - allowed)
    if unknown:
        raise ConfigError(f"{key}: unknown key {unknown[0]!r}; allowed {sorted(allowed)}", key)
    return section


def _patterns(value: Any) -> tuple[PatternEntry, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"patterns: must be a non-empty list of {{variant, params, layers, "
                          f"label}} entries; got {value!r}", "patterns")
    entries = []
    for i, item in enumerate(value):
        where = f"patterns[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("variant"), str):
            raise ConfigError(f"{where}: must be a mapping with a 'variant' name; got {item!r}", where)
        unknown = sorted(set(item) - {"variant", "params", "layers", "label"})
        if unknown:
            raise ConfigError(f"{where}: unknown key {unknown[0]!r}; allowed ['label', 'layers', "
                              "'params', 'variant']", where)
        params = item.get("params") or {}
        if not isinstance(params, dict):
            raise ConfigError(f"{where}.params: must be a mapping; got {params!r}", where)
        layers = item.get("layers")
        layers = None if layers is None else _int_list(f"{where}.layers", layers, 0)
        entries.append(PatternEntry(item["variant"], dict(params), layers, str(item.get("label") or "")))
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise ConfigError(f"patterns: two entries share a label ({names}); give them labels", "patterns")
    return tuple(entries)


def _policies(value: Any) -> tuple[CachePolicy, ...]:
    key = "streaming.policies"
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{key}: must be a non-empty list of {{label, sinks, recent, "
                          f"max_tokens}} entries; got {value!r}", key)
    policies = []
    for i, item in enumerate(value):
        where = f"{key}[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("label"), str):
            raise ConfigError(f"{where}: must be a mapping with a 'label'; got {item!r}", where)
        recent = item.get("recent")
        policies.append(CachePolicy(
            item["label"], _int(f"{where}.sinks", item.get("sinks", 0), 0),
            None if recent is None else _int(f"{where}.recent", recent),
            None if item.get("max_tokens") is None else _int(f"{where}.max_tokens", item["max_tokens"])))
    return tuple(policies)


def parse_pretrained(raw: Any, *, source: str = "<config>") -> PretrainedConfig:
    """The validated config; ``ConfigError`` naming the first bad key and what is allowed."""
    if not is_pretrained(raw):
        raise ConfigError(f"{source}: not a pretrained-model config (kind: {KIND})", "kind")
    unknown = sorted(set(raw) - _TOP)
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown key in a pretrained-model config; allowed "
                          f"{sorted(_TOP)}", unknown[0])
    if not isinstance(raw.get("name"), str) or not raw["name"]:
        raise ConfigError(f"name: must be a non-empty string; got {raw.get('name')!r}", "name")
    if raw.get("device", "cpu") != "cpu":
        raise ConfigError(f"device: the pretrained-model tasks run on 'cpu' here; got "
                          f"{raw.get('device')!r}", "device")
    sections: dict[str, Any] = {}
    if (s := _section(raw, "perplexity", {"documents", "lengths"})) is not None:
        docs = s.get("documents", list(Perplexity.documents))
        if not isinstance(docs, list) or not all(isinstance(d, str) for d in docs):
            raise ConfigError(f"perplexity.documents: must be a list of names; got {docs!r}",
                              "perplexity.documents")
        lengths = _int_list("perplexity.lengths", s.get("lengths", list(Perplexity.lengths)), 4)
        sections["perplexity"] = Perplexity(tuple(docs), lengths)
    if (s := _section(raw, "passkey", {"lengths", "depths", "keys", "seed"})) is not None:
        depths = s.get("depths", list(Passkey.depths))
        if (not isinstance(depths, list) or not depths
                or not all(isinstance(d, (int, float)) and 0 <= d <= 1 for d in depths)):
            raise ConfigError(f"passkey.depths: must be a list of fractions in [0, 1]; got "
                              f"{depths!r}", "passkey.depths")
        sections["passkey"] = Passkey(
            _int_list("passkey.lengths", s.get("lengths", list(Passkey.lengths)), 64),
            tuple(float(d) for d in depths), _int("passkey.keys", s.get("keys", Passkey.keys)),
            _int("passkey.seed", s.get("seed", 0), 0))
    if (s := _section(raw, "streaming", {"document", "tokens", "chunk", "bin", "positions",
                                         "policies"})) is not None:
        positions = s.get("positions", list(Streaming.positions))
        if not isinstance(positions, list) or not positions or not set(positions) <= set(POSITIONS):
            raise ConfigError(f"streaming.positions: must be a list of {list(POSITIONS)}; got "
                              f"{positions!r}", "streaming.positions")
        sections["streaming"] = Streaming(
            str(s.get("document", Streaming.document)),
            _int("streaming.tokens", s.get("tokens", Streaming.tokens), 2),
            _int("streaming.chunk", s.get("chunk", Streaming.chunk)),
            _int("streaming.bin", s.get("bin", Streaming.bin)),
            tuple(positions), _policies(s.get("policies")))
    if (s := _section(raw, "prefill", {"lengths", "repeats"})) is not None:
        sections["prefill"] = Prefill(_int_list("prefill.lengths", s.get("lengths", list(Prefill.lengths))),
                                      _int("prefill.repeats", s.get("repeats", Prefill.repeats)))
    if (s := _section(raw, "decode", {"contexts", "steps"})) is not None:
        sections["decode"] = Decode(_int_list("decode.contexts", s.get("contexts", list(Decode.contexts))),
                                    _int("decode.steps", s.get("steps", Decode.steps)))
    if not sections:
        raise ConfigError(f"{source}: a pretrained-model config names at least one task of "
                          f"{list(TASKS)}", "kind")
    threads = raw.get("threads")
    if threads is not None:
        _int("threads", threads)
    timeout = raw.get("timeout_s", 3600)
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
        raise ConfigError(f"timeout_s: must be a number > 0; got {timeout!r}", "timeout_s")
    return PretrainedConfig(
        name=raw["name"], description=str(raw.get("description") or ""),
        model=str(raw.get("model") or "default"), threads=threads,
        kernel=str(raw.get("kernel") or "auto"), plugins=plugin_modules(raw),
        patterns=_patterns(raw.get("patterns")), timeout_s=float(timeout),
        text=None if raw.get("text") is None else str(raw["text"]), raw=dict(raw), **sections)


#: what a command line may change (``attn-bench sweep CONFIG --variant ... --task ...``)
OVERRIDES = ("variants", "tasks", "threads", "plugins", "text", "model", "seq_len")
