"""How sure a comparison is: the difference of two means with its 95 % interval (Welch's t for two independent
sets of runs, or paired over seeds; over several searches and seeds, the t interval of a crossed random-effects
model), whether the interval excludes 0, and its two-sided p; over a table's family of comparisons, the p adjusted
by Holm's step-down correction (the family-wise error) and the Benjamini–Hochberg q (the false discovery rate). The
pages say two things differ only where the interval excludes 0, and a gain is established across a table only where
Holm's adjusted p is below 0.05."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats


@dataclass(frozen=True)
class Difference:
    """mean(a) − mean(b) and its interval, in the units of a and b."""

    mean: float
    low: float
    high: float
    p: float  # two-sided, of the same t test as the interval

    @property
    def distinguishable(self) -> bool:
        return self.low > 0 or self.high < 0

    def points(self) -> str:
        """In percentage points, as the pages write it (a and b accuracies in [0, 1])."""
        return f"{100 * self.mean:+.1f} points (95 % interval {100 * self.low:+.1f} to {100 * self.high:+.1f})"


def difference(a: Sequence[float], b: Sequence[float], paired: bool = False, level: float = 0.95) -> Difference:
    """mean(a) − mean(b) with its `level` interval: paired, the t interval of the differences a_i − b_i (the same
    seeds on both sides); else Welch's, which assumes neither equal sizes nor equal spreads."""
    if paired:
        if len(a) != len(b):
            raise ValueError(f"a paired difference needs as many values on each side, not {len(a)} and {len(b)}")
        d = [x - y for x, y in zip(a, b, strict=True)]
        mean, var, df = sum(d) / len(d), _variance(d) / len(d), len(d) - 1
    else:
        va, vb = _variance(a) / len(a), _variance(b) / len(b)
        mean, var = sum(a) / len(a) - sum(b) / len(b), va + vb
        df = var**2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1)) if var > 0 else 1
    return _t_interval(mean, var, df, level)


def searches_and_seeds(
    a: Sequence[Sequence[float]], b: Sequence[Sequence[float]] | None = None, level: float = 0.95
) -> Difference:
    """mean(a) − mean(b), each side runs of its searches (rows) on the same seeds (columns), with the t interval of
    a crossed random-effects model: a search's effect and a seed's are each a draw (without `b`, `a` holds paired
    gains, one row a search). The variance of the difference is each side's searches' spread (the variance of its
    row means over its searches) plus the seeds' (the variance over seeds of the difference of the sides' column
    means, over the seeds): each term also carries the search-by-seed interaction, so it is counted twice and the
    interval errs wide. Its degrees of freedom are Welch–Satterthwaite's over the terms; with one search a side it
    is the paired t over seeds."""
    sides = [[list(r) for r in m] for m in ([a] if b is None else [a, b])]
    seeds = len(sides[0][0])
    terms = [  # (variance, degrees of freedom)
        (_variance([sum(r) / seeds for r in m]) / len(m), len(m) - 1) for m in sides if len(m) > 1
    ]
    by_seed = [[sum(r[s] for r in m) / len(m) for s in range(seeds)] for m in sides]
    gaps = [x - (by_seed[1][s] if b is not None else 0) for s, x in enumerate(by_seed[0])]
    terms.append((_variance(gaps) / seeds, seeds - 1))
    mean = sum(gaps) / seeds  # the sides' grand means' difference: every search weighs the same within its side
    var, spread = sum(v for v, _ in terms), [(v, k) for v, k in terms if v > 0]
    df = spread[0][1] if len(spread) == 1 else var**2 / sum(v**2 / k for v, k in spread) if spread else 1
    return _t_interval(mean, var, df, level)


def _t_interval(mean: float, var: float, df: float, level: float) -> Difference:
    """The `level` t interval around `mean` of variance `var` on `df` degrees of freedom, and its two-sided p (no
    spread: p 1 where the mean is 0, else 0)."""
    half = stats.t.ppf((1 + level) / 2, df) * math.sqrt(var)
    p = 2 * stats.t.sf(abs(mean) / math.sqrt(var), df) if var > 0 else float(mean == 0)
    return Difference(mean, mean - half, mean + half, float(p))


def holm(ps: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p of each test in a family (NaN: no test, left out of the family): the i-th
    smallest of m taken (m − i + 1) times, kept monotone, at most 1. A test is rejected at level α where its
    adjusted p is below α; the chance of any false rejection in the family stays under α."""
    tested = sorted((p, i) for i, p in enumerate(ps) if not math.isnan(p))
    out, running = [math.nan] * len(ps), 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - rank) * p))
        out[i] = running
    return out


def benjamini_hochberg(ps: Sequence[float]) -> list[float]:
    """The Benjamini–Hochberg q of each test in a family (NaN left out): rejecting where q is below α keeps the
    expected share of false rejections among the rejected under α (scipy's false_discovery_control)."""
    tested = [i for i, p in enumerate(ps) if not math.isnan(p)]
    out = [math.nan] * len(ps)
    if tested:
        for i, q in zip(tested, stats.false_discovery_control([ps[i] for i in tested], method="bh"), strict=True):
            out[i] = float(q)
    return out


def _variance(values: Sequence[float]) -> float:
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / (len(values) - 1)
