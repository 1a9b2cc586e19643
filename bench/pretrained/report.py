"""The report of a pretrained-model run (``report.md``) and its quality-against-prefill-time figure."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from bench.engine.markdown import markdown_table
from bench.engine.results import read_env, read_rows
from bench.engine.row_schema import PRETRAINED_COLUMNS
from bench.pretrained.plan import RESULTS_FILE
from bench.pretrained.scoring import wilson_interval

FULL = "full"
FLOOR = "unigram (floor)"
#: StreamingLLM's figures (Xiao et al. 2023, Table 1: Llama-2-13B, PG19, 65K tokens, cache 1,024)
PAPER = {"window alone": 5158.0, "window + 4 sinks": 5.40, "recomputed window": 5.43}


def is_pretrained_run(run_dir: str | Path) -> bool:
    return (Path(run_dir) / RESULTS_FILE).exists()


def load_pretrained(run_dir: str | Path) -> pd.DataFrame:
    df = pd.DataFrame(read_rows(run_dir, RESULTS_FILE, PRETRAINED_COLUMNS), columns=PRETRAINED_COLUMNS)
    for column in ("seq_len", "depth", "value", "ci_low", "ci_high", "count", "time_ms",
                   "time_iqr_ms", "peak_mem_bytes", "kv_cache_bytes"):
        df[column] = pd.to_numeric(df[column], errors="coerce")
    return df


def _ok(df: pd.DataFrame, task: str, metric: str) -> pd.DataFrame:
    return df[(df.task == task) & (df.metric == metric) & (df.status == "ok")]


def perplexity_table(df: pd.DataFrame) -> pd.DataFrame:
    """Pattern x N: perplexity over every document (geometric mean), then its ratio to full attention's; the floor
    last."""
    rows = _ok(df, "perplexity", "perplexity").copy()
    if rows.empty:
        return pd.DataFrame()
    rows["log"] = np.log(rows.value)
    pooled = rows.groupby(["label", "seq_len"], sort=False).log.mean().apply(math.exp).unstack()
    order = [*(x for x in pooled.index if x != FLOOR), *([FLOOR] if FLOOR in pooled.index else [])]
    pooled = pooled.loc[order]
    table = pd.DataFrame({"pattern": pooled.index})
    for n in pooled.columns:
        table[f"{int(n)}"] = pooled[n].values
    if FULL in pooled.index:
        for n in pooled.columns:
            table[f"{int(n)} / full"] = (pooled[n] / pooled.loc[FULL, n]).values
    return table


def per_document_table(df: pd.DataFrame) -> pd.DataFrame:
    rows = _ok(df, "perplexity", "perplexity")
    if rows.empty:
        return pd.DataFrame()
    wide = rows.pivot_table(index=["document", "label"], columns="seq_len", values="value", sort=False)
    wide.columns = [str(int(c)) for c in wide.columns]
    return wide.reset_index()


def passkey_table(df: pd.DataFrame) -> pd.DataFrame:
    """Pattern x N: accuracy over every depth's keys with its Wilson 95% interval."""
    rows = _ok(df, "passkey", "passkey_accuracy")
    if rows.empty:
        return pd.DataFrame()
    out = []
    for (label, n), cell in rows.groupby(["label", "seq_len"], sort=False):
        right = round((cell.value * cell["count"]).sum())
        trials = int(cell["count"].sum())
        low, high = wilson_interval(right, trials)
        by_depth = ", ".join(f"{d:.0%}: {round(v * c)}/{int(c)}"
                             for d, v, c in zip(cell.depth, cell.value, cell["count"]))
        out.append({"pattern": label, "N": int(n), "accuracy": right / trials,
                    "95% interval": f"[{low:.2f}, {high:.2f}]", "keys": trials, "by depth": by_depth})
    return pd.DataFrame(out)


def streaming_table(df: pd.DataFrame) -> pd.DataFrame:
    rows = _ok(df, "streaming", "perplexity")
    if rows.empty:
        return pd.DataFrame()
    wide = rows.pivot_table(index="label", columns="seq_len", values="value", sort=False)
    wide.columns = [f"..{int(c)}" for c in wide.columns]
    speed = _ok(df, "streaming", "tokens_per_s").set_index("label").value
    table = wide.reset_index().rename(columns={"label": "cache policy"})
    table["tokens/s"] = table["cache policy"].map(speed)
    return table


