"""The fast online writers on a real Redis (and SQLite side by side): Feast's own storage format, read back
through `FeatureStore.get_online_features`, and the event-time guard under replays, out-of-order batches and
concurrent writers.

The Spark test at the end backfills generated events into a Redis-backed repo and compares what Feast serves
with the brute-force reference.
"""

from __future__ import annotations

import pickle
import random
import sqlite3
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import redis_server as redis_fixtures
from feast import FeatureStore
from feast.infra.key_encoding_utils import serialize_entity_key
from feast.protos.feast.types.EntityKey_pb2 import EntityKey as EntityKeyProto
from feast.protos.feast.types.Value_pb2 import BoolList, DoubleList, Int64List, StringList
from feast.protos.feast.types.Value_pb2 import Value as ValueProto
from online_repos import (
    CARD_MERCHANT,
    EVERY_TYPE_KEYS,
    EXPECTED_EVERY_TYPE,
    SOURCE,
    STORES,
    T0,
    T1,
    T2,
    USER,
    USER_DAILY,
    count_rows,
    every_type_rows,
    make_repo,
    read,
    writer,
)
from redis_server import RedisServer
from repo_yaml import redis_online, write_feature_store_yaml

from features import ConfigError, DataError
from features.spec import DType
from features.stores.feast_codec import INT64_TYPE, STRING_TYPE, encode_values, entity_keys, resp_values
from features.stores.online import RedisOnlineWriter, online_writer

redis_server = redis_fixtures.redis_server  # the session's real Redis (a fixture)


