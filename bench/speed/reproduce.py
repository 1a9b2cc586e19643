"""Whether a committed run's ratios hold on this machine (``attn-bench reproduce``; docs/measurement.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.speed.report import per_round_times, round_ratio

KEY = ["label", "pass", "seq_len", "kernel", "vs", "key_heads"]
#: what names a row of a run besides its pass (as in ``attn-bench compare``)
ROW = ["label", "kernel_requested", "seq_len", "batch", "heads", "kv_heads", "head_dim", "dtype", "device",
       "causal"]
DEFAULT_TOLERANCE = 0.10  # a machine's drift between two quiet runs


def saved_config(run_dir: Path) -> dict[str, Any]:
    """The run's resolved config (``sweep.json``) as a config mapping a sweep reads again."""
    saved = json.loads((run_dir / "sweep.json").read_text())
    variants = [{"name": spec["name"], **dict(spec.get("params") or []),
                 **{k: spec[k] for k in ("causal", "seq_len", "kernels") if spec.get(k) is not None}}
                for spec in saved.pop("variants")]
    raw = {k: v for k, v in saved.items() if v is not None and v != [] and k != "description"}
    return {**raw, "variants": variants}


def sampled_lengths(committed: pd.DataFrame, sample: int | None) -> tuple[int, ...]:
    """The lengths of the committed run's figures, or ``sample`` of them spread evenly (longest kept)."""
    lengths = sorted({fig["seq_len"] for fig in _figures(committed, _row_columns(committed))})
    if sample is None or sample >= len(lengths):
        return tuple(int(n) for n in lengths)
    picks = np.linspace(len(lengths) - 1, 0, sample).round().astype(int)  # the longest first
    return tuple(sorted(int(lengths[i]) for i in picks))


def _groups(df: pd.DataFrame) -> pd.DataFrame:
    """The ok rows with ``rounds_of``: their unit where timed together, else their length and shape."""
    ok = df[df.status == "ok"]
    together = ok.interleaved.fillna(1) > 1
    columns = [c for c in ("seq_len", "batch", "heads", "head_dim", "dtype", "causal") if c in ok]
    shape = ok[columns].astype(str).agg("/".join, axis=1)
    return ok.assign(rounds_of=ok.interleave_id.where(together, "same run " + shape))


def _row_columns(*frames: pd.DataFrame) -> list[str]:
    return [c for c in ROW if all(c in df for df in frames)]


def _key(row: pd.Series, columns: list[str], pass_name: str) -> tuple[str, ...]:
    """A row's name in a run (as text: an unrecorded ``kv_heads`` reads the same in both runs)."""
    return (*(str(row[c]) for c in columns), pass_name)


def _key_heads(row: pd.Series) -> str:
    """`` H_kv=K`` for a grouped-query row, else empty."""
    kv, heads = row.get("kv_heads"), row.get("heads")
    return f" H_kv={int(kv)}" if pd.notna(kv) and pd.notna(heads) and kv != heads else ""


def _figures(df: pd.DataFrame, columns: list[str]) -> list[dict[str, Any]]:
    """Each row against full attention of its rounds (else the fastest row): keys, table cells, per-round times."""
    out = []
    for (_unit, pass_name), group in _groups(df).groupby(["rounds_of", "pass"], sort=False):
        full = group[group.label == "full"]
        base = full.iloc[0] if len(full) else group.loc[group.time_ms.idxmin()]
        base_key = _key(base, columns, pass_name)
        for _, row in group.iterrows():
            key = _key(row, columns, pass_name)
            if key != base_key:
                out.append({"label": row.label, "kernel": row.kernel_requested, "pass": pass_name,
                            "seq_len": int(row.seq_len), "vs": f"{base.label} [{base.kernel_requested}]"
                            + _key_heads(base), "key_heads": _key_heads(row),
                            "key": key, "base_key": base_key,
                            "times": per_round_times(row.times_ms), "base": per_round_times(base.times_ms)})
    return out


