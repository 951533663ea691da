"""Map features (`DType.COUNT_MAP`: histogram, top_frequent) and list features through every store.

- Feast's type for a map is its Map (string -> Value), each count an int64 Value; the writers encode a map
  given as a dict or as the (key, count) pairs pyarrow and Spark give, a null as a missing value.
- Written by our writers to SQLite and a real Redis, Feast's `get_online_features` returns dicts (and lists),
  `online_features` a column of dicts, and the HTTP server (`features serve`) JSON objects.
- Where a key has no value (online, or no change point before t offline), a map reads as {} and a count as 0:
  the served model, training sets through Feast's `get_historical_features` and through the Spark join.

Map values are written here by hand: no engine output is needed to check the stores.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import redis_server as redis_fixtures
from feast import FeatureStore
from feast.protos.feast.types.Value_pb2 import Map
from feast.protos.feast.types.Value_pb2 import Value as ValueProto
from online_repos import SOURCE, STORES, T0, T1, make_repo, read, writer

from features import DataError, Entity, Feature, FeatureGroup, Hop, agg
from features.ml.model import FeatureModel
from features.pipelines.verify import same
from features.spec import DType
from features.spec.aggregations import Empty
from features.stores.feast_codec import encode_values, resp_values
from features.stores.feast_objects import feast_type, feast_value_type
from features.stores.feature_refs import FeatureColumn, fill_empty
from features.stores.serving import online_features

redis_server = redis_fixtures.redis_server  # the session's real Redis (a fixture)

HOP = Hop("1h", every="5m")
MAPS = FeatureGroup(
    name="user_maps",
    entity=Entity("user", join_keys=["user_id"]),
    source=SOURCE,
    features=[
        Feature("statuses_1h", agg.histogram("status"), window=HOP),
        Feature("top_merchants_1h", agg.top_frequent("merchant_id", 2), window=HOP),
        Feature("txn_count_1h", agg.count(), window=HOP),
        Feature("last_amounts_1h", agg.last_k("amount", 3), window=HOP),
        Feature("top_amounts_1h", agg.top_k("amount", 2), window=HOP),
        Feature("first_statuses_1h", agg.first_k("status", 2), window=HOP),
    ],
)
KEYS = ["u1", "u2", "ü-3 😀", "nobody"]


def map_rows() -> pd.DataFrame:
    """A map as a dict, as pyarrow's (key, count) pairs (list and array), empty and null; lists beside them."""
    return pd.DataFrame(
        {
            "user_id": KEYS[:3],
            "window_end": [T0, T0, T1],
            "statuses_1h": [{"OK": 3, "FAILED": np.int64(1)}, [("é😀", 2)], {}],
            "top_merchants_1h": [np.array([("7", 5), ("12", 2**40)], dtype=object), None, [("-3", 1)]],
            "txn_count_1h": [4, 2, 0],
            "last_amounts_1h": [np.array([9.5, 1.0]), None, []],
            "top_amounts_1h": [[9.5, 1.0], [0.5], []],
            "first_statuses_1h": [["OK", "FAILED"], None, ["x"]],
        }
    )


# What Feast returns for KEYS: "nobody" has no row, u2's top_merchants is null.
ONLINE = {
    "statuses_1h": [{"OK": 3, "FAILED": 1}, {"é😀": 2}, {}, None],
    "top_merchants_1h": [{"7": 5, "12": 2**40}, None, {"-3": 1}, None],
    "txn_count_1h": [4, 2, 0, None],
    "last_amounts_1h": [[9.5, 1.0], None, [], None],
    "top_amounts_1h": [[9.5, 1.0], [0.5], [], None],
    "first_statuses_1h": [["OK", "FAILED"], None, ["x"], None],
}


