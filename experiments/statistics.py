"""Effects with confidence intervals: a scheme against the baseline, or a step of an ablation
against the step before it, paired by repetition. Repetition r of every scheme runs with the same
seed (the same data order, and under per-flow ECMP the same placement of the same flows), so the
pair's ratio cancels what the seed decides and the interval reflects what the scheme changes.

Where two schemes did not send the same flows the same way (per-flow ECMP placed their 5-tuples
differently, runs.csv's `placement`), a repetition's pair shares only the data order, and the
placement each drew is part of what is compared: those are compared as two independent samples
(`unpaired_ratio`, Welch's t on the log scale), which may hold different numbers of runs, so a
placement-dependent baseline can run more repetitions than the schemes it is compared with.

Speedups are ratios of iteration times and are compared on a log scale: per pair
d = log(t_before / t_after); the estimate is exp(mean d), the geometric mean speedup, and the
interval exp(mean d +- t s_d / sqrt(n)) with Student's t at n - 1 degrees of freedom. Accuracy
deltas are differences: mean +- t s / sqrt(n). Student's t rather than a bootstrap because an
experiment has 2-5 repetitions: a percentile bootstrap of so few pairs cannot reach past the
values it saw and covers far less than its level, where the t interval is exact for normal
noise of the log times (the tests check its coverage). One pair gives no interval: not judged.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import stats

DEFAULT_LEVEL = 0.95


def check_level(level: object, field: str = "confidence") -> float:
    """A confidence level strictly between 0 and 1; ValueError naming the field otherwise."""
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise ValueError(f"{field}: {level!r} is not allowed (a level between 0 and 1, e.g. 0.95)")
    return float(level)


@dataclass(frozen=True)
class Effect:
    """An estimated effect and its interval at `level`; `null` is the value of no effect (1 for a
    ratio, 0 for a difference). low and high are NaN when there is no interval (fewer than two
    pairs, or no pair at all). `design`: "paired" (pairs: the pairs) or "unpaired" (pairs: the
    smaller sample's runs; runs: each sample's)."""
    estimate: float
    low: float
    high: float
    pairs: int
    level: float
    null: float
    design: str = "paired"
    runs: tuple[int, int] = (0, 0)

    @property
    def judged(self) -> bool:
        return not (math.isnan(self.low) or math.isnan(self.high))

    @property
    def significant(self) -> bool:
        """The interval excludes no effect."""
        return self.judged and not self.low <= self.null <= self.high

    @property
    def half_width(self) -> float:
        """Half the interval's width relative to the estimate (for a ratio: its share)."""
        return (self.high - self.low) / 2 / abs(self.estimate) if self.judged and self.estimate else math.nan

    def verdict(self) -> str:
        if not self.judged:
            if self.design == "unpaired":
                return "not judged (one run of a side)" if self.pairs == 1 else "no runs"
            return "not judged (one repetition)" if self.pairs == 1 else "no pairs"
        return "significant" if self.significant else "not significant"


def _pairs(before: Sequence[float], after: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """The pairs where both values are known (a failed run leaves a NaN)."""
    a, b = np.asarray(before, dtype=float), np.asarray(after, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"paired samples of different lengths ({a.size} and {b.size})")
    known = np.isfinite(a) & np.isfinite(b)
    return a[known], b[known]


def _mean_interval(values: np.ndarray, level: float) -> tuple[float, float, float]:
    """Mean of `values` and its Student-t interval at `level` (NaN bounds for fewer than 2)."""
    mean = float(values.mean()) if values.size else math.nan
    if values.size < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf(0.5 + level / 2, values.size - 1) * values.std(ddof=1) / math.sqrt(values.size))
    return mean, mean - half, mean + half


def paired_ratio(before: Sequence[float], after: Sequence[float], level: float = DEFAULT_LEVEL) -> Effect:
    """The speedup before / after (e.g. iteration times of the baseline and of a scheme, by
    repetition): geometric mean and its paired t interval on the log scale."""
    level = check_level(level)
    a, b = _pairs(before, after)
    positive = (a > 0) & (b > 0)
    mean, low, high = _mean_interval(np.log(a[positive] / b[positive]), level)
    return Effect(_exp(mean), _exp(low), _exp(high), int(positive.sum()), level, 1.0,
                  runs=(int(positive.sum()), int(positive.sum())))


def _exp(value: float) -> float:
    return math.exp(value) if not math.isnan(value) else math.nan


def unpaired_ratio(before: Sequence[float], after: Sequence[float], level: float = DEFAULT_LEVEL) -> Effect:
    """The speedup before / after from two independent samples (e.g. the baseline's runs and a
    scheme's, where the two did not send the same flows the same way, so a repetition's pair shares
    nothing placement decided): the ratio of their geometric means and Welch's t interval on the
    log scale (each sample its own variance, Welch-Satterthwaite degrees of freedom). Either
    sample may hold more runs than the other: more runs of a placement-dependent scheme narrow
    what its placements spread."""
    level = check_level(level)
    a, b = (np.asarray(values, dtype=float) for values in (before, after))
    a, b = np.log(a[np.isfinite(a) & (a > 0)]), np.log(b[np.isfinite(b) & (b > 0)])
    runs = (int(a.size), int(b.size))
    if not a.size or not b.size:
        return Effect(math.nan, math.nan, math.nan, min(runs), level, 1.0, "unpaired", runs)
    mean = float(a.mean() - b.mean())
    if a.size < 2 or b.size < 2:
        return Effect(_exp(mean), math.nan, math.nan, min(runs), level, 1.0, "unpaired", runs)
    va, vb = float(a.var(ddof=1)) / a.size, float(b.var(ddof=1)) / b.size
    se = math.sqrt(va + vb)
    if se == 0:
        return Effect(_exp(mean), _exp(mean), _exp(mean), min(runs), level, 1.0, "unpaired", runs)
    df = (va + vb) ** 2 / (va ** 2 / (a.size - 1) + vb ** 2 / (b.size - 1))
    half = float(stats.t.ppf(0.5 + level / 2, df)) * se
    return Effect(_exp(mean), _exp(mean - half), _exp(mean + half), min(runs), level, 1.0, "unpaired", runs)


def paired_difference(before: Sequence[float], after: Sequence[float],
                      level: float = DEFAULT_LEVEL) -> Effect:
    """after - before (e.g. final accuracies of the baseline and of a scheme, by repetition):
    mean difference and its paired t interval."""
    level = check_level(level)
    a, b = _pairs(before, after)
    mean, low, high = _mean_interval(b - a, level)
    return Effect(mean, low, high, int(a.size), level, 0.0, runs=(int(a.size), int(a.size)))
