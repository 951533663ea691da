"""The values request-time features read (docs/semantics.md, Request-time features) through every store:
`last_event_time` (a timestamp, whole seconds) and `distinct_values` (a list, [] when empty).

- Feast's types: `UnixTimestamp` and `Array(Int64)` / `Array(String)`.
- Written by our writers to SQLite and a real Redis, Feast's `get_online_features` returns the same instant and
  the same list (the HTTP server: epoch seconds and JSON arrays); an empty set stays [] (not null), a key without
  a row reads as null from Feast and as [] from the served model and `fill_empty`.
- The offline table read for training sets (Feast's point-in-time join and the Spark join): the values at each
  label's time, [] and null where the key had no row yet.

The values are written here by hand: the engines' values are checked against the reference in
tests/test_batch_reference.py, tests/test_kernel.py and tests/test_backfill_feast.py.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import redis_server as redis_fixtures
from feast import FeatureStore
from online_repos import SOURCE, STORES, T0, T1, make_repo, read, writer

from features import Entity, Feature, FeatureGroup, Hop, Lifetime, agg
from features.ml.model import FeatureModel
from features.spec import DType
from features.spec.aggregations import Empty
from features.stores.feast_objects import feast_type
from features.stores.feature_refs import FeatureColumn, fill_empty

redis_server = redis_fixtures.redis_server  # the session's real Redis (a fixture)

HOP = Hop("1h", every="5m")
REQUEST = FeatureGroup(
    name="user_request",
    entity=Entity("user", join_keys=["user_id"]),
    source=SOURCE,
    features=[
        Feature("last_seen", agg.last_event_time(), window=Lifetime(every="5m")),
        Feature("merchant_set_1h", agg.distinct_values("merchant_id"), window=HOP),
        Feature("status_set_1h", agg.distinct_values("status"), window=HOP),
        Feature("txn_count_1h", agg.count(), window=HOP),
    ],
)
KEYS = ["u1", "u2", "ü-3 😀", "nobody"]
SEEN = pd.Timestamp("2023-12-31 23:58:07", tz="UTC")


def rows() -> pd.DataFrame:
    """As the engines hand them to the writers: times as UTC datetimes, sets as lists or arrays."""
    return pd.DataFrame(
        {
            "user_id": KEYS[:3],
            "window_end": [T0, T0, T1],
            "last_seen": pd.Series([SEEN, SEEN - pd.Timedelta(days=400), None], dtype="datetime64[us, UTC]"),
            "merchant_set_1h": [np.array([3, 11, 2**62]), [], []],
            "status_set_1h": [["FAILED", "OK"], np.array(["é😀"], dtype=object), []],
            "txn_count_1h": [4, 1, 0],
        }
    )


def _utc(value: object) -> pd.Timestamp | None:
    if value is None:
        return None
    ts = pd.Timestamp(value)
    return ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")


@pytest.fixture
def repo(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """An applied repo with REQUEST on the store named by the test's parameter; Redis keys deleted afterwards."""
    server = request.getfixturevalue("redis_server") if request.param == "redis" else None
    root = make_repo(tmp_path / "repo", request.param, server, groups=(REQUEST,))
    yield root
    if server is not None:
        server.delete_project(FeatureStore(repo_path=str(root)).project)


def test_feast_types_are_a_timestamp_and_arrays() -> None:
    from feast.types import Array, Int64, String, UnixTimestamp

    types = REQUEST.output_types(SOURCE.schema)
    assert types["last_seen"] is DType.TIMESTAMP
    assert types["merchant_set_1h"] is DType.INT64_LIST and types["status_set_1h"] is DType.STRING_LIST
    assert feast_type(types["last_seen"]) == UnixTimestamp
    assert feast_type(types["merchant_set_1h"]) == Array(Int64)
    assert feast_type(types["status_set_1h"]) == Array(String)


@pytest.mark.parametrize("repo", STORES, indirect=True)
def test_times_and_sets_read_back_through_feast(repo: Path) -> None:
    assert writer(repo, REQUEST).write(rows()) == 3
    got = read(repo, REQUEST, [{"user_id": k} for k in KEYS])
    assert [_utc(v) for v in got["last_seen"]] == [SEEN, SEEN - pd.Timedelta(days=400), None, None]
    assert got["merchant_set_1h"] == [[3, 11, 2**62], [], [], None]  # [] is a value; "nobody" has no row
    assert got["status_set_1h"] == [["FAILED", "OK"], ["é😀"], [], None]
    assert 11 in got["merchant_set_1h"][0] and 12 not in got["merchant_set_1h"][0]  # membership, exact


def test_the_served_model_and_fill_empty_give_an_empty_set_where_a_key_has_no_row(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "repo", "sqlite", groups=(REQUEST,))
    writer(root, REQUEST).write(rows())
    specs = [
        {"group": REQUEST.name, "feature": f.name, "column": f.name, "dtype": dtype.value, "empty": empty.name}
        for f, dtype, empty in [
            (REQUEST.feature("last_seen"), DType.TIMESTAMP, Empty.NULL),
            (REQUEST.feature("merchant_set_1h"), DType.INT64_LIST, Empty.EMPTY_LIST),
        ]
    ]
    model = FeatureModel(object(), specs, [], ["user_id"], str(root))
    frame = model.feature_frame(pd.DataFrame({"user_id": KEYS}))
    assert frame["merchant_set_1h"].tolist() == [[3, 11, 2**62], [], [], []]
    assert [_utc(v) for v in frame["last_seen"]][:2] == [SEEN, SEEN - pd.Timedelta(days=400)]
    assert frame["last_seen"].iloc[2:].isna().all()

    frame = pd.DataFrame({"s": [np.array(["a", "b"], dtype=object), None, np.nan, []]})
    out = fill_empty(frame, [FeatureColumn("s", DType.STRING_LIST, Empty.EMPTY_LIST)])
    assert out["s"].tolist() == [["a", "b"], [], [], []]
    assert out["s"][1] is not out["s"][2]  # each row its own list
    lists = fill_empty(frame, [FeatureColumn("s", DType.STRING_LIST, Empty.NULL)])  # last_k and the like
    assert lists["s"].tolist() == [["a", "b"], None, None, []]


