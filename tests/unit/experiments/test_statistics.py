"""Paired and unpaired intervals: their coverage on synthetic runs, and their verdicts."""
import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from experiments.statistics import check_level, paired_difference, paired_ratio, unpaired_ratio

DRAWS = 2000


def coverage(true_speedup: float, pairs: int, level: float, rng: np.random.Generator,
             placement_sd: float = 0.4, noise_sd: float = 0.08) -> float:
    """How often the interval holds the true speedup over DRAWS synthetic experiments: each
    repetition draws a placement that scales both runs of the pair alike (as a seed does), and
    each run its own log-normal noise."""
    hits = 0
    for _ in range(DRAWS):
        placement = np.exp(rng.normal(0, placement_sd, pairs))
        baseline = 2.0 * placement * np.exp(rng.normal(0, noise_sd, pairs))
        scheme = 2.0 / true_speedup * placement * np.exp(rng.normal(0, noise_sd, pairs))
        effect = paired_ratio(baseline, scheme, level)
        hits += effect.low <= true_speedup <= effect.high
    return hits / DRAWS


@pytest.mark.parametrize("pairs", [3, 5])
@pytest.mark.parametrize("level", [0.9, 0.95])
def test_the_ratio_interval_covers_at_its_level(pairs, level):
    rng = np.random.default_rng(pairs * 100 + int(level * 100))
    # Binomial sd of the estimate over 2000 draws is ~0.5 points at 95%: 3 points is far outside.
    assert coverage(1.8, pairs, level, rng) == pytest.approx(level, abs=0.03)


def test_the_difference_interval_covers_at_its_level():
    rng = np.random.default_rng(7)
    hits = 0
    for _ in range(DRAWS):
        base = rng.normal(0.9, 0.02, 4)
        other = base + 0.01 + rng.normal(0, 0.01, 4)
        effect = paired_difference(base, other)
        hits += effect.low <= 0.01 <= effect.high
    assert hits / DRAWS == pytest.approx(0.95, abs=0.03)


def test_the_pairing_removes_what_the_seed_decides():
    """A scheme identical to the baseline over wildly different placements: the paired interval
    is tight around 1 and not significant; a real 10% effect is significant."""
    placement = np.array([0.56, 1.86, 0.9, 1.2, 0.7])
    baseline = placement * np.array([1.0, 1.02, 0.99, 1.01, 1.0])
    same = placement * np.array([1.01, 1.0, 1.0, 0.99, 1.02])
    control = paired_ratio(baseline, same)
    assert not control.significant and control.low < 1 < control.high and control.high - control.low < 0.05
    assert control.verdict() == "not significant"
    faster = paired_ratio(baseline, same / 1.1)
    assert faster.significant and faster.estimate == pytest.approx(1.1, rel=0.01)


def test_failed_runs_leave_their_pair_out():
    effect = paired_ratio([2.0, math.nan, 2.2, 2.1], [1.0, 1.1, math.nan, 1.05])
    assert effect.pairs == 2 and effect.estimate == pytest.approx(2.0)
    one = paired_ratio([2.0, math.nan], [1.0, 1.0])
    assert one.pairs == 1 and not one.judged and not one.significant
    assert one.verdict() == "not judged (one repetition)"
    assert paired_ratio([], []).verdict() == "no pairs"


@given(st.floats(0.01, 100), st.lists(st.floats(0.5, 2), min_size=2, max_size=6))
def test_the_estimate_is_the_geometric_mean_ratio(speedup, placements):
    baseline = np.array(placements)
    effect = paired_ratio(baseline, baseline / speedup)
    assert effect.estimate == pytest.approx(speedup, rel=1e-9)
    assert effect.low == pytest.approx(speedup, rel=1e-6) and effect.high == pytest.approx(speedup, rel=1e-6)


@pytest.mark.parametrize("level", [0, 1, -0.5, 1.5, "0.95", True, None, math.nan])
def test_a_level_outside_zero_one_is_refused(level):
    with pytest.raises(ValueError, match=r"^confidence: .* is not allowed \(a level between 0 and 1"):
        check_level(level)


@pytest.mark.parametrize("runs_before,runs_after,sd_before,sd_after", [
    (8, 3, 0.43, 0.02),   # a baseline spread by its placements against a sprayed scheme
    (6, 3, 0.04, 0.03),
    (3, 3, 0.1, 0.1),
])
def test_the_unpaired_ratio_interval_covers_at_its_level(runs_before, runs_after, sd_before, sd_after):
    rng = np.random.default_rng(runs_before * 10 + runs_after)
    hits = 0
    for _ in range(DRAWS):
        before = 2.0 * np.exp(rng.normal(0, sd_before, runs_before))
        after = 2.0 / 1.8 * np.exp(rng.normal(0, sd_after, runs_after))
        effect = unpaired_ratio(before, after)
        hits += effect.low <= 1.8 <= effect.high
    assert hits / DRAWS == pytest.approx(0.95, abs=0.03)


def test_more_runs_of_the_spread_side_narrow_the_unpaired_interval():
    rng = np.random.default_rng(3)
    before = 2.0 * np.exp(rng.normal(0, 0.4, 12))
    after = np.full(3, 1.0) * np.exp(rng.normal(0, 0.01, 3))
    few, many = unpaired_ratio(before[:3], after), unpaired_ratio(before, after)
    assert many.high / many.low < few.high / few.low
    assert many.design == "unpaired" and many.runs == (12, 3) and many.pairs == 3


def test_an_unpaired_side_of_one_run_gives_no_interval():
    effect = unpaired_ratio([2.0, 2.2, math.nan], [1.0])
    assert effect.estimate == pytest.approx(math.sqrt(4.4)) and not effect.judged
    assert effect.verdict() == "not judged (one run of a side)"
    assert unpaired_ratio([], [1.0]).verdict() == "no runs"
