"""features.kernel.profile and features.kernel.drift_measures without Spark: profiles equal a brute-force
computation and merge to the profile of the union in any order; the drift measures flag each kind of shift and
nothing else."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from features.kernel.drift_measures import js_distance, measure_drift, psi
from features.kernel.profile import (
    CATEGORY_CAP,
    FeatureProfile,
    from_records,
    merge_all,
    profile_column,
    profile_days,
    to_records,
)

RNG = np.random.default_rng(7)


def numbers(n: int, null_share: float = 0.05, shift: float = 0.0) -> pa.Array:
    values = RNG.normal(100.0 + shift, 15.0, n)
    return pa.array(np.where(RNG.random(n) < null_share, np.nan, values), from_pandas=True)


def test_a_numeric_profile_is_the_brute_force_statistics() -> None:
    column = numbers(5000)
    p = profile_column(column)
    values = np.array([v for v in column.to_pylist() if v is not None])
    assert (p.rows, p.nulls, p.n) == (5000, 5000 - len(values), len(values))
    assert p.mean == pytest.approx(values.mean(), rel=1e-12)
    assert p.std == pytest.approx(values.std(ddof=1), rel=1e-9)
    assert (p.low, p.high) == (values.min(), values.max())
    for q in (0.01, 0.1, 0.5, 0.9, 0.99):
        assert p.quantile(q) == pytest.approx(np.quantile(values, q, method="inverted_cdf"), rel=0.01)
    assert p.distinct() == pytest.approx(len(np.unique(values)), rel=0.07)


def test_integers_beyond_float64_s_exact_range_are_profiled_approximately() -> None:
    """Ids such as 2**60 + k have no exact float64: the statistics (approximate anyway) take the nearest."""
    p = profile_column(pa.array([2**60 + k for k in range(40)], pa.int64()))
    assert p.n == 40 and p.low == p.high == float(2**60)


def test_profiles_merge_to_the_profile_of_all_rows_in_any_order() -> None:
    column = numbers(3000)
    whole = profile_column(column)
    parts = [profile_column(column.slice(i, 500)) for i in range(0, 3000, 500)]
    for order in (parts, parts[::-1], parts[3:] + parts[:3]):
        merged = merge_all(order)
        assert merged is not None
        assert (merged.rows, merged.nulls, merged.n) == (whole.rows, whole.nulls, whole.n)
        assert merged.mean == pytest.approx(whole.mean, rel=1e-12)
        assert merged.m2 == pytest.approx(whole.m2, rel=1e-9)
        assert np.array_equal(merged.codes, whole.codes) and np.array_equal(merged.counts, whole.counts)
        assert np.array_equal(merged.registers, whole.registers)


def test_categories_maps_and_lists() -> None:
    cats = pa.array(["a", "b", None, "a", "c"])
    p = profile_column(cats)
    assert (p.kind, p.rows, p.nulls, p.categories) == ("categorical", 5, 1, {"a": 2, "b": 1, "c": 1})
    maps = pa.array([{"x": 1, "y": 2}, {}, None, {"x": 5}], type=pa.map_(pa.string(), pa.int64()))
    p = profile_column(maps)
    assert (p.kind, p.nulls, p.n, p.mean, p.categories) == ("map", 2, 2, 1.5, {"x": 2, "y": 1})
    lists = pa.array([[1.0, 2.0, 3.0], [], [2.0]])
    p = profile_column(lists)
    assert (p.kind, p.nulls, p.low, p.high) == ("list", 1, 1.0, 3.0)
    assert p.distinct() == pytest.approx(3, abs=0.01)


def test_categories_beyond_the_cap_are_counted_as_other() -> None:
    many = pa.array([f"id{i}" for i in range(CATEGORY_CAP + 10)] + ["id0"])
    p = profile_column(many)
    assert len(p.categories) == CATEGORY_CAP and p.categories["id0"] == 2
    assert sum(p.categories.values()) + p.other == len(many)


def test_profiles_go_through_records_unchanged() -> None:
    ends = pa.array([0, 86_400_000_000, 86_400_000_001, 2 * 86_400_000_000], pa.timestamp("us", "UTC"))
    table = pa.table({"window_end": ends, "f": [1.0, None, 3.0, 4.0], "c": ["a", "b", None, "a"]})
    found = profile_days(table, "window_end", ["f", "c"])
    assert sorted(found) == [(0, "c"), (0, "f"), (1, "c"), (1, "f"), (2, "c"), (2, "f")]
    back = dict(from_records(to_records(found)))
    for key, p in found.items():
        q = back[key]
        assert (q.kind, q.rows, q.nulls, q.n, q.mean, q.categories) == (
            p.kind,
            p.rows,
            p.nulls,
            p.n,
            p.mean,
            p.categories,
        )
        assert np.array_equal(q.registers, p.registers) and np.array_equal(q.codes, p.codes)


def test_empty_profiles() -> None:
    p = profile_column(pa.array([None, None], pa.float64()))
    assert (p.nulls, p.std, p.quantile(0.5), p.distinct()) == (2, None, None, 0.0)
    assert merge_all([]) is None
    assert FeatureProfile("numeric").merge(p).nulls == 2


# ---------------------------------------------------------------------------------------------------------
# Drift


def test_psi_and_js_of_known_shares() -> None:
    r, c = np.array([0.5, 0.5]), np.array([0.25, 0.75])
    assert psi(r, c) == pytest.approx(0.25 * math.log(0.5) * -1 + 0.25 * math.log(1.5))
    assert js_distance(r, r) == 0.0
    assert js_distance(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == pytest.approx(1.0)


@pytest.mark.parametrize("seed", range(3))
def test_each_injected_shift_is_flagged_and_nothing_else(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 3000

    def day(shift: float = 0.0, null_share: float = 0.0, a_share: float = 0.5):
        x = rng.normal(10.0 + shift, 1.0, n)
        x = np.where(rng.random(n) < null_share, np.nan, x)
        cats = rng.choice(["a", "b", "c"], n, p=[a_share, (1 - a_share) * 0.6, (1 - a_share) * 0.4])
        return profile_column(pa.array(x, from_pandas=True)), profile_column(pa.array(cats))

    (ref_x, ref_c), (same_x, same_c) = day(), day()
    flagged = lambda d: d.psi > 0.2 or d.js > 0.1  # noqa: E731 - the monitor's default thresholds
    assert not flagged(measure_drift(ref_x, same_x)) and not flagged(measure_drift(ref_c, same_c))
    assert flagged(measure_drift(ref_x, day(shift=1.0)[0]))  # the mean moved by one standard deviation
    assert flagged(measure_drift(ref_x, day(null_share=0.3)[0]))  # null in 30% of rows
    assert flagged(measure_drift(ref_c, day(a_share=0.2)[1]))  # a category's share changed


@pytest.mark.parametrize(
    ("kwargs", "field", "fix"),
    [
        ({"psi": 0}, "Drift.psi", "psi=0.2"),
        ({"psi": float("nan")}, "Drift.psi", "psi=0.2"),
        ({"js": -0.1}, "Drift.js", "js=0.1"),
        ({"js": 1.5}, "Drift.js", "js=0.1"),
        ({"min_rows": 0}, "Drift.min_rows", "min_rows=100"),
    ],
)
def test_a_wrong_drift_threshold_names_the_field_and_the_fix(kwargs, field, fix) -> None:
    from features import DefinitionError, Drift

    with pytest.raises(DefinitionError) as caught:
        Drift(**kwargs)
    assert caught.value.field == field and fix in str(caught.value)


def test_a_group_s_drift_must_be_a_drift() -> None:
    from features import DefinitionError, Drift, Entity, EventSource, Feature, FeatureGroup, Tumble, agg

    parts = (
        Entity("u", join_keys=["u"]),
        EventSource("s", path="s", timestamp="ts"),
        [Feature("n", agg.count(), Tumble("1h"))],
    )
    assert FeatureGroup("g", *parts, drift=Drift(psi=0.3)).drift == Drift(psi=0.3)
    with pytest.raises(DefinitionError, match=r"FeatureGroup\('g'\).drift: .*Fix: pass Drift"):
        FeatureGroup("g", *parts, drift={"psi": 0.3})