def _prefill_table(df: pd.DataFrame) -> pd.DataFrame:
    """Pattern x N: prefill time, its ratio to full attention's taken round by round (median [q25, q75]), the peak
    tensor memory, and the numeric median ratio (``median``, NaN without full attention)."""
    rows = _ok(df, "prefill", "prefill_ms")
    out = []
    for n, unit in rows.groupby("seq_len"):
        times = {r.label: np.array(json.loads(r.times_ms)) for r in unit.itertuples()}
        full = times.get(FULL)
        for r in unit.itertuples():
            ratio, median = "-", math.nan
            if full is not None and len(full) == len(times[r.label]):
                q = np.quantile(times[r.label] / full, [0.25, 0.5, 0.75])
                ratio, median = f"{q[1]:.2f} [{q[0]:.2f}, {q[2]:.2f}]", q[1]
            out.append({"pattern": r.label, "N": int(n), "prefill ms": r.value,
                        "IQR ms": r.time_iqr_ms, "repeats": len(times[r.label]),
                        "time / full (per round)": ratio,
                        "peak MiB": r.peak_mem_bytes / 2**20 if r.peak_mem_bytes == r.peak_mem_bytes else None,
                        "median": median})
    return pd.DataFrame(out)


def tradeoff_table(df: pd.DataFrame) -> pd.DataFrame:
    """Pattern x N, the question in one cell: perplexity and prefill time as multiples of full attention's, and the
    passkey keys retrieved; ``-`` where a task did not run at that N."""
    return _tradeoff(perplexity_table(df), passkey_table(df), _prefill_table(df))


def _tradeoff(ppl: pd.DataFrame, keys: pd.DataFrame, times: pd.DataFrame) -> pd.DataFrame:
    if ppl.empty:
        return pd.DataFrame()
    lengths = sorted({int(c) for c in ppl.columns if c.isdigit()})
    out = []
    for label in ppl.pattern:
        if label == FLOOR:
            continue
        row = {"pattern": label}
        for n in lengths:
            ratio = ppl.loc[ppl.pattern == label, f"{n} / full"] if f"{n} / full" in ppl else pd.Series()
            key = keys[(keys.pattern == label) & (keys.N == n)] if not keys.empty else keys
            time = times[(times.pattern == label) & (times.N == n)] if not times.empty else times
            parts = [f"ppl {float(ratio.iloc[0]):.2f}x" if len(ratio) and ratio.notna().all() else "ppl -",
                     f"keys {round(key.accuracy.iloc[0] * key['keys'].iloc[0])}/{int(key['keys'].iloc[0])}"
                     if len(key) else "keys -",
                     _time_cell(time["median"].iloc[0]) if len(time) else "time -"]
            row[f"N={n}"] = ", ".join(parts)
        out.append(row)
    return pd.DataFrame(out)


def _time_cell(median: float) -> str:
    return f"time {'-' if math.isnan(median) else f'{median:.2f}'}x"


def decode_table(df: pd.DataFrame) -> pd.DataFrame:
    rows = df[(df.task == "decode") & (df.metric == "decode_ms")]
    if rows.empty:
        return pd.DataFrame()
    out = rows.assign(cell=[f"{v:.1f} ms, {b / 2**20:.1f} MiB" if s == "ok" else s
                            for v, b, s in zip(rows.value, rows.kv_cache_bytes, rows.status)])
    wide = out.pivot_table(index="label", columns="seq_len", values="cell", aggfunc="first", sort=False)
    wide.columns = [f"context {int(c)}" for c in wide.columns]
    return wide.reset_index().rename(columns={"label": "pattern"})


def streaming_comparison(df: pd.DataFrame) -> str:
    """The last bin's perplexity under each policy, beside StreamingLLM's, in one paragraph."""
    rows = _ok(df, "streaming", "perplexity")
    if rows.empty:
        return ""
    last = rows.sort_values("seq_len").groupby("label").tail(1).set_index("label")
    said = "; ".join(f"{label}: {r.value:.1f} at tokens ..{int(r.seq_len)}" for label, r in last.iterrows())
    paper = "; ".join(f"{k}: {v:g}" for k, v in PAPER.items())
    return (f"Here (the last bin of each stream): {said}. StreamingLLM (Llama-2-13B, 65K "
            f"tokens of PG19, cache 1,024): {paper}. The claim to check: a window alone "
            "collapses once the first tokens leave it, and 4 sink tokens restore it to within "
            "a few percent of a recomputed window.")