@pytest.fixture
def repo(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """An applied repo with MAPS on the store named by the test's parameter; Redis keys deleted afterwards."""
    server = request.getfixturevalue("redis_server") if request.param == "redis" else None
    root = make_repo(tmp_path / "repo", request.param, server, groups=(MAPS,))
    yield root
    if server is not None:
        server.delete_project(FeatureStore(repo_path=str(root)).project)


# ---------------------------------------------------------------------------------------------------------
# Feast's type and value format


def test_a_count_map_is_feasts_map() -> None:
    from feast import ValueType
    from feast.types import Map as FeastMap

    assert feast_type(DType.COUNT_MAP) == FeastMap
    assert feast_value_type(DType.COUNT_MAP) is ValueType.MAP


def test_map_values_are_feasts_map_protos() -> None:
    from feast.type_map import feast_value_type_to_python_type

    column = pd.Series(
        [{"OK": 3, "é": np.int64(-1)}, [("a", 1), ("b", 2**62)], np.array([("7", 2)], dtype=object), {}, None, np.nan],
        dtype=object,
    )
    want = [{"OK": 3, "é": -1}, {"a": 1, "b": 2**62}, {"7": 2}, {}]
    encoded = encode_values(column, DType.COUNT_MAP, "feature 'm'", text=True, num=True)
    for got, expected in zip(encoded.values, want, strict=False):
        proto = ValueProto(map_val=Map(val={k: ValueProto(int64_val=v) for k, v in expected.items()}))
        assert ValueProto.FromString(got) == proto
        assert feast_value_type_to_python_type(ValueProto.FromString(got)) == expected
    assert encoded.values[4:] == [b"", b""]  # null: Feast's empty Value, read back as None
    assert encoded.values[3] == ValueProto(map_val=Map()).SerializeToString() != b""  # {} is a value, not a null
    # SQL stores: Feast's extract_text_and_num gives neither for a map.
    assert encoded.text == [None] * 6 and encoded.num == [None] * 6
    resp = resp_values(column, DType.COUNT_MAP, "feature 'm'")
    assert resp.data == b"".join(b"$%d\r\n%b\r\n" % (len(v), v) for v in encoded.values)


@pytest.mark.parametrize("value", ["OK", 3, {"OK": "many"}, [("OK",)], {"OK": True}])
def test_a_value_that_is_no_count_map_is_a_data_error(value: object) -> None:
    with pytest.raises(DataError, match="feature 'm'"):
        encode_values(pd.Series([value], dtype=object), DType.COUNT_MAP, "feature 'm'")


# ---------------------------------------------------------------------------------------------------------
# Online: our writers, Feast's reads, the served model


@pytest.mark.parametrize("repo", STORES, indirect=True)
def test_maps_and_lists_read_back_through_feast(repo: Path) -> None:
    assert writer(repo, MAPS).write(map_rows()) == 3
    got = read(repo, MAPS, [{"user_id": k} for k in KEYS])
    assert {name: got[name] for name in ONLINE} == ONLINE
    frame = online_features(repo, MAPS, KEYS)
    assert frame["statuses_1h"].tolist() == ONLINE["statuses_1h"]
    assert frame["top_merchants_1h"].tolist() == ONLINE["top_merchants_1h"]


def test_the_served_model_fills_empty_maps(tmp_path: Path) -> None:
    """A model's online features: dicts, {} and 0 where the key has no row; a spec logged before maps existed
    (`empty_is_zero`) still loads."""
    root = make_repo(tmp_path / "repo", "sqlite", groups=(MAPS,))
    writer(root, MAPS).write(map_rows())
    specs = [
        {"group": MAPS.name, "feature": name, "column": name, "dtype": dtype.value, "empty": empty.name}
        for name, dtype, empty in [
            ("statuses_1h", DType.COUNT_MAP, Empty.EMPTY_MAP),
            ("top_merchants_1h", DType.COUNT_MAP, Empty.EMPTY_MAP),
            ("last_amounts_1h", DType.FLOAT64_LIST, Empty.NULL),
        ]
    ]
    specs.append(  # as models logged by earlier versions recorded it
        {
            "group": MAPS.name,
            "feature": "txn_count_1h",
            "column": "txn_count_1h",
            "dtype": "int64",
            "empty_is_zero": True,
        }
    )
    model = FeatureModel(object(), specs, [], ["user_id"], str(root))
    frame = model.feature_frame(pd.DataFrame({"user_id": KEYS}))
    assert frame["statuses_1h"].tolist() == [{"OK": 3, "FAILED": 1}, {"é😀": 2}, {}, {}]
    assert frame["top_merchants_1h"].tolist() == [{"7": 5, "12": 2**40}, {}, {"-3": 1}, {}]
    assert frame["last_amounts_1h"].tolist() == [[9.5, 1.0], None, [], None]
    assert frame["txn_count_1h"].tolist() == [4, 2, 0, 0]


def test_http_answers_a_map_as_a_json_object(tmp_path: Path) -> None:
    from feature_servers import start_server, stop_server

    root = make_repo(tmp_path / "repo", "sqlite", groups=(MAPS,))
    writer(root, MAPS).write(map_rows())
    server = start_server(root)
    try:
        got = server.online(MAPS, {"user_id": KEYS})
    finally:
        stop_server(server)
    assert {name: got[name] for name in ONLINE} == ONLINE


# ---------------------------------------------------------------------------------------------------------
# Empty windows and comparisons


def test_fill_empty_gives_dicts_and_empty_maps() -> None:
    frame = pd.DataFrame(
        {
            "m": [[("OK", np.int64(2))], {"a": 1}, None, np.nan, np.array([("b", 3)], dtype=object), []],
            "n": [1, 2, None, None, 3, 0],
        }
    )
    columns = [FeatureColumn("m", DType.COUNT_MAP, Empty.EMPTY_MAP), FeatureColumn("n", DType.INT64, Empty.ZERO)]
    out = fill_empty(frame, columns)
    assert out["m"].tolist() == [{"OK": 2}, {"a": 1}, {}, {}, {"b": 3}, {}]
    assert all(type(v) is int for m in out["m"] for v in m.values())
    assert out["m"][2] is not out["m"][3]  # each row its own dict
    assert out["n"].tolist() == [1, 2, 0, 0, 3, 0]


def test_verify_compares_maps_as_dicts() -> None:
    assert same({"a": 1, "b": 2}, {"b": 2, "a": 1})
    assert same({"a": 1}, [("a", np.int64(1))])
    assert same({}, {}) and not same({}, None) and same(None, None)
    assert not same({"a": 1}, {"a": 2}) and not same({"a": 1}, {"a": 1, "b": 0})


# ---------------------------------------------------------------------------------------------------------
# Offline: a table Spark wrote, read by Feast and by the Spark join


def _offline_rows(spark):
    from pyspark.sql import functions as F

    from features.spec.definitions import LATEST

    schema = (
        "user_id string, window_end timestamp, statuses_1h map<string,bigint>, top_merchants_1h map<string,bigint>, "
        "txn_count_1h bigint, last_amounts_1h array<double>, top_amounts_1h array<double>, "
        "first_statuses_1h array<string>"
    )
    t0, t1 = T0.to_pydatetime(), T1.to_pydatetime()
    rows = [
        ("u1", t0, {"OK": 3, "FAILED": 1}, {"7": 5}, 4, [9.5, 1.0], [9.5, 1.0], ["OK", "FAILED"]),
        ("u1", t1, {"OK": 1}, {}, 1, [2.0], [2.0], ["OK"]),
        ("u2", t0, {}, None, 0, [], [], []),
    ]
    return spark.createDataFrame(rows, schema).withColumn(LATEST, F.lit(False))


@pytest.mark.spark
def test_training_sets_read_maps_from_the_offline_table(spark, feast_repo) -> None:
    from features.ml.training import training_set
    from features.repo import Repo
    from features.stores.offline import read_pandas, replace_range

    repo = Repo.load(feast_repo([MAPS]))
    table = repo.offline_path(MAPS)
    replace_range(
        spark, _offline_rows(spark), table, datetime(2024, 1, 1, tzinfo=UTC), datetime(2024, 1, 2, tzinfo=UTC)
    )
    stored = read_pandas(table).sort_values(["user_id", "window_end"])
    assert stored["statuses_1h"].tolist() == [{"OK": 3, "FAILED": 1}, {"OK": 1}, {}]
    assert stored["top_merchants_1h"].tolist() == [{"7": 5}, {}, None]

    before = T0 - pd.Timedelta(microseconds=1)
    rows = pd.DataFrame(
        {
            "user_id": ["u1", "u1", "u1", "u2", "nobody"],
            "event_timestamp": [T1, before, T0, T1, T1],
            "label": [1, 0, 1, 0, 1],
        }
    )
    want = {
        "statuses_1h": [{"OK": 1}, {}, {"OK": 3, "FAILED": 1}, {}, {}],
        "top_merchants_1h": [{}, {}, {"7": 5}, {}, {}],  # u2's null reads as the empty window too
        "txn_count_1h": [1, 0, 4, 0, 0],
        "last_amounts_1h": [[2.0], None, [9.5, 1.0], [], None],
        "top_amounts_1h": [[2.0], None, [9.5, 1.0], [], None],
        "first_statuses_1h": [["OK"], None, ["OK", "FAILED"], [], None],
    }
    through_feast = training_set(rows, [MAPS.name], repo, log_lineage=False)
    assert through_feast["label"].tolist() == rows["label"].tolist()
    assert {name: through_feast[name].tolist() for name in want} == want
    # Asked for in Spark: the dicts stay maps (Spark would infer a struct from them).
    as_spark = training_set(rows, [MAPS.name], repo, log_lineage=False, spark=spark)
    assert dict(as_spark.dtypes)["top_merchants_1h"] == "map<string,bigint>"
    assert [r["statuses_1h"] for r in as_spark.select("statuses_1h").collect()] == want["statuses_1h"]
    in_spark = training_set(spark.createDataFrame(rows), [MAPS.name], repo, log_lineage=False)
    assert dict(in_spark.dtypes)["statuses_1h"] == "map<string,bigint>"
    joined = in_spark.toPandas()
    assert joined["label"].tolist() == rows["label"].tolist()
    got = {name: [v.tolist() if isinstance(v, np.ndarray) else v for v in joined[name]] for name in want}
    assert got == want
