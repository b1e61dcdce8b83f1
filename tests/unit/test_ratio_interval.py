"""benchmarks/inproc_speed.py's bootstrap interval of a ratio of medians:
seeded (the same entry twice reads the same), exact when every pair agrees,
and around the ratio of medians when they do not."""

import statistics

from benchmarks.inproc_speed import ratio_interval


def test_pairs_that_agree_give_their_ratio():
    assert ratio_interval([20.0, 30.0, 25.0], [2.0, 3.0, 2.5]) == (10.0, 10.0)


def test_the_interval_holds_the_ratio_of_medians_and_is_seeded():
    old = [26.45, 18.49, 22.00, 25.74, 19.47, 21.36, 24.59]
    new = [1.95, 2.05, 2.89, 2.89, 1.99, 1.75, 1.96]
    lo, hi = ratio_interval(old, new)
    assert lo < statistics.median(old) / statistics.median(new) < hi
    assert (lo, hi) == ratio_interval(old, new)
    assert min(old) / max(new) <= lo and hi <= max(old) / min(new)
