"""From measured kernel times to ``auto``'s tuned orders: a pure function of the times (docs/kernels.md,
"Tuning `auto` for this machine").

Per (kind, pass) and length, a kernel's *score* is the geometric mean over the kind's variants of its
time over the fastest kernel's (1: fastest for every variant). The long order's first kernel is the
winner at the longest length; the *crossover* is the shortest length from which it wins, or comes
within :data:`TIE` of the winner, at every longer one. The other kernels are ranked by their
geometric-mean score over the lengths an order covers (within :data:`TIE`: in the fixed order); a kernel
not measured at some of them ranks after those measured at all, and a kernel of the fixed order never
measured (``flex`` on the CPU, a kernel refusing the pass) keeps its place there.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from attn.kernels.tuning import KernelTime, KindOrder

#: kernels within this share of the best remaining one count as tied: the fixed order decides between them
#: (a 2% win at one length is noise on a shared machine, not a reason to move the fixed order)
TIE = 0.03
#: a short-call limit is rounded to a multiple of this many keys (to whole keys between lengths closer than 4 steps)
LIMIT_STEP = 64


def scores(times: Iterable[KernelTime]) -> dict[int, dict[str, float]]:
    """Per length, each kernel's geometric-mean time over the fastest kernel's, over the variants it ran."""
    by_case: dict[tuple[int, str], dict[str, float]] = defaultdict(dict)
    for t in times:
        if t.time_ms > 0 and math.isfinite(t.time_ms):
            by_case[t.seq_len, t.variant][t.kernel] = t.time_ms
    logs: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (n, _), kernels in by_case.items():
        best = min(kernels.values())
        for kernel, ms in kernels.items():
            logs[n][kernel].append(math.log(ms / best))
    return {n: {k: math.exp(sum(v) / len(v)) for k, v in per.items()} for n, per in logs.items()}


def rank(per_length: Mapping[int, Mapping[str, float]], lengths: Sequence[int],
         default: Sequence[str]) -> list[str]:
    """Every kernel of ``per_length`` by its geometric-mean score over ``lengths``; one missing at some of them
    (left out there) ranks after those measured at all; kernels within :data:`TIE` of the best one left are
    taken in ``default``'s order."""
    kernels = {k for scores_at in per_length.values() for k in scores_at}

    def measured(kernel: str) -> tuple[int, float]:
        values = [per_length[n][kernel] for n in lengths if kernel in per_length.get(n, {})]
        mean = math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.inf
        return len(lengths) - len(values), mean

    def slot(kernel: str) -> int:
        return default.index(kernel) if kernel in default else len(default)

    left, out = {k: measured(k) for k in kernels}, []
    while left:
        best = min(left.values())
        tied = [k for k, (missing, mean) in left.items() if missing == best[0] and mean <= best[1] * (1 + TIE)]
        out.append(min(tied, key=lambda k: (slot(k), left[k][1], k)))
        del left[out[-1]]
    return out


def place(ranked: Sequence[str], default: Sequence[str]) -> tuple[str, ...]:
    """``default``'s slots filled in ``ranked`` order, a kernel of it never measured kept in its slot; then the
    measured kernels it lacks."""
    queue = iter(ranked)
    out = [kernel if kernel not in ranked else next(queue) for kernel in default]
    return tuple(dict.fromkeys([*out, *queue]))


def _holds(per_length: Mapping[int, Mapping[str, float]], n: int, kernel: str) -> bool:
    """Whether ``kernel`` is the fastest at ``n`` keys, or within :data:`TIE` of it."""
    at = per_length[n]
    return kernel in at and at[kernel] <= min(at.values()) * (1 + TIE)


def crossover_keys(low: int, high: int, ratio_low: float, ratio_high: float) -> int:
    """Where the long winner's time ratio to its best rival (``ratio_low`` > 1 at ``low`` keys, <= 1 at
    ``high``) crosses 1, interpolated in log-log and rounded (:data:`LIMIT_STEP`), within ``(low, high]``."""
    if not (ratio_low > 1 >= ratio_high > 0):
        return high
    share = math.log(ratio_low) / (math.log(ratio_low) - math.log(ratio_high))
    keys = math.exp(math.log(low) + share * (math.log(high) - math.log(low)))
    step = LIMIT_STEP if high - low >= 4 * LIMIT_STEP else 1
    rounded = round(keys / step) * step
    return min(max(rounded, low + 1), high)


def _rival_ratio(times: Sequence[KernelTime], n: int, winner: str) -> float:
    """Geometric mean over variants of ``winner``'s time over the fastest other kernel's at ``n`` keys."""
    by_variant: dict[str, dict[str, float]] = defaultdict(dict)
    for t in times:
        if t.seq_len == n and t.time_ms > 0:
            by_variant[t.variant][t.kernel] = t.time_ms
    logs = [math.log(k[winner] / min(v for name, v in k.items() if name != winner))
            for k in by_variant.values() if winner in k and len(k) > 1]
    return math.exp(sum(logs) / len(logs)) if logs else math.nan


def derive_order(times: Sequence[KernelTime], long_default: Sequence[str],
                 short_default: Sequence[str] | None = None) -> KindOrder:
    """The :class:`KindOrder` of one (kind, pass) from its ``times``; ``long_default`` / ``short_default``:
    the fixed table's orders (their slots and ties)."""
    short_default = short_default or long_default
    per_length = scores(times)
    lengths = sorted(per_length)
    if not lengths:
        raise ValueError("times: no positive, finite time to derive an order from")
    winner = rank({lengths[-1]: per_length[lengths[-1]]}, lengths[-1:], long_default)[0]
    first = len(lengths) - 1
    while first > 0 and _holds(per_length, lengths[first - 1], winner):
        first -= 1
    rest = [k for k in rank(per_length, lengths[first:], long_default) if k != winner]
    long = place([winner, *rest], long_default)
    short = place(rank(per_length, lengths[:first], short_default), short_default)
    if first == 0 or short == long:
        return KindOrder(long, (), None, lengths[first])
    low, high = lengths[first - 1], lengths[first]
    limit = crossover_keys(low, high, _rival_ratio(times, low, winner), _rival_ratio(times, high, winner))
    return KindOrder(long, short, limit, high)


def derive_orders(times: Iterable[KernelTime], defaults: Mapping[str, tuple[Sequence[str], Sequence[str] | None]]
                  ) -> dict[tuple[str, str], KindOrder]:
    """:func:`derive_order` of every (kind, pass) in ``times``; ``defaults``: kind -> the fixed (long, short or
    None) orders."""
    groups: dict[tuple[str, str], list[KernelTime]] = defaultdict(list)
    for t in times:
        groups[t.kind, t.pass_name].append(t)
    orders = {}
    for (kind, pass_name), group in sorted(groups.items()):
        long_default, short_default = defaults[kind]
        orders[kind, pass_name] = derive_order(group, long_default, short_default)
    return orders