@pytest.fixture
def repo(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """An applied repo on the store named by the test's `kind` parameter; Redis keys deleted afterwards."""
    kind = request.param
    server = request.getfixturevalue("redis_server") if kind == "redis" else None
    root = make_repo(tmp_path / "repo", kind, server)
    yield root
    if server is not None:
        server.delete_project(FeatureStore(repo_path=str(root)).project)


both_stores = pytest.mark.parametrize("repo", STORES, indirect=True)
redis_only = pytest.mark.parametrize("repo", ["redis"], indirect=True)


def _users(root: Path, ids: list[str], group=USER) -> dict[str, list]:
    return read(root, group, [{"user_id": i} for i in ids])


# ---------------------------------------------------------------------------------------------------------
# Feast's format, byte for byte


def test_entity_keys_are_feasts_serialization() -> None:
    from feast.value_type import ValueType

    assert (ValueType.STRING.value, ValueType.INT64.value) == (STRING_TYPE, INT64_TYPE)
    strings = ["u1", "", "ü-3 😀", "x" * 300, "u1"]
    ints = [0, -1, 2**63 - 1, -(2**63), 7]
    rows = pd.DataFrame({"user_id": [*strings, "z"], "card_id": ["c"] * 6, "merchant_id": [*ints, 1]})
    string, integer = DType.STRING, DType.INT64
    cases = [{"user_id": string}, {"merchant_id": integer}, {"user_id": string, "merchant_id": integer}]
    for join_keys in [*cases, {"merchant_id": integer, "card_id": string}]:
        got = entity_keys(rows, join_keys, suffix=b"proj")
        assert entity_keys(rows, join_keys, suffix=b"proj", resp=True) == [b"$%d\r\n%b\r\n" % (len(k), k) for k in got]
        for i, key in enumerate(got):
            values = [
                ValueProto(string_val=rows.loc[i, k])
                if t is DType.STRING
                else ValueProto(int64_val=int(rows.loc[i, k]))
                for k, t in join_keys.items()
            ]
            proto = EntityKeyProto(join_keys=list(join_keys), entity_values=values)
            assert key == serialize_entity_key(proto, entity_key_serialization_version=3) + b"proj", (join_keys, i)


@pytest.mark.parametrize(
    ("dtype", "values", "proto"),
    [
        (DType.INT64, [0, 1, -1, 127, 128, 300, 2**63 - 1, -(2**63)], lambda v: ValueProto(int64_val=v)),
        (DType.FLOAT64, [0.0, -0.0, 1.5, -1e300, 5e-324, float("inf")], lambda v: ValueProto(double_val=v)),
        (DType.STRING, ["", "a", "é" * 70, "😀", "x" * 20_000], lambda v: ValueProto(string_val=v)),
        (DType.BOOL, [True, False], lambda v: ValueProto(bool_val=v)),
        (DType.INT64_LIST, [[], [1, -1]], lambda v: ValueProto(int64_list_val=Int64List(val=v))),
        (DType.FLOAT64_LIST, [[], [0.5]], lambda v: ValueProto(double_list_val=DoubleList(val=v))),
        (DType.STRING_LIST, [[], ["a", ""]], lambda v: ValueProto(string_list_val=StringList(val=v))),
        (DType.BOOL_LIST, [[], [True]], lambda v: ValueProto(bool_list_val=BoolList(val=v))),
    ],
    ids=lambda x: x.value if isinstance(x, DType) else "",
)
def test_values_are_protobufs_serialization(dtype: DType, values: list, proto) -> None:
    column = pd.Series([*values, None], dtype=object)
    encoded = encode_values(column, dtype, "feature", text=True, num=True)
    assert encoded.values == [proto(v).SerializeToString() for v in values] + [b""]
    # What the Redis writer sends: the same bytes as Redis protocol bulk strings, built column-wise.
    resp = resp_values(column, dtype, "feature")
    assert resp.data == b"".join(b"$%d\r\n%b\r\n" % (len(v), v) for v in encoded.values)
    assert [resp.slice(i, i + 1) for i in range(len(column))] == [
        b"$%d\r\n%b\r\n" % (len(v), v) for v in encoded.values
    ]
    assert encoded.text[-1] is None and encoded.num[-1] is None
    if dtype in (DType.INT64, DType.FLOAT64, DType.STRING, DType.BOOL):
        from feast.infra.online_stores.helpers import extract_text_and_num

        want = [extract_text_and_num(proto(v), True) for v in values]
        assert list(zip(encoded.text[:-1], encoded.num[:-1], strict=True)) == want


def _feast_rows(rows: pd.DataFrame) -> list[tuple]:
    """The rows as Feast's `online_write_batch` takes them (its own proto conversion)."""
    from features.stores.feast_codec import proto_converter

    types = USER.output_types(SOURCE.schema)
    data = []
    for record in rows.to_dict("records"):
        key = EntityKeyProto(join_keys=["user_id"], entity_values=[ValueProto(string_val=record["user_id"])])
        values = {f.name: proto_converter(types[f.name], f.name)(record[f.name]) for f in USER.features}
        data.append((key, values, record["window_end"].to_pydatetime(), None))
    return data


@redis_only
def test_redis_hashes_equal_what_feast_writes(repo: Path, redis_server: RedisServer, tmp_path: Path) -> None:
    """Same rows, once through Feast's own online_write_batch (another project), once through the writer."""
    rows = every_type_rows()
    writer(repo, USER).write(rows)
    theirs = make_repo(tmp_path / "feast", "redis", redis_server, groups=(USER,))
    store = FeatureStore(repo_path=str(theirs))
    try:
        store._get_provider().online_write_batch(
            store.config, store.get_feature_view(USER.name), _feast_rows(rows), None
        )
        client = redis_server.client()
        ours_project, their_project = FeatureStore(repo_path=str(repo)).project.encode(), store.project.encode()
        for key in entity_keys(rows, {"user_id": DType.STRING}):
            ours, their = client.hgetall(key + ours_project), client.hgetall(key + their_project)
            assert ours and ours == their
    finally:
        redis_server.delete_project(store.project)


def test_sqlite_rows_equal_what_feast_writes(tmp_path: Path) -> None:
    rows = every_type_rows()
    ours = make_repo(tmp_path / "ours", "sqlite", groups=(USER,))
    theirs = make_repo(tmp_path / "theirs", "sqlite", groups=(USER,))
    writer(ours, USER).write(rows)
    store = FeatureStore(repo_path=str(theirs))
    store._get_provider().online_write_batch(store.config, store.get_feature_view(USER.name), _feast_rows(rows), None)

    def table(root: Path) -> list[tuple]:
        name = f"{FeatureStore(repo_path=str(root)).project}_{USER.name}"
        with sqlite3.connect(root / "data" / "online_store.db") as conn:
            query = f'SELECT entity_key, feature_name, value, value_text, event_ts FROM "{name}" ORDER BY 1, 2'
            return conn.execute(query).fetchall()

    assert table(ours) == table(theirs)
    assert len(table(ours)) == len(rows) * len(USER.features)


# ---------------------------------------------------------------------------------------------------------
# Read back through Feast


@both_stores
def test_every_type_and_null_reads_back_through_feast(repo: Path) -> None:
    assert writer(repo, USER).write(every_type_rows()) == 4
    got = _users(repo, EVERY_TYPE_KEYS)
    assert got["user_id"] == EVERY_TYPE_KEYS
    for name, want in EXPECTED_EVERY_TYPE.items():
        assert got[name] == want, name
    assert str(got["amount_max"][3]) == "-0.0"


@both_stores
def test_composite_keys_and_two_views_of_one_key(repo: Path) -> None:
    writer(repo, USER).write(count_rows(T1, {"u1": 5, "u2": 6}))
    writer(repo, USER_DAILY).write(count_rows(T0, {"u1": 50}, USER_DAILY))  # same hash in Redis, older time
    rows = pd.DataFrame(
        {
            "card_id": ["c1", "c1", "c2"],
            "merchant_id": [7, 8, 7],
            "window_end": [T0] * 3,
            "txn_count": [1, 2, 3],
            "last_status": ["OK", "FAILED", None],
        }
    )
    writer(repo, CARD_MERCHANT).write(rows)
    assert _users(repo, ["u1", "u2"])["txn_count"] == [5, 6]
    assert _users(repo, ["u1", "u2"], USER_DAILY)["txn_count_1d"] == [50, None]
    keys = [
        {"card_id": "c2", "merchant_id": 7},
        {"merchant_id": 8, "card_id": "c1"},
        {"card_id": "c2", "merchant_id": 8},
    ]
    got = read(repo, CARD_MERCHANT, keys)
    assert got["txn_count"] == [3, 2, None]
    assert got["last_status"] == [None, "FAILED", None]


@both_stores
def test_feast_returns_the_window_end_as_event_time(repo: Path) -> None:
    rows = count_rows(T2, {"u1": 1})
    rows["window_end"] = rows["window_end"].dt.tz_localize(None)  # naive is UTC
    writer(repo, USER).write(rows)
    store = FeatureStore(repo_path=str(repo))
    response = store.get_online_features(features=["user_transactions:txn_count"], entity_rows=[{"user_id": "u1"}])
    assert response.to_dict(include_event_timestamps=True)["txn_count__ts"] == [int(T2.timestamp())]


# ---------------------------------------------------------------------------------------------------------
# Event-time order: an older value never replaces a newer one


@both_stores
def test_older_write_never_replaces_a_newer_value(repo: Path) -> None:
    w = writer(repo, USER)
    w.write(count_rows(T1, {"u1": 2, "u2": 20}))
    w.write(count_rows(T0, {"u1": 1, "u2": 10}))  # out of order: an older change point arrives late
    assert _users(repo, ["u1", "u2"])["txn_count"] == [2, 20]
    w.write(count_rows(T2, {"u1": 3}))  # newer: replaces
    w.write(count_rows(T1, {"u1": 2, "u2": 21}))  # replay of T1 with a corrected value: the same time wins
    assert _users(repo, ["u1", "u2"])["txn_count"] == [3, 21]


@both_stores
def test_a_writer_of_some_features_leaves_the_others_as_they_are(repo: Path) -> None:
    """A backfill that computed some features writes those alone (features.pipelines.backfill)."""
    full = writer(repo, USER)
    rows = count_rows(T1, {"u1": 2, "u2": 20})
    rows["amount_sum"] = [5.0, 50.0]
    full.write(rows)
    again = count_rows(T1, {"u1": 7, "u2": 70})
    again["amount_sum"] = [6.0, 60.0]
    full.only(["amount_sum"]).write(again)
    got = _users(repo, ["u1", "u2"])
    assert got["txn_count"] == [2, 20] and got["amount_sum"] == [6.0, 60.0]
    full.write(count_rows(T1, {"u1": 3, "u2": 30}))  # the whole writer is unchanged, on its own connection
    assert _users(repo, ["u1", "u2"])["txn_count"] == [3, 30]


@both_stores
def test_order_across_1970_and_within_a_second(repo: Path) -> None:
    """Event times before 1970 (negative seconds) and a microsecond apart still order correctly."""
    w = writer(repo, USER)
    before = pd.Timestamp("1969-12-31 23:58:20", tz="UTC")  # -100 s
    w.write(count_rows(before, {"u1": 1, "u2": 1}))
    w.write(count_rows(before + pd.Timedelta(seconds=50), {"u1": 2}))
    w.write(count_rows(before - pd.Timedelta(seconds=100), {"u1": 3, "u2": 3}))  # older: ignored
    w.write(count_rows(T0 + pd.Timedelta(microseconds=1), {"u2": 4}))
    w.write(count_rows(T0, {"u2": 5}))  # older by 1 us, in the same second
    got = _users(repo, ["u1", "u2"])["txn_count"]
    if w.parallel:  # Redis keeps microseconds
        assert got == [2, 4]
    else:  # Feast's SQLite store keeps whole seconds, so the same second counts as a replay: it wins
        assert got == [2, 5]


@both_stores
def test_within_one_batch_the_newest_row_of_a_key_wins(repo: Path) -> None:
    rows = pd.concat([count_rows(T2, {"u1": 3}), count_rows(T0, {"u1": 1}), count_rows(T1, {"u1": 2})])
    assert writer(repo, USER).write(rows) == 3
    assert _users(repo, ["u1"])["txn_count"] == [3]


def _history(seed: int, n_keys: int = 40, n_times: int = 12) -> pd.DataFrame:
    """Change points of many keys at many times; a value names its (key, time), so the newest is known."""
    rng = np.random.default_rng(seed)
    users = [f"u{i}" for i in range(n_keys)]
    rows = [
        (user, T0 + pd.Timedelta(minutes=5 * t) + pd.Timedelta(microseconds=int(rng.integers(0, 3))), i * 1000 + t)
        for i, user in enumerate(users)
        for t in sorted(rng.choice(n_times * 3, size=n_times, replace=False).tolist())
    ]
    frame = pd.DataFrame(rows, columns=["user_id", "window_end", "txn_count"])
    for feat in USER.features[1:]:
        frame[feat.name] = None
    return frame


def _newest(history: pd.DataFrame) -> dict[str, int]:
    newest = history.sort_values("window_end").groupby("user_id").tail(1)
    return dict(zip(newest["user_id"], newest["txn_count"], strict=True))


@both_stores
@pytest.mark.parametrize("seed", [1, 2])
def test_replayed_and_shuffled_batches_never_regress(repo: Path, seed: int) -> None:
    history = _history(seed)
    want = _newest(history)
    batches = [history.iloc[i : i + 37] for i in range(0, len(history), 37)]
    # Every batch twice (a replay), in random order, with rows shuffled inside each batch.
    order = [*batches, *batches]
    random.Random(seed).shuffle(order)
    w = writer(repo, USER)
    for batch in order:
        w.write(batch.sample(frac=1, random_state=seed))
    got = _users(repo, list(want))
    assert dict(zip(got["user_id"], got["txn_count"], strict=True)) == want


@both_stores
def test_a_batch_failing_half_way(repo: Path) -> None:
    """Big batches are encoded in parts. On SQLite a bad value in a late part leaves the store as it was (one
    transaction); on Redis earlier parts may be written, and writing the corrected batch again completes it."""
    w = writer(repo, USER)
    w.ROWS_PER_ENCODE = 10
    w.write(count_rows(T0, {f"u{i}": 1 for i in range(50)}))
    rows = count_rows(T1, {f"u{i}": 2 for i in range(50)})
    rows["txn_count"] = rows["txn_count"].astype(object)
    rows.loc[45, "txn_count"] = "not a count"
    with pytest.raises(DataError, match="feature 'txn_count'"):
        w.write(rows)
    got = _users(repo, [f"u{i}" for i in range(50)])["txn_count"]
    if w.parallel:  # Redis
        assert set(got) <= {1, 2}
    else:
        assert got == [1] * 50
    rows.loc[45, "txn_count"] = 2
    w.write(rows)
    assert _users(repo, [f"u{i}" for i in range(50)])["txn_count"] == [2] * 50


@redis_only
def test_concurrent_writers_keep_the_newest(repo: Path) -> None:
    """Four writers (as four Spark tasks would) write overlapping shuffled parts of a history at once."""
    history = _history(3, n_keys=200, n_times=10)
    want = _newest(history)
    prototype = writer(repo, USER)
    assert prototype.parallel
    errors: list[BaseException] = []

    def run(part: int) -> None:
        try:
            clone = pickle.loads(pickle.dumps(prototype))
            shuffled = history.sample(frac=1, random_state=part)
            for start in range(0, len(shuffled), 250):
                clone.write(shuffled.iloc[start : start + 250])
            clone.close()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(part,)) for part in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    got = _users(repo, list(want))
    assert dict(zip(got["user_id"], got["txn_count"], strict=True)) == want