def _times_of(df: pd.DataFrame, columns: list[str]) -> dict[tuple[str, ...], np.ndarray]:
    """Per-round times of every ok row not flagged noisy (a ratio under contention says nothing), by :func:`_key`."""
    ok = df[(df.status == "ok") & ~df.get("noisy", pd.Series(False, index=df.index)).fillna(False).astype(bool)]
    return {_key(row, columns, row["pass"]): per_round_times(row.times_ms) for _, row in ok.iterrows()}


def compare_ratios(committed: pd.DataFrame, here: pd.DataFrame,
                   tolerance: float = DEFAULT_TOLERANCE) -> pd.DataFrame:
    """Each committed ratio at the lengths measured here beside the one measured here, ``holds`` and ``headline``."""
    columns = _row_columns(committed, here)
    measured = _times_of(here, columns)
    lengths = {int(n) for n in here.seq_len[here.status == "ok"]}
    rows = []
    for fig in _figures(committed, columns):
        c50, c25, c75, _ = round_ratio(fig.pop("times"), fig.pop("base"))
        ours, base = measured.get(fig.pop("key")), measured.get(fig.pop("base_key"))
        h50, h25, h75, _ = round_ratio(ours, base) if ours is not None and base is not None else (np.nan,) * 4
        rows.append({**fig, "time_ratio": c50, "ratio_q25": c25, "ratio_q75": c75,
                     "time_ratio_here": h50, "ratio_q25_here": h25, "ratio_q75_here": h75})
    table = pd.DataFrame(rows, columns=[*KEY, "time_ratio", "ratio_q25", "ratio_q75", "time_ratio_here",
                                        "ratio_q25_here", "ratio_q75_here"])
    longest = table.groupby(["label", "pass", "kernel", "key_heads"]).seq_len.transform("max")
    table["headline"] = table.seq_len == longest
    table = table[table.seq_len.isin(lengths)].reset_index(drop=True)
    overlap = (table.ratio_q25 <= table.ratio_q75_here) & (table.ratio_q25_here <= table.ratio_q75)
    close = (table.time_ratio_here / table.time_ratio - 1).abs() <= tolerance
    table["holds"] = (overlap | close).where(table.time_ratio_here.notna())
    return table


def reproduction_lines(table: pd.DataFrame, committed_on: str, here: str) -> list[str]:
    """The markdown of a reproduction: a line per figure, the failed headline figures first."""
    def ratio(row: Any, suffix: str = "") -> str:
        value = getattr(row, f"time_ratio{suffix}")
        if pd.isna(value):
            return "not measured, or noisy here"
        return f"{value:.3g} [{getattr(row, f'ratio_q25{suffix}'):.3g}, {getattr(row, f'ratio_q75{suffix}'):.3g}]"

    lines = [f"Committed on: {committed_on or 'not recorded (the run predates the CPU fields of env.json)'}", "",
             f"Measured here on: {here}", "",
             "| figure | N | pass | committed | here | holds |", "|---|---|---|---|---|---|"]
    order = table.assign(rank=~(table.headline & (table.holds == False))).rename(columns={"pass": "pass_name"})  # noqa: E712
    for row in order.sort_values(["rank", "label", "pass_name", "seq_len"]).itertuples():
        name = f"{row.label} [{row.kernel}]{row.key_heads} / {row.vs}" + (" (headline)" if row.headline else "")
        holds = "-" if pd.isna(row.holds) else ("yes" if row.holds else "**no**")
        lines.append(f"| {name} | {row.seq_len} | {row.pass_name} | {ratio(row)} | {ratio(row, '_here')} | {holds} |")
    return lines


def failed_headlines(table: pd.DataFrame) -> pd.DataFrame:
    """The headline figures that were measured here and do not hold."""
    return table[table.headline & (table.holds == False)]  # noqa: E712
