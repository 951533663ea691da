"""Recomputed features put beside the values the offline table holds for the others (features.kernel.beside): each
row gets every feature's value as of its window end, rows of both sides at one window end become one, and each
key's newest row is flagged (docs/operations.md, "Changing a group's definition"). The whole backfill path is
compared with a full recompute in tests/test_schedule.py; this pins the rows one by one, and against a brute force
over random series."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from features.kernel import beside

EMPTY = {
    "a": pa.array([0], pa.int64()),
    "b": pa.array([0], pa.int64()),
    "m": pa.array([[]], pa.map_(pa.string(), pa.int64())),
}


def _table(rows: list[tuple], columns: str, types: list[pa.DataType]) -> pa.Table:
    names = columns.split()
    return pa.table({n: pa.array([r[i] for r in rows], t) for i, (n, t) in enumerate(zip(names, types, strict=True))})


def test_each_row_takes_every_features_value_as_of_its_window_end() -> None:
    kept = _table([("u1", 5, 1), ("u1", 15, 2), ("u2", 5, 5)], "user_id end a", [pa.string(), pa.int64(), pa.int64()])
    rebuilt = _table(
        [("u1", 10, 10), ("u1", 15, 11), ("u3", 20, 7)], "user_id end b", [pa.string(), pa.int64(), pa.int64()]
    )

    merged, newest = beside(["user_id"], "end", kept, rebuilt, 10, EMPTY)

    assert merged.to_pylist() == [
        {"user_id": "u1", "end": 10, "a": 1, "b": 10},  # a as of 5
        {"user_id": "u1", "end": 15, "a": 2, "b": 11},  # both sides at 15: one row
        {"user_id": "u3", "end": 20, "a": 0, "b": 7},  # a before its first value: its empty value
    ]  # u2 has no row at or after 10
    assert newest.tolist() == [False, True, True]


def test_empty_maps_and_an_empty_side() -> None:
    kept = _table([], "k end m", [pa.string(), pa.int64(), pa.map_(pa.string(), pa.int64())])
    rebuilt = _table([("x", 3, 1)], "k end a", [pa.string(), pa.int64(), pa.int64()])

    merged, newest = beside(["k"], "end", kept, rebuilt, 0, EMPTY)

    assert merged.to_pylist() == [{"k": "x", "end": 3, "m": [], "a": 1}]
    assert newest.tolist() == [True]
    nothing, none = beside(["k"], "end", kept, rebuilt.slice(0, 0), 0, EMPTY)
    assert nothing.num_rows == 0 and len(none) == 0


def _brute(kept: list[tuple], rebuilt: list[tuple], lo: int) -> list[dict]:
    """Every (key, end) of either side at or after `lo`, each side's last value at or before it (0 before its
    first), the key's newest such row flagged."""
    rows = []
    points = sorted({(k1, k2, e) for k1, k2, e, _ in kept + rebuilt if e >= lo})
    for k1, k2, e in points:
        a = [v for x1, x2, x, v in kept if (x1, x2) == (k1, k2) and x <= e]
        b = [v for x1, x2, x, v in rebuilt if (x1, x2) == (k1, k2) and x <= e]
        last = max(x for x1, x2, x, _ in kept + rebuilt if (x1, x2) == (k1, k2)) == e
        rows.append({"k1": k1, "k2": k2, "end": e, "a": a[-1] if a else 0, "b": b[-1] if b else 0, "newest": last})
    return rows


@pytest.mark.parametrize("seed", range(30))
def test_random_series_against_a_brute_force(seed: int) -> None:
    rng = random.Random(seed)

    def series(n: int) -> list[tuple]:
        points = {(rng.choice("pq"), rng.randint(0, 2), rng.randint(0, 30)) for _ in range(n)}
        return [(k1, k2, e, rng.randint(1, 99)) for k1, k2, e in sorted(points)]  # one value per key and end

    kept, rebuilt, lo = series(rng.randint(0, 25)), series(rng.randint(0, 25)), rng.randint(0, 20)
    types = [pa.string(), pa.int32(), pa.int64(), pa.int64()]
    shuffled = rng.sample(rebuilt, len(rebuilt))  # the kernel's rows come sorted, but order must not matter

    merged, newest = beside(
        ["k1", "k2"], "end", _table(kept, "k1 k2 end a", types), _table(shuffled, "k1 k2 end b", types), lo, EMPTY
    )

    got = [{**row, "newest": bool(flag)} for row, flag in zip(merged.to_pylist(), newest, strict=True)]
    assert got == _brute(kept, rebuilt, lo)


@pytest.mark.spark
def test_some_features_beside_the_tables_rows_equal_the_whole_group_with_int_keys(spark) -> None:
    """The engine's path (features.engine.batch.change_points with `beside`): events whose key is a 32-bit int,
    table rows whose key is a bigint (as the table stores it), grouped into the same buckets."""
    from dataclasses import replace
    from datetime import UTC, datetime

    import numpy as np
    import pandas as pd
    from pyspark.sql import functions as F

    from features import Entity, EventSource, Feature, FeatureGroup, Hop, Lifetime, agg
    from features.engine.batch import TableRows, change_points
    from features.spec import WINDOW_END

    rng = np.random.default_rng(5)
    start = datetime(2026, 3, 1, tzinfo=UTC)
    events = pd.DataFrame(
        {
            "account": rng.integers(0, 40, 3_000).astype("int32"),
            "amount": rng.gamma(2.0, 30.0, 3_000),
            "event_ts": start + pd.to_timedelta(rng.integers(0, 2 * 86_400, 3_000), unit="s"),
        }
    )
    group = FeatureGroup(
        "accounts",
        Entity("account", join_keys=["account"]),
        EventSource("events", path="unused", timestamp="event_ts"),
        [
            Feature("n_1h", agg.count(), window=Hop("1h", every="10m")),
            Feature("n_ever", agg.count(), window=Lifetime(every="1h")),
            Feature("max_3h", agg.max("amount"), window=Hop("3h", every="10m")),
        ],
    )
    frame = spark.createDataFrame(events).withColumn("account", F.col("account").cast("int"))
    lo, hi = int(start.timestamp() * 1e6), int((start.timestamp() + 2 * 86_400) * 1e6)
    whole = change_points(group, frame, lo, hi).with_latest
    table = whole.where(~F.col("fx_latest")).drop("fx_latest").withColumn("account", F.col("account").cast("bigint"))
    table = table.withColumn("max_3h", F.lit(None).cast("double"))  # the feature to compute again
    alone = replace(group, features=[group.features[2]])
    beside = change_points(alone, frame, lo, hi, beside=TableRows(group, table)).with_latest

    def rows(df) -> list[tuple]:
        return sorted(
            tuple(r) for r in df.select("account", WINDOW_END, "n_1h", "n_ever", "max_3h", "fx_latest").collect()
        )

    assert rows(beside) == rows(whole)