@redis_only
def test_newer_values_written_by_feast_itself_are_kept(repo: Path) -> None:
    """The guard compares with the timestamps Feast's own writes leave (strictly newer wins there)."""
    store = FeatureStore(repo_path=str(repo))
    key = EntityKeyProto(join_keys=["user_id"], entity_values=[ValueProto(string_val="u1")])
    row = (key, {"txn_count": ValueProto(int64_val=2)}, T1.to_pydatetime(), None)
    store._get_provider().online_write_batch(store.config, store.get_feature_view(USER.name), [row], None)
    w = writer(repo, USER)
    w.write(count_rows(T0, {"u1": 1}))
    assert _users(repo, ["u1"])["txn_count"] == [2]
    w.write(count_rows(T2, {"u1": 3}))
    assert _users(repo, ["u1"])["txn_count"] == [3]


# ---------------------------------------------------------------------------------------------------------
# The Redis writer as an object: pickling, connections, settings, failures


@redis_only
def test_writer_is_picklable_and_connects_lazily(repo: Path) -> None:
    w = writer(repo, USER)
    assert isinstance(w, RedisOnlineWriter) and w.parallel
    w.write(count_rows(T0, {"u1": 1}))
    clone = pickle.loads(pickle.dumps(w))  # as sent to a Spark executor
    assert clone._client is None
    clone.write(count_rows(T1, {"u1": 2}))
    clone.close()
    w.close()
    assert _users(repo, ["u1"])["txn_count"] == [2]