def build_pretrained_report(run_dir: str | Path) -> str:
    """The report as markdown, also written to ``report.md``."""
    run_dir = Path(run_dir)
    df = load_pretrained(run_dir)
    if df.empty:
        raise ValueError(f"RUN_DIR {run_dir}: {RESULTS_FILE} has no rows yet; run or resume it")
    env = read_env(run_dir)
    machines = sorted({str(e.get("device_name", "?")) for e in env})
    counts = df.drop_duplicates("cell_id").groupby("status").size().to_dict()
    failed = df[df.status != "ok"].drop_duplicates(["cell_id", "reason"])
    ppl, keys, prefill = perplexity_table(df), passkey_table(df), _prefill_table(df)
    parts = [f"# Pretrained-model report: {run_dir.name}", "",
             f"Model: {', '.join(sorted(set(df.model)))}. Measured on: {'; '.join(machines)}. "
             f"Units by status: {', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}. "
             "Every pattern replaces the model's attention untrained (docs/pretrained.md).", ""]
    sections = [
        ("The trade-off at a glance", _tradeoff(ppl, keys, prefill),
         "Per pattern and N: perplexity of tokens N/2..N-1 as a multiple of full attention's "
         "(geometric mean over the documents), passkey keys retrieved (every depth), prefill "
         "time as a multiple of full attention's (median of the per-round ratios). The tables "
         "below give each with its spread."),
        ("Perplexity of tokens N/2..N-1 against N", ppl,
         "Over every document (geometric mean), then the ratio to full attention. The floor: a "
         "unigram model of the first N/2 tokens (add-0.5), which knows the text's words and "
         "nothing of their order."),
        ("Perplexity per document", per_document_table(df), ""),
        ("Passkey retrieval", keys,
         "Greedy answer equal to the 5-digit key; Wilson 95% interval over every depth's keys."),
        ("Streaming past the trained context", streaming_table(df),
         "Perplexity per bin of the stream (`..T`: the bin ending at token T)."),
        ("Prefill: time and memory", prefill.drop(columns="median", errors="ignore"),
         "Patterns timed in interleaved rounds in one process; the ratio is taken per round."),
        ("Decoding: time per token and KV cache", decode_table(df),
         "One token against the cache the pattern needs at that context."),
    ]
    for title, table, note in sections:
        if table.empty:
            continue
        parts += [f"## {title}", "", *([note, ""] if note else []), markdown_table(table), ""]
    comparison = streaming_comparison(df)
    if comparison:
        parts += ["## StreamingLLM, compared", "", comparison, ""]
    if not failed.empty:
        parts += ["## Units that did not finish", "",
                  markdown_table(failed[["cell_id", "status", "reason"]]), ""]
    text = "\n".join(parts)
    (run_dir / "report.md").write_text(text)
    return text


def plot_pretrained_run(run_dir: str | Path) -> list[Path]:
    """``quality_vs_time.png``: per N, perplexity and passkey accuracy against prefill time (none without rows)."""
    import matplotlib  # plotting stack: heavy, imported only to draw

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # plotting stack

    run_dir = Path(run_dir)
    df = load_pretrained(run_dir)
    cost = _ok(df, "prefill", "prefill_ms")
    ppl = perplexity_table(df)
    keys = passkey_table(df)
    if cost.empty or ppl.empty:
        return []
    lengths = sorted(int(n) for n in cost.seq_len.unique())
    fig, axes = plt.subplots(2, len(lengths), figsize=(4 * len(lengths), 7), squeeze=False)
    for col, n in enumerate(lengths):
        at = cost[cost.seq_len == n].set_index("label")
        for row, (table, column, name) in enumerate(((ppl, str(n), "perplexity"),
                                                     (keys, "accuracy", "passkey accuracy"))):
            ax = axes[row][col]
            if table.empty or (row == 0 and column not in table.columns):
                ax.set_visible(False)
                continue
            values = (table.set_index("pattern")[column] if row == 0 else
                      table[table.N == n].set_index("pattern")[column])
            for label, value in values.items():
                if label in at.index:
                    size = 20 + 200 * (at.loc[label, "peak_mem_bytes"] or 0) / max(at.peak_mem_bytes.max(), 1)
                    ax.scatter(at.loc[label, "value"] / 1e3, value, s=size, alpha=0.7)
                    ax.annotate(label, (at.loc[label, "value"] / 1e3, value), fontsize=7)
            ax.set_xlabel("prefill time (s)")
            ax.set_ylabel(name)
            if row == 0:
                ax.set_yscale("log")
            ax.set_title(f"N = {n}")
    fig.suptitle("Quality against prefill time (marker size: peak memory)")
    fig.tight_layout()
    path = run_dir / "quality_vs_time.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