# ---------------------------------------------------------------------------------------------------------
# Offline: a table Spark wrote, read by Feast and by the Spark join


def _offline_rows(spark):
    from pyspark.sql import functions as F

    from features.stores.offline import LATEST

    schema = (
        "user_id string, window_end timestamp, last_seen timestamp, merchant_set_1h array<bigint>, "
        "status_set_1h array<string>, txn_count_1h bigint"
    )
    t0, t1 = T0.to_pydatetime(), T1.to_pydatetime()
    seen = SEEN.to_pydatetime()
    data = [
        ("u1", t0, seen, [3, 11], ["OK"], 2),
        ("u1", t1, seen + (t1 - t0), [], [], 0),
        ("u2", t0, seen, [7], ["FAILED", "OK"], 2),
    ]
    return spark.createDataFrame(data, schema).withColumn(LATEST, F.lit(False))


@pytest.mark.spark
def test_training_sets_read_times_and_sets_from_the_offline_table(spark, feast_repo) -> None:
    from features.ml.training import training_set
    from features.repo import Repo
    from features.stores.offline import replace_range

    repo = Repo.load(feast_repo([REQUEST]))
    table = repo.offline_path(REQUEST)
    replace_range(
        spark, _offline_rows(spark), table, datetime(2024, 1, 1, tzinfo=UTC), datetime(2024, 1, 2, tzinfo=UTC)
    )
    before = T0 - pd.Timedelta(microseconds=1)
    labels = pd.DataFrame(
        {
            "user_id": ["u1", "u1", "u1", "u2", "nobody"],
            "event_timestamp": [T1, before, T0, T1, T1],
            "label": [1, 0, 1, 0, 1],
        }
    )
    seen = SEEN
    want = {
        "last_seen": [seen + (T1 - T0), None, seen, seen, None],
        "merchant_set_1h": [[], [], [3, 11], [7], []],  # before a key's first row, and an unknown key: []
        "status_set_1h": [[], [], ["OK"], ["FAILED", "OK"], []],
        "txn_count_1h": [0, 0, 2, 2, 0],
    }

    def values(frame: pd.DataFrame) -> dict[str, list]:
        out = {}
        for name in want:
            column = [v.tolist() if isinstance(v, np.ndarray) else v for v in frame[name]]
            out[name] = (
                [None if v is None or v is pd.NaT else _utc(v) for v in column] if name == "last_seen" else column
            )
        return out

    through_feast = training_set(labels, [REQUEST.name], repo, log_lineage=False)
    assert through_feast["label"].tolist() == labels["label"].tolist()
    assert values(through_feast) == want
    # Asked for in Spark: a column of empty lists keeps its element type (Spark could infer none).
    as_spark = training_set(labels, [REQUEST.name], repo, log_lineage=False, spark=spark)
    assert dict(as_spark.dtypes)["merchant_set_1h"] == "array<bigint>"
    assert values(as_spark.toPandas()) == want
    in_spark = training_set(spark.createDataFrame(labels), [REQUEST.name], repo, log_lineage=False)
    assert dict(in_spark.dtypes)["status_set_1h"] == "array<string>"
    joined = in_spark.toPandas()
    assert joined["label"].tolist() == labels["label"].tolist()
    assert values(joined) == want


def test_verify_compares_times_as_instants() -> None:
    from features.pipelines.verify import same

    aware = datetime(2026, 1, 2, 23, 57, 9, tzinfo=UTC)  # as Feast's online read gives it
    assert same(aware, pd.Timestamp("2026-01-02 23:57:09"))  # as the offline table gives it: naive UTC
    assert same(aware, pd.Timestamp("2026-01-03 00:57:09", tz="Europe/Paris"))
    assert not same(aware, pd.Timestamp("2026-01-02 23:57:10")) and not same(aware, None)
    assert same([3, 11], np.array([3, 11])) and not same([], None) and not same([3], [3, 11])


def test_http_answers_times_and_sets(tmp_path: Path) -> None:
    from feature_servers import start_server, stop_server

    root = make_repo(tmp_path / "repo", "sqlite", groups=(REQUEST,))
    writer(root, REQUEST).write(rows())
    server = start_server(root)
    try:
        got = server.online(REQUEST, {"user_id": KEYS})
    finally:
        stop_server(server)
    assert got["merchant_set_1h"] == [[3, 11, 2**62], [], [], None]
    assert got["status_set_1h"] == [["FAILED", "OK"], ["é😀"], [], None]
    seconds = int(SEEN.timestamp())
    assert got["last_seen"] == [seconds, seconds - 400 * 86_400, None, None]  # Feast's JSON: epoch seconds