@redis_only
def test_big_batch_spans_many_script_calls(repo: Path) -> None:
    w = writer(repo, USER)
    w.keys_per_call, w.ROWS_PER_ENCODE = 7, 100
    counts = {f"u{i}": i for i in range(1000)}
    assert w.write(count_rows(T0, counts)) == 1000
    got = _users(repo, list(counts))
    assert got["txn_count"] == list(counts.values())


@redis_only
def test_a_flushed_script_is_loaded_again(repo: Path) -> None:
    w = writer(repo, USER)
    w.write(count_rows(T0, {"u1": 1}))
    w._sha = "0" * 40  # as if the server had restarted and forgotten the script
    w.write(count_rows(T1, {"u1": 2}))
    assert _users(repo, ["u1"])["txn_count"] == [2]


def test_key_ttl_from_feature_store_yaml(redis_server: RedisServer, tmp_path: Path) -> None:
    root = make_repo(tmp_path / "repo", "redis", redis_server, groups=(USER,), key_ttl_seconds=3600)
    try:
        writer(root, USER).write(count_rows(T0, {"u1": 1}))
        [key] = entity_keys(pd.DataFrame({"user_id": ["u1"]}), {"user_id": DType.STRING})
        ttl = redis_server.client().ttl(key + FeatureStore(repo_path=str(root)).project.encode())
        assert 3500 < ttl <= 3600
    finally:
        redis_server.delete_project(FeatureStore(repo_path=str(root)).project)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_redis_is_a_config_error_with_the_fix() -> None:
    w = RedisOnlineWriter(f"127.0.0.1:{_free_port()}", "p", USER.name, {"user_id": DType.STRING}, {"c": DType.INT64})
    with pytest.raises(ConfigError, match=r"cannot use Redis at 127\.0\.0\.1:\d+.*Fix: start redis-server"):
        w.check_ready()


