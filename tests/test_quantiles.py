"""approx_percentile's buckets and window order statistics (features.kernel.quantiles), without Spark, against
brute force: numpy's "inverted_cdf" quantile of the window's values."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from features.kernel.quantiles import ALPHA, WaveletMatrix, bucket_codes, bucket_values, window_quantiles


def test_a_bucket_represents_each_of_its_values_within_alpha() -> None:
    rng = np.random.default_rng(3)
    values = np.r_[rng.lognormal(3, 4, 20_000), -rng.lognormal(0, 3, 2_000), 0.0, 5e-324, 1.7e308, -1.7e308]
    got = bucket_values(bucket_codes(values))
    assert np.all(np.abs(got - values) <= ALPHA * np.abs(values) * (1 + 1e-12))
    order = np.argsort(values, kind="stable")
    assert np.all(np.diff(bucket_codes(values)[order]) >= 0)  # codes keep the order of the values


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 50), st.integers(1, 5)), min_size=1, max_size=60),
    st.lists(st.tuples(st.integers(0, 59), st.integers(1, 60), st.floats(0, 1)), min_size=1, max_size=20),
)
def test_weighted_kth_matches_brute_force(items, queries) -> None:
    values = np.array([v for v, _ in items])
    weights = np.array([w for _, w in items])
    matrix = WaveletMatrix(values, weights, bits=6)
    for lo, length, fraction in queries:
        lo, hi = min(lo, len(values) - 1), min(lo + length, len(values))
        expanded = np.sort(np.repeat(values[lo:hi], weights[lo:hi]))
        k = min(int(fraction * len(expanded)), len(expanded) - 1)
        got = matrix.kth(np.array([lo]), np.array([hi]), np.array([k]))[0]
        assert got == expanded[k]
        assert matrix.weight(np.array([lo]), np.array([hi]))[0] == len(expanded)


@pytest.mark.parametrize("q", [0.0, 0.1, 0.5, 0.9, 0.99, 1.0])
def test_window_quantiles_are_within_alpha_of_the_exact_quantile(q: float) -> None:
    rng = np.random.default_rng(int(q * 100))
    values = np.round(rng.normal(100, 40, 5_000), 2)
    lo = rng.integers(0, 4_900, 500)
    hi = lo + rng.integers(1, 400, 500)
    hi = np.minimum(hi, len(values))
    got, n = window_quantiles(bucket_codes(values), np.ones(len(values), np.int64), lo, hi, q)
    exact = np.array([np.quantile(values[a:b], q, method="inverted_cdf") for a, b in zip(lo, hi, strict=True)])
    assert np.array_equal(n, hi - lo)
    assert np.all(np.abs(got - exact) <= ALPHA * np.abs(exact) * (1 + 1e-12))


def test_an_empty_window_has_no_values() -> None:
    _, n = window_quantiles(bucket_codes(np.array([1.0, 2.0])), np.array([1, 1]), np.array([1]), np.array([1]), 0.5)
    assert n[0] == 0
