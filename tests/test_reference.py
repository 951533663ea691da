"""The brute-force reference itself, on tiny cases computed by hand (no Spark)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from reference import (
    rank_error,
    reference_frame,
    reference_value,
    reference_window_values,
    to_micros,
    where_mask,
)

from features import Entity, EventSource, Feature, FeatureGroup, Hop, Lifetime, Tumble, agg

SOURCE = EventSource("transactions", path="data/transactions", timestamp="event_ts")
USER = Entity("user", join_keys=["user_id"])
US = pd.Timedelta(microseconds=1)


def ts(text: str) -> pd.Timestamp:
    return pd.Timestamp(text, tz="UTC")


def events(*rows: tuple[object, ...], columns: tuple[str, ...] = ("user_id", "event_ts", "amount")) -> pd.DataFrame:
    frame = pd.DataFrame(list(rows), columns=list(columns))
    frame["event_ts"] = pd.to_datetime(frame["event_ts"], utc=True, format="ISO8601").astype("datetime64[us, UTC]")
    return frame


def group(*features: Feature, entity: Entity = USER) -> FeatureGroup:
    return FeatureGroup("g", entity, SOURCE, list(features))


def value(frame: pd.DataFrame, feature: Feature, t: str | pd.Timestamp, key: object = ("u1",)) -> object:
    return reference_value(frame, group(feature), feature.name, key, ts(t) if isinstance(t, str) else t)


# ----------------------------------------------------------------------------------------------------------
# Windows


def test_window_is_half_open_event_at_e_belongs_to_next_window() -> None:
    frame = events(
        ("u1", "2026-01-01 00:00", 1.0), ("u1", "2026-01-01 00:59:59.999999", 2.0), ("u1", "2026-01-01 01:00", 4.0)
    )
    count = Feature("n", agg.count(), window=Tumble("1h"))
    total = Feature("s", agg.sum("amount"), window=Tumble("1h"))
    assert value(frame, count, "2026-01-01 01:00") == 2  # [00:00, 01:00): the 01:00 event is not in yet
    assert value(frame, total, "2026-01-01 01:00") == 3.0
    assert value(frame, count, ts("2026-01-01 01:00") - US) == 0  # E = 00:00: window [23:00, 00:00)
    assert value(frame, count, "2026-01-01 01:59:59.999999") == 2
    assert value(frame, count, "2026-01-01 02:00") == 1  # [01:00, 02:00) holds the 01:00 event
    assert value(frame, total, "2026-01-01 02:00") == 4.0


def test_hop_with_every_smaller_than_size() -> None:
    frame = events(
        ("u1", "2026-01-01 00:10", 1),
        ("u1", "2026-01-01 00:20", 2),
        ("u1", "2026-01-01 00:50", 4),
        ("u1", "2026-01-01 01:05", 8),
    )
    total = Feature("s", agg.sum("amount"), window=Hop("1h", every="15m"))
    expected = {
        "2026-01-01 00:14:59": 0,  # E = 00:00
        "2026-01-01 00:15": 1,  # [23:15, 00:15)
        "2026-01-01 01:00": 7,  # [00:00, 01:00)
        "2026-01-01 01:14:59.999999": 7,  # still E = 01:00
        "2026-01-01 01:15": 14,  # [00:15, 01:15)
        "2026-01-01 01:30": 12,  # [00:30, 01:30)
        "2026-01-01 02:00": 8,  # [01:00, 02:00)
        "2026-01-01 02:15": 0,  # [01:15, 02:15): back to 0 after the last event leaves
    }
    for t, want in expected.items():
        got = value(frame, total, t)
        assert got == want and isinstance(got, int), (t, got)  # an int column sums to an int


def test_windows_are_epoch_aligned_in_utc_also_before_1970() -> None:
    frame = events(("u1", "1969-12-31 22:30", 1.0), ("u1", "1969-12-31 23:10", 2.0))
    count = Feature("n", agg.count(), window=Tumble("1h"))
    assert value(frame, count, "1969-12-31 23:30") == 1  # floor gives E = 23:00, not 00:00
    # A timestamp in another time zone is the same instant: 00:30+01:00 is 23:30 UTC.
    assert value(frame, count, pd.Timestamp("1970-01-01 00:30", tz="Europe/Paris")) == 1
    assert value(frame, count, pd.Timestamp("1970-01-01 00:00")) == 1  # naive means UTC: [23:00, 00:00)


def test_lifetime_reads_everything_before_e() -> None:
    frame = events(("u1", "2020-01-01", 1.0), ("u1", "2026-01-01 10:00", 2.0), ("u1", "2026-01-01 10:59", 4.0))
    count = Feature("n", agg.count(), window=Lifetime(every="1h"))
    assert value(frame, count, "2026-01-01 10:59:59") == 1
    assert value(frame, count, "2026-01-01 11:00") == 3
    assert value(frame, count, "2019-12-31") == 0


def test_every_aggregation_over_a_lifetime_window() -> None:
    """Values years apart all count, a null among them ignored (computed by hand)."""
    frame = events(
        ("u1", "2020-01-01", 4.0),
        ("u1", "2024-06-01", None),
        ("u1", "2026-01-01 10:00", 1.0),
        ("u1", "2026-01-01 10:30", 7.0),
        ("u2", "2026-01-01 10:45", 9.0),
    )
    life = Lifetime(every="1h")
    want = {
        # at 11:00: the values 4, 1, 7 (and the null's row for count)
        "2026-01-01 11:00": {
            "count": 4, "sum": 12.0, "avg": 4.0, "min": 1.0, "max": 7.0, "stddev": 3.0, "first": 4.0, "last": 7.0,
            "distinct": 3, "p50": 4.0, "last_k": [7.0, 1.0, 4.0],
        },
        # at 10:59: only the 2020 value and the null, whatever happened since
        "2026-01-01 10:59": {
            "count": 2, "sum": 4.0, "avg": 4.0, "min": 4.0, "max": 4.0, "stddev": None, "first": 4.0, "last": 4.0,
            "distinct": 1, "p50": 4.0, "last_k": [4.0],
        },
    }  # fmt: skip
    for t, values in want.items():
        for name, aggregation in ALL_AGGREGATIONS:
            got = value(frame, Feature(name, aggregation, window=life), t)  # type: ignore[arg-type]
            assert got == values[name], (t, name, got)


# ----------------------------------------------------------------------------------------------------------
# Empty windows and nulls


ALL_AGGREGATIONS = [
    ("count", agg.count()),
    ("sum", agg.sum("amount")),
    ("avg", agg.avg("amount")),
    ("min", agg.min("amount")),
    ("max", agg.max("amount")),
    ("stddev", agg.stddev("amount")),
    ("first", agg.first("amount")),
    ("last", agg.last("amount")),
    ("distinct", agg.approx_count_distinct("amount")),
    ("p50", agg.approx_percentile("amount", 0.5)),
    ("last_k", agg.last_k("amount", 3)),
]
ZERO_WHEN_EMPTY = {"count", "sum", "distinct"}


@pytest.mark.parametrize(("name", "aggregation"), ALL_AGGREGATIONS)
def test_empty_window_gives_zero_or_none(name: str, aggregation: object) -> None:
    frame = events(("u1", "2026-01-01 00:30", 5.0))
    feature = Feature(name, aggregation, window=Tumble("1h"))  # type: ignore[arg-type]
    got = value(frame, feature, "2026-01-01 03:00")
    assert got == 0 if name in ZERO_WHEN_EMPTY else got is None
    assert value(frame, feature, "2026-01-01 00:00", key=("nobody",)) == got  # unknown key: empty too


@pytest.mark.parametrize(("name", "aggregation"), ALL_AGGREGATIONS)
def test_all_null_window_counts_as_empty_except_count(name: str, aggregation: object) -> None:
    frame = events(("u1", "2026-01-01 00:10", None), ("u1", "2026-01-01 00:20", np.nan))
    feature = Feature(name, aggregation, window=Tumble("1h"))  # type: ignore[arg-type]
    got = value(frame, feature, "2026-01-01 01:00")
    if name == "count":
        assert got == 2  # count() counts rows, null or not
    elif name in ZERO_WHEN_EMPTY:
        assert got == 0
    else:
        assert got is None


def test_nulls_are_ignored() -> None:
    frame = events(("u1", "2026-01-01 00:10", 2.0), ("u1", "2026-01-01 00:20", None), ("u1", "2026-01-01 00:30", 6.0))
    t = "2026-01-01 01:00"
    window = Tumble("1h")
    assert value(frame, Feature("n", agg.count(), window=window), t) == 3
    assert value(frame, Feature("s", agg.sum("amount"), window=window), t) == 8.0
    assert value(frame, Feature("a", agg.avg("amount"), window=window), t) == 4.0
    assert value(frame, Feature("lo", agg.min("amount"), window=window), t) == 2.0
    assert value(frame, Feature("f", agg.first("amount"), window=window), t) == 2.0
    assert value(frame, Feature("la", agg.last("amount"), window=window), t) == 6.0  # not the null at 00:20
    assert value(frame, Feature("k", agg.last_k("amount", 5), window=window), t) == [6.0, 2.0]
    assert value(frame, Feature("d", agg.approx_count_distinct("amount"), window=window), t) == 2


def test_rows_with_null_timestamp_or_key_are_in_no_window() -> None:
    frame = events(("u1", "2026-01-01 00:10", 1.0), ("u1", None, 2.0), (None, "2026-01-01 00:20", 4.0))
    count = Feature("n", agg.count(), window=Lifetime(every="1h"))
    assert value(frame, count, "2026-01-02") == 1


def test_sum_types_follow_the_column() -> None:
    frame = events(("u1", "2026-01-01 00:10", 1), ("u1", "2026-01-01 00:20", 2))
    total = Feature("s", agg.sum("amount"), window=Tumble("1h"))
    assert isinstance(value(frame, total, "2026-01-01 01:00"), int)
    assert isinstance(value(frame, total, "2026-01-01 05:00"), int)  # empty: int 0
    floats = frame.assign(amount=frame["amount"].astype(float))
    assert isinstance(value(floats, total, "2026-01-01 01:00"), float)
    assert isinstance(value(floats, total, "2026-01-01 05:00"), float)  # empty: 0.0


def test_float_sum_is_correctly_rounded() -> None:
    frame = events(*(("u1", f"2026-01-01 00:{i:02d}", 0.1) for i in range(10)))
    assert value(frame, Feature("s", agg.sum("amount"), window=Tumble("1h")), "2026-01-01 01:00") == 1.0


# ----------------------------------------------------------------------------------------------------------
# Order-dependent aggregations


def test_first_and_last_break_timestamp_ties_by_value() -> None:
    frame = events(
        ("u1", "2026-01-01 00:10", 5.0),
        ("u1", "2026-01-01 00:10", 3.0),
        ("u1", "2026-01-01 00:40", 1.0),
        ("u1", "2026-01-01 00:40", 7.0),
        ("u1", "2026-01-01 00:40", 2.0),
    )
    window = Tumble("1h")
    assert value(frame, Feature("f", agg.first("amount"), window=window), "2026-01-01 01:00") == 3.0  # smallest
    assert value(frame, Feature("la", agg.last("amount"), window=window), "2026-01-01 01:00") == 7.0  # largest


def test_first_and_last_of_strings() -> None:
    frame = events(("u1", "2026-01-01 00:10", "b"), ("u1", "2026-01-01 00:10", "a"), ("u1", "2026-01-01 00:20", "c"))
    window = Tumble("1h")
    assert value(frame, Feature("f", agg.first("amount"), window=window), "2026-01-01 01:00") == "a"
    assert value(frame, Feature("la", agg.last("amount"), window=window), "2026-01-01 01:00") == "c"


def test_last_k_is_newest_first_with_larger_value_first_on_ties() -> None:
    frame = events(
        ("u1", "2026-01-01 00:01", 1),
        ("u1", "2026-01-01 00:02", 2),
        ("u1", "2026-01-01 00:02", 9),
        ("u1", "2026-01-01 00:03", 4),
        ("u1", "2026-01-01 00:04", None),
    )
    window = Tumble("1h")
    t = "2026-01-01 01:00"
    assert value(frame, Feature("k", agg.last_k("amount", 3), window=window), t) == [4, 9, 2]
    assert value(frame, Feature("k", agg.last_k("amount", 10), window=window), t) == [4, 9, 2, 1]
    assert value(frame, Feature("k", agg.last_k("amount", 1), window=window), t) == [4]
    assert value(frame, Feature("k", agg.last_k("amount", 1), window=window), "2026-01-01 00:30") is None


def test_stddev_is_the_sample_stddev() -> None:
    window = Tumble("1h")
    feature = Feature("sd", agg.stddev("amount"), window=window)
    one = events(("u1", "2026-01-01 00:10", 3.0))
    assert value(one, feature, "2026-01-01 01:00") is None  # fewer than two values
    two = events(("u1", "2026-01-01 00:10", 1.0), ("u1", "2026-01-01 00:20", 3.0))
    assert value(two, feature, "2026-01-01 01:00") == pytest.approx(math.sqrt(2.0))
    same = events(("u1", "2026-01-01 00:10", 2.0), ("u1", "2026-01-01 00:20", 2.0))
    assert value(same, feature, "2026-01-01 01:00") == 0.0


def test_min_max_avg_and_exact_distinct() -> None:
    frame = events(*(("u1", f"2026-01-01 00:{i:02d}", v) for i, v in enumerate([5, 1, 5, 3, 1, 9])))
    window = Tumble("1h")
    t = "2026-01-01 01:00"
    assert value(frame, Feature("lo", agg.min("amount"), window=window), t) == 1
    assert value(frame, Feature("hi", agg.max("amount"), window=window), t) == 9
    assert value(frame, Feature("a", agg.avg("amount"), window=window), t) == 4.0
    assert value(frame, Feature("d", agg.approx_count_distinct("amount"), window=window), t) == 4


# ----------------------------------------------------------------------------------------------------------
# Percentiles and rank error


def test_percentile_is_the_exact_lower_quantile() -> None:
    frame = events(*(("u1", f"2026-01-01 00:{i:02d}", float(v)) for i, v in enumerate([7, 3, 10, 1, 5, 2, 9, 4, 6, 8])))
    window = Tumble("1h")
    t = "2026-01-01 01:00"

    def quantile(q: float) -> object:
        return value(frame, Feature("p", agg.approx_percentile("amount", q), window=window), t)

    assert quantile(0.0) == 1.0
    assert quantile(0.5) == 5.0  # lower median of 1..10
    assert quantile(0.51) == 6.0
    assert quantile(1.0) == 10.0
    feature = Feature("p", agg.approx_percentile("amount", 0.5), window=window)
    window_values = reference_window_values(frame, group(feature), "p", ("u1",), ts(t))
    assert window_values == [float(v) for v in range(1, 11)]


def test_rank_error() -> None:
    values = list(range(1, 101))
    assert rank_error(values, 50, 0.5) == 0.0
    assert rank_error(values, 52, 0.5) == pytest.approx(0.01)  # 51 values below it
    assert rank_error(values, 0, 0.0) == 0.0
    assert rank_error(values, 1000, 1.0) == 0.0
    ties = [1, 2, 2, 2, 3]
    assert rank_error(ties, 2, 0.5) == 0.0  # 2 spans ranks 1..4 of 5
    assert rank_error(ties, 2, 0.9) == pytest.approx(0.1)
    assert rank_error(ties, 2.5, 0.5) == pytest.approx(0.3)  # between values: rank 4 only
    with pytest.raises(ValueError):
        rank_error([], 1.0, 0.5)


# ----------------------------------------------------------------------------------------------------------
# where and keys


STATUS_ROWS = (
    ("u1", "2026-01-01 00:01", 50.0, "FAILED"),
    ("u1", "2026-01-01 00:02", 150.0, "APPROVED"),
    ("u1", "2026-01-01 00:03", None, "DECLINED"),
    ("u1", "2026-01-01 00:04", 20.0, None),
    ("u1", "2026-01-01 00:05", 200.0, "FAILED"),
)


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("status = 'FAILED'", 2),
        ("status == 'FAILED'", 2),
        ("status != 'FAILED'", 2),  # the null status is unknown, not "not FAILED"
        ("status <> 'FAILED'", 2),
        ("status IN ('FAILED', 'DECLINED')", 3),
        ("status NOT IN ('FAILED', 'DECLINED')", 1),
        ("amount > 100", 2),
        ("NOT (amount > 100)", 2),  # the null amount stays unknown under NOT
        ("NOT amount > 100", 2),
        ("amount IS NULL", 1),
        ("amount IS NOT NULL", 4),
        ("status = 'FAILED' AND amount >= 100", 1),
        ("status = 'FAILED' or amount < 30", 3),
        ("status = 'DECLINED' OR status = 'FAILED' AND amount > 100", 2),  # AND binds tighter
        ("(status = 'DECLINED' OR status = 'FAILED') AND amount > 100", 1),
        ("amount BETWEEN 20 AND 150", 3),
        ("amount NOT BETWEEN 20 AND 150", 1),
        ("amount > -1.5e1", 4),
        ("STATUS = 'FAILED'", 2),  # Spark resolves column names case-insensitively
        ("TRUE", 5),
        ("status = NULL", 0),
        ("amount IS NULL OR NOT (status = 'APPROVED')", 3),
    ],
)
def test_where_filters_with_sql_null_semantics(where: str, expected: int) -> None:
    frame = events(*STATUS_ROWS, columns=("user_id", "event_ts", "amount", "status"))
    count = Feature("n", agg.count(), window=Tumble("1h"), where=where)
    assert value(frame, count, "2026-01-01 01:00") == expected


def test_where_with_quotes_and_boolean_columns() -> None:
    frame = pd.DataFrame({"name": ["it's", "its", None], "flag": [True, False, None]})
    assert where_mask(frame, "name = 'it''s'").tolist() == [True, False, False]
    assert where_mask(frame, "flag").tolist() == [True, False, False]
    assert where_mask(frame, "NOT flag").tolist() == [False, True, False]
    assert where_mask(frame, "flag IS NULL OR flag = FALSE").tolist() == [False, True, True]


@pytest.mark.parametrize(
    "where", ["amount * 2 > 10", "status LIKE 'F%'", "status = 'FAILED' AND", "nope = 1", "amount"]
)
def test_unsupported_where_raises(where: str) -> None:
    frame = events(*STATUS_ROWS, columns=("user_id", "event_ts", "amount", "status"))
    with pytest.raises(ValueError, match="reference where"):
        where_mask(frame, where)


def test_composite_keys() -> None:
    frame = pd.DataFrame(
        {
            "card_id": ["c1", "c1", "c2", "c1"],
            "merchant_id": ["m1", "m2", "m1", "m1"],
            "event_ts": pd.to_datetime(["2026-01-01 00:10"] * 4, utc=True),
            "amount": [1.0, 2.0, 4.0, 8.0],
        }
    )
    entity = Entity("card_merchant", join_keys=["card_id", "merchant_id"])
    total = Feature("s", agg.sum("amount"), window=Tumble("1h"))
    g = group(total, entity=entity)
    t = ts("2026-01-01 01:00")
    assert reference_value(frame, g, "s", ("c1", "m1"), t) == 9.0
    assert reference_value(frame, g, "s", ("c1", "m2"), t) == 2.0
    assert reference_value(frame, g, "s", ("c2", "m2"), t) == 0.0


def test_reference_frame_shape_and_types() -> None:
    frame = events(*STATUS_ROWS, columns=("user_id", "event_ts", "amount", "status"))
    g = group(
        Feature("failed", agg.count(), window=Hop("1h", every="5m"), where="status = 'FAILED'"),
        Feature("total", agg.sum("amount"), window=Hop("1h", every="5m")),
        Feature("top", agg.max("amount"), window=Lifetime(every="1h")),
        Feature("recent", agg.last_k("status", 2), window=Tumble("1h")),
    )
    queries = [(("u1",), ts("2026-01-01 00:05")), (("u1",), ts("2026-01-01 01:00")), (("u2",), ts("2026-01-01 01:00"))]
    out = reference_frame(frame, g, queries)
    assert list(out.columns) == ["user_id", "t", "failed", "total", "top", "recent"]
    assert str(out["t"].dtype) == "datetime64[us, UTC]"
    assert out["failed"].dtype == np.int64 and out["total"].dtype == np.float64
    assert out["top"].dtype == object
    assert out["user_id"].tolist() == ["u1", "u1", "u2"]
    assert out["failed"].tolist() == [1, 2, 0]
    assert out["total"].tolist() == [220.0, 420.0, 0.0]
    assert out["top"].tolist() == [None, 200.0, None]  # None, not NaN
    assert out["recent"].tolist() == [None, ["FAILED", "DECLINED"], None]


def test_to_micros_floors() -> None:
    assert to_micros(pd.Timestamp("1970-01-01 00:00:00.000001999", tz="UTC")) == 1
    assert to_micros(pd.Timestamp("1969-12-31 23:59:59.999999500", tz="UTC")) == -1


# ----------------------------------------------------------------------------------------------------------
# What request-time features read: the last event's time and the set of distinct values


def test_last_event_time_is_the_latest_rows_time_rounded_down_to_the_second() -> None:
    frame = events(
        ("u1", "2026-01-01 00:10:00.25", 5.0),
        ("u1", "2026-01-01 00:59:59.999999", None),  # a null value: its row still counts, as for count()
        ("u1", "2026-01-01 01:00", 1.0),  # on the window end: from the next window on
        ("u2", "2026-01-01 00:20:07.5", 2.0),  # one event
    )
    seen = Feature("seen", agg.last_event_time(), window=Tumble("1h"))
    assert value(frame, seen, "2026-01-01 01:00") == ts("2026-01-01 00:59:59")
    assert value(frame, seen, "2026-01-01 00:59:59.999999") is None  # E = 00:00: the empty window before
    assert value(frame, seen, "2026-01-01 02:00") == ts("2026-01-01 01:00")
    assert value(frame, seen, "2026-01-01 03:00") is None  # every event left the window
    assert value(frame, seen, "2026-01-01 01:00", key=("u2",)) == ts("2026-01-01 00:20:07")
    assert value(frame, seen, "2026-01-01 01:00", key=("nobody",)) is None
    lifetime = Feature("seen_ever", agg.last_event_time(), window=Lifetime(every="1h"), where="amount > 3")
    assert value(frame, lifetime, "2026-01-02 00:00") == ts("2026-01-01 00:10")  # the last row its where keeps


def test_distinct_values_are_the_windows_set_smallest_first() -> None:
    cols = ("user_id", "event_ts", "merchant_id")
    frame = events(
        ("u1", "2026-01-01 00:10", 12),
        ("u1", "2026-01-01 00:20", 3),
        ("u1", "2026-01-01 00:30", 12),
        ("u1", "2026-01-01 00:40", None),
        ("u1", "2026-01-01 01:00", 7),  # on the window end: from the next window on
        ("u2", "2026-01-01 00:15", 9),
        columns=cols,
    )
    frame["merchant_id"] = frame["merchant_id"].astype("Int64")
    merchants = Feature("merchants", agg.distinct_values("merchant_id"), window=Tumble("1h"))
    assert value(frame, merchants, "2026-01-01 01:00") == [3, 12]
    assert value(frame, merchants, "2026-01-01 02:00") == [7]
    assert value(frame, merchants, "2026-01-01 03:00") == []  # empty: the set with no member
    assert value(frame, merchants, "2026-01-01 01:00", key=("u2",)) == [9]
    assert value(frame, merchants, "2026-01-01 01:00", key=("nobody",)) == []
    nulls = events(("u1", "2026-01-01 00:10", None), columns=cols)
    assert value(nulls, merchants, "2026-01-01 01:00") == []  # only nulls: no member
    words = events(("u1", "2026-01-01 00:10", "b"), ("u1", "2026-01-01 00:11", "B"), ("u1", "2026-01-01 00:12", "a"))
    statuses = Feature("statuses", agg.distinct_values("amount"), window=Tumble("1h"))
    assert value(words, statuses, "2026-01-01 01:00") == ["B", "a", "b"]  # by code point, as Spark sorts strings