def test_redis_cluster_is_refused_clearly() -> None:
    with pytest.raises(ConfigError, match="redis_type: 'redis_cluster'"):
        RedisOnlineWriter("h:1", "p", "v", {"user_id": DType.STRING}, {"c": DType.INT64}, redis_type="redis_cluster")


@redis_only
def test_missing_column_and_null_key_are_data_errors(repo: Path) -> None:
    w = writer(repo, USER)
    with pytest.raises(DataError, match="'amount_sum'"):
        w.write(count_rows(T0, {"u1": 1}).drop(columns=["amount_sum"]))
    rows = count_rows(T0, {"u1": 1})
    rows["user_id"] = [None]
    with pytest.raises(DataError, match="join key 'user_id'"):
        w.write(rows)
    rows = count_rows(T0, {"u1": 1})
    rows["txn_count"] = [1.5]
    with pytest.raises(DataError, match="feature 'txn_count'"):
        w.write(rows)


@redis_only
def test_factory_picks_redis_from_the_repo(repo: Path) -> None:
    from features.repo import Repo

    w = online_writer(Repo.load(repo), USER, USER.output_types(SOURCE.schema))
    assert isinstance(w, RedisOnlineWriter)
    assert w.view_name == USER.name and w.project == FeatureStore(repo_path=str(repo)).project
    assert w.write(count_rows(T0, {}).iloc[0:0]) == 0


