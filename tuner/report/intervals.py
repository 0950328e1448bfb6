"""How sure a comparison is: the difference of two means with its 95 % interval (Welch's t for two independent
sets of runs, or paired over seeds), and whether the interval excludes 0. The pages say two things differ only
where it does."""

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
    half = stats.t.ppf((1 + level) / 2, df) * math.sqrt(var)
    return Difference(mean, mean - half, mean + half)


def _variance(values: Sequence[float]) -> float:
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / (len(values) - 1)
