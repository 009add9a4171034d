"""attnprof.stats: the median, low median, quantile and spread every module shares."""

from __future__ import annotations

import ast
import random
import statistics
from collections import Counter
from pathlib import Path

import pytest

from attnprof import stats
from attnprof.analysis.instance.metrics import median_counts
from attnprof.stats import median, median_count, median_count_of, quantile, spread


def test_median_is_the_middle_or_the_mean_of_the_two_middles():
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([1.0, 2.0, 3.0, 4.0]) == 2.5
    assert median([7]) == 7.0 and isinstance(median([7]), float)
    values = [0.1, 0.7, 0.3, 0.9]
    assert median(values) == statistics.median(values)  # bit for bit: the analysis JSON depends on it


def test_median_of_nothing_raises():
    with pytest.raises(ValueError, match="empty"):
        median([])


def test_median_count_is_a_count_some_sample_had():
    assert median_count([1, 2]) == 1  # the low median, never 1.5
    assert median_count([5, 3, 4]) == 4
    assert median_count([2, 2, 9, 9]) == 2
    assert median_count([]) == 0


@pytest.mark.parametrize("seed", range(5))
def test_median_count_of_counts_with_multiplicities_is_the_median_count_of_the_samples(seed):
    rng = random.Random(seed)
    for _ in range(300):
        pairs = [(rng.randint(0, 6), rng.randint(1, 4)) for _ in range(rng.randint(0, 6))]
        samples = [value for value, n in pairs for _ in range(n)]
        assert median_count_of(pairs) == median_count(samples)


@pytest.mark.parametrize("seed", range(3))
def test_median_counts_read_each_distinct_counter_with_its_multiplicity(seed):
    rng = random.Random(10 + seed)
    for _ in range(100):
        distinct = [Counter({k: rng.randint(1, 3) for k in rng.sample("abcde", rng.randint(0, 4))}) for _ in range(3)]
        pairs = [(c, rng.randint(1, 4)) for c in distinct]
        samples = [c for c, n in pairs for _ in range(n)]
        keys = sorted(set().union(*samples))
        assert median_counts(pairs) == {k: median_count([c.get(k, 0) for c in samples]) for k in keys}


@pytest.mark.parametrize(("q", "expected"), [(0.0, 1.0), (0.25, 2.25), (0.5, 3.5), (0.75, 4.75), (1.0, 10.0)])
def test_quantile_interpolates_linearly(q, expected):
    # sorted: 1 2 3 4 5 10; position q * 5 between order statistics (numpy's and torch's default)
    assert quantile([5.0, 1.0, 4.0, 2.0, 3.0, 10.0], q) == pytest.approx(expected)


def test_quantile_edges():
    assert quantile([4.0], 0.3) == 4.0
    assert quantile([1.0, 2.0, 3.0], 0.5) == 2.0
    with pytest.raises(ValueError, match="empty"):
        quantile([], 0.5)
    for q in (-0.1, 1.1):
        with pytest.raises(ValueError, match="q must be in"):
            quantile([1.0], q)


def test_spread_only_where_values_differ():
    assert spread([1.0, 3.0, 2.0]) == {"min": 1.0, "max": 3.0}
    assert spread([1.23456, 2.0]) == {"min": 1.235, "max": 2.0}
    assert spread([1.23456, 2.0], digits=1) == {"min": 1.2, "max": 2.0}
    assert spread([2.0, 2.0]) is None
    assert spread([2.0]) is None and spread([]) is None


def test_imports_nothing_of_attnprof_and_no_torch():
    tree = ast.parse(Path(stats.__file__).read_text())
    imported = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    imported |= {
        node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    }
    assert not imported & {"attnprof", "torch"}, imported