# ---------------------------------------------------------------------------------------------------------
# End to end: Spark backfill into Redis, read through Feast


@pytest.mark.spark
def test_backfill_into_redis_serves_the_reference_values(
    spark, redis_server: RedisServer, feast_repo_factory, tmp_path: Path
) -> None:
    from reference import reference_frame

    from features import Entity, EventSource, Feature, FeatureGroup, Hop, Lifetime, agg
    from features.demo import generate_transactions
    from features.pipelines.backfill import backfill_group
    from features.pipelines.options import BackfillOptions
    from features.repo import Repo

    # The range ends while events go on (they span 2026-01-01): every window holds values at the end.
    start, end = pd.Timestamp("2026-01-01", tz="UTC"), pd.Timestamp("2026-01-01 20:00", tz="UTC")
    source = EventSource("transactions", path="data/transactions", timestamp="event_ts")
    group = FeatureGroup(
        name="user_activity",
        entity=Entity("user", join_keys=["user_id"]),
        source=source,
        features=[
            Feature("failed_1h", agg.count(), window=Hop("1h", every="5m"), where="status = 'FAILED'"),
            Feature("amount_sum_1h", agg.sum("amount"), window=Hop("1h", every="5m")),
            Feature("amount_max_1h", agg.max("amount"), window=Hop("1h", every="5m")),  # null when empty
            Feature("merchants_6h", agg.approx_count_distinct("merchant_id"), window=Hop("6h", every="1h")),
            Feature("amount_p50_6h", agg.approx_percentile("amount", 0.5), window=Hop("6h", every="1h")),
            Feature("last_status", agg.last("status"), window=Lifetime(every="5m")),
            Feature("last_amounts", agg.last_k("amount", 3), window=Hop("1h", every="5m")),
        ],
    )
    events = generate_transactions(1_500, 12, start.to_pydatetime(), 1, seed=11)
    root = feast_repo_factory(tmp_path / "repo", [group], events, apply=False)
    project = RedisServer.project("bf")
    write_feature_store_yaml(root, project, redis_online(redis_server.connection_string))
    from features.pipelines.registration import apply

    apply(str(root))
    try:
        repo = Repo.load(root)

        def run(until: pd.Timestamp):  # the online path of `features backfill` (its validation is tested elsewhere)
            begin = start.to_pydatetime()
            options = BackfillOptions(progress=False, validate=False)
            return backfill_group(spark, repo, group, begin, until.to_pydatetime(), options)

        result = run(end)
        keys = sorted(events["user_id"].unique())
        assert result.online_rows == len(keys)
        want = reference_frame(events, group, [((k,), end) for k in keys])
        for feat in group.features:  # the values compared are values, not empty windows
            assert want[feat.name].map(lambda v: v is not None and v != 0).sum() >= 2, feat.name
        got = read(root, group, [{"user_id": k} for k in keys])
        _assert_online_matches(group, got, want)
        # An older range written again never moves a key back in time.
        run(start + pd.Timedelta("3h"))
        _assert_online_matches(group, read(root, group, [{"user_id": k} for k in keys]), want)
    finally:
        redis_server.delete_project(project)


def _assert_online_matches(group, got: dict[str, list], want: pd.DataFrame) -> None:
    from reference import percentile_ok

    from features.spec import AggKind

    problems = []
    for feat in group.features:
        kind = feat.aggregation.kind
        for i, (g, w) in enumerate(zip(got[feat.name], want[feat.name], strict=True)):
            w = _plain(w)
            if kind is AggKind.APPROX_PERCENTILE and w is not None:
                ok = isinstance(g, float) and percentile_ok(g, w)  # the estimate, within its documented accuracy
            elif isinstance(w, float):
                ok = g is not None and abs(g - w) <= 1e-9 * max(1.0, abs(w))
            else:
                ok = g == w
            if not ok:
                problems.append(f"{feat.name}[{want.loc[i, 'user_id']}]: got {g!r}, want {w!r}")
    assert not problems, "\n".join(problems[:20])


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray | list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and np.isnan(value):
        return None
    return value
