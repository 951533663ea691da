"""Recomputed features put beside the values the offline table holds for the others (features.engine.merge): each
row gets every feature's value as of its window end, rows of both sides at one window end become one, and each
key's newest row comes once more flagged LATEST (docs/operations.md, "Changing a group's definition"). The whole
backfill path is compared with a full recompute in tests/test_schedule.py; this pins the rows one by one."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from test_stream import SOURCE
from test_stream_upgrade import USER

from features import Feature, FeatureGroup, Hop, agg
from features.engine.merge import with_table_rows
from features.spec import WINDOW_END, DType
from features.stores.offline import LATEST

pytestmark = pytest.mark.spark

GROUP = FeatureGroup(
    "merged",
    USER,
    SOURCE,
    [
        Feature("a", agg.count(), window=Hop("1h", every="5m")),
        Feature("b", agg.count(), window=Hop("2h", every="5m")),
    ],
)


def t(minute: int) -> datetime:
    return datetime(2026, 3, 1, 0, minute, tzinfo=UTC)


def test_each_row_takes_every_features_value_as_of_its_window_end(spark) -> None:
    table = spark.createDataFrame(
        [("u1", t(5), 1), ("u1", t(15), 2), ("u2", t(5), 5), ("u1", t(30), 9)],
        f"user_id string, {WINDOW_END} timestamp, a bigint",
    )
    rebuilt = spark.createDataFrame(
        [("u1", t(10), 10), ("u1", t(15), 11), ("u3", t(20), 7)],
        f"user_id string, {WINDOW_END} timestamp, b bigint",
    )
    merged = with_table_rows(GROUP, rebuilt, table, ["b"], t(10), t(20), {"a": DType.INT64, "b": DType.INT64})

    got = sorted((r.user_id, r[WINDOW_END].minute, r.a, r.b, r[LATEST]) for r in merged.collect())
    assert got == [
        ("u1", 10, 1, 10, False),  # a as of 00:05
        ("u1", 15, 2, 11, False),  # both sides at 00:15: one row
        ("u1", 15, 2, 11, True),  # u1's newest (the table's 00:30 lies after the range)
        ("u3", 20, 0, 7, False),  # a before its first value: its empty value
        ("u3", 20, 0, 7, True),
    ]  # u2 has no row in the range
