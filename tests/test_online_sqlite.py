"""The SQLite online writer: rows written in Feast's format read back through `FeatureStore.get_online_features`,
with the event-time guard (an older write never replaces a newer value)."""

from __future__ import annotations

import pickle
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from feast import FeatureStore
from feast.protos.feast.types.EntityKey_pb2 import EntityKey as EntityKeyProto
from feast.protos.feast.types.Value_pb2 import Value as ValueProto
from online_repos import CARD_MERCHANT, SOURCE, T0, T1, T2, USER
from repo_yaml import feature_store_yaml

from features import ConfigError, DataError, FeatureGroup
from features.repo import Repo
from features.stores.feast_objects import to_feast
from features.stores.online import OnlineWriter, SqliteOnlineWriter, online_writer

FEATURE_STORE_YAML = feature_store_yaml("test")
# The groups of tests/online_repos.py, the user's without its sketch features (their online values are tested there).
USER = replace(USER, features=[f for f in USER.features if f.name not in ("merchants", "amount_p90")])


@pytest.fixture(scope="module")
def applied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repo applied once (the slow part); each test copies the online database it writes to."""
    root = tmp_path_factory.mktemp("applied")
    (root / "feature_store.yaml").write_text(FEATURE_STORE_YAML)
    store = FeatureStore(repo_path=str(root))
    store.apply([*to_feast(USER, repo_root=root), *to_feast(CARD_MERCHANT, repo_root=root)])
    return root


@pytest.fixture
def repo(applied: Path, tmp_path: Path) -> Path:
    """A fresh copy of the applied repo, so that tests do not see each other's writes."""
    root = tmp_path / "repo"
    root.mkdir()
    (root / "data").mkdir()
    (root / "feature_store.yaml").write_text(FEATURE_STORE_YAML)
    for name in ("registry.db", "online_store.db"):
        (root / "data" / name).write_bytes((applied / "data" / name).read_bytes())
    return root


def _writer(root: Path, group: FeatureGroup) -> OnlineWriter:
    return online_writer(FeatureStore(repo_path=str(root)), group, group.output_types(SOURCE.schema))


def _read(root: Path, group: FeatureGroup, rows: list[dict]) -> dict[str, list]:
    store = FeatureStore(repo_path=str(root))
    refs = [f"{group.name}:{f.name}" for f in group.features]
    return store.get_online_features(features=refs, entity_rows=rows).to_dict()


def _user_rows(window_end: pd.Timestamp, **values: list) -> pd.DataFrame:
    n = len(values["user_id"])
    return pd.DataFrame({"window_end": [window_end] * n, **values})


def test_every_type_and_null_reads_back_through_feast(repo: Path) -> None:
    rows = pd.DataFrame(
        {
            "user_id": ["u1", "u2"],
            "window_end": [T0, T0],
            "txn_count": np.array([3, 0], dtype="int64"),
            "amount_sum": [12.5, 0.0],
            "amount_max": [9.25, np.nan],
            "last_status": ["FAILED", None],
            "last_ok": [np.bool_(False), None],
            "last_merchants": [np.array([7, 3, 7]), None],
            "last_amounts": [[9.25, 3.25], None],
            "last_statuses": [np.array(["FAILED", "OK"], dtype=object), None],
            "last_oks": [[False, True, True], None],
        }
    )
    assert _writer(repo, USER).write(rows) == 2
    got = _read(repo, USER, [{"user_id": "u1"}, {"user_id": "u2"}, {"user_id": "nobody"}])
    assert got["txn_count"] == [3, 0, None]
    assert got["amount_sum"] == [12.5, 0.0, None]
    assert got["amount_max"] == [9.25, None, None]
    assert got["last_status"] == ["FAILED", None, None]
    assert got["last_ok"] == [False, None, None]
    assert got["last_merchants"] == [[7, 3, 7], None, None]
    assert got["last_amounts"] == [[9.25, 3.25], None, None]
    assert got["last_statuses"] == [["FAILED", "OK"], None, None]
    assert got["last_oks"] == [[False, True, True], None, None]


def test_nullable_pandas_dtypes(repo: Path) -> None:
    rows = _user_rows(T0, user_id=["u1", "u2"])
    for feat in USER.features:
        rows[feat.name] = None
    rows["txn_count"] = pd.array([5, None], dtype="Int64")
    rows["amount_max"] = pd.array([1.5, None], dtype="Float64")
    rows["last_status"] = pd.array(["OK", None], dtype="string")
    rows["last_ok"] = pd.array([True, None], dtype="boolean")
    _writer(repo, USER).write(rows)
    got = _read(repo, USER, [{"user_id": "u1"}, {"user_id": "u2"}])
    assert got["txn_count"] == [5, None]
    assert got["amount_max"] == [1.5, None]
    assert got["last_status"] == ["OK", None]
    assert got["last_ok"] == [True, None]


def _count_rows(window_end: pd.Timestamp, counts: dict[str, int]) -> pd.DataFrame:
    rows = _user_rows(window_end, user_id=list(counts))
    for feat in USER.features:
        rows[feat.name] = None
    rows["txn_count"] = list(counts.values())
    return rows


def test_older_write_never_replaces_a_newer_value(repo: Path) -> None:
    writer = _writer(repo, USER)
    writer.write(_count_rows(T1, {"u1": 2, "u2": 20}))
    writer.write(_count_rows(T0, {"u1": 1, "u2": 10}))  # out of order: an older change point arrives late
    assert _read(repo, USER, [{"user_id": "u1"}, {"user_id": "u2"}])["txn_count"] == [2, 20]
    writer.write(_count_rows(T2, {"u1": 3}))  # newer: replaces
    writer.write(_count_rows(T1, {"u1": 2, "u2": 21}))  # replay of T1 with a corrected value: same time wins
    assert _read(repo, USER, [{"user_id": "u1"}, {"user_id": "u2"}])["txn_count"] == [3, 21]


def test_within_one_batch_the_newest_row_of_a_key_wins(repo: Path) -> None:
    rows = pd.concat([_count_rows(T2, {"u1": 3}), _count_rows(T0, {"u1": 1}), _count_rows(T1, {"u1": 2})])
    assert _writer(repo, USER).write(rows) == 3
    assert _read(repo, USER, [{"user_id": "u1"}])["txn_count"] == [3]


def _feast_store_io(root: Path) -> tuple[FeatureStore, Any, Any]:
    """Feast's own provider and the user view, to write and read exactly as Feast does."""
    store = FeatureStore(repo_path=str(root))
    return store, store._get_provider(), store.get_feature_view("user_transactions")


def _user_key(user_id: str) -> EntityKeyProto:
    return EntityKeyProto(join_keys=["user_id"], entity_values=[ValueProto(string_val=user_id)])


def test_newer_value_is_kept_against_rows_feast_wrote_itself(repo: Path) -> None:
    """Our event_ts encoding compares correctly with the one Feast's own SQLite store writes."""
    store, provider, view = _feast_store_io(repo)
    row = (_user_key("u1"), {"txn_count": ValueProto(int64_val=2)}, T1.to_pydatetime(), None)
    provider.online_write_batch(store.config, view, [row], None)
    writer = _writer(repo, USER)
    writer.write(_count_rows(T0, {"u1": 1}))
    assert _read(repo, USER, [{"user_id": "u1"}])["txn_count"] == [2]
    writer.write(_count_rows(T2, {"u1": 3}))
    assert _read(repo, USER, [{"user_id": "u1"}])["txn_count"] == [3]


def test_factory_accepts_a_repo_and_naive_window_ends_are_utc(repo: Path) -> None:
    writer = online_writer(Repo.load(repo), USER, USER.output_types(SOURCE.schema))
    rows = _count_rows(T0, {"u1": 4})
    rows["window_end"] = rows["window_end"].dt.tz_localize(None)
    writer.write(rows)
    store, provider, view = _feast_store_io(repo)
    [(event_ts, values)] = provider.online_read(store.config, view, [_user_key("u1")])
    assert event_ts == T0.to_pydatetime()  # Feast reads back the instant we wrote
    assert values["txn_count"].int64_val == 4


def test_composite_keys(repo: Path) -> None:
    rows = pd.DataFrame(
        {
            "card_id": ["c1", "c1", "c2"],
            "merchant_id": [7, 8, 7],
            "window_end": [T0, T0, T0],
            "txn_count": [1, 2, 3],
            "last_status": ["OK", "FAILED", None],
        }
    )
    _writer(repo, CARD_MERCHANT).write(rows)
    got = _read(
        repo,
        CARD_MERCHANT,
        [
            {"card_id": "c2", "merchant_id": 7},
            {"merchant_id": 8, "card_id": "c1"},  # key order does not matter
            {"card_id": "c1", "merchant_id": 7},
            {"card_id": "c2", "merchant_id": 8},
        ],
    )
    assert got["txn_count"] == [3, 2, 1, None]
    assert got["last_status"] == [None, "FAILED", "OK", None]


def test_writer_is_picklable_and_connects_lazily(repo: Path) -> None:
    writer = _writer(repo, USER)
    writer.write(_count_rows(T0, {"u1": 1}))
    clone = pickle.loads(pickle.dumps(writer))  # as sent to a Spark executor
    assert isinstance(clone, SqliteOnlineWriter) and clone._conn is None
    clone.write(_count_rows(T1, {"u1": 2}))
    clone.close()
    writer.close()
    assert _read(repo, USER, [{"user_id": "u1"}])["txn_count"] == [2]


def test_missing_table_tells_to_apply(repo: Path) -> None:
    with sqlite3.connect(repo / "data" / "online_store.db") as conn:
        conn.execute('DROP TABLE "test_user_transactions"')
    with pytest.raises(ConfigError) as info:
        _writer(repo, USER).write(_count_rows(T0, {"u1": 1}))
    message = str(info.value)
    assert "test_user_transactions" in message
    assert f"features apply --repo {repo}" in message


def test_missing_database_tells_to_apply_and_creates_nothing(repo: Path) -> None:
    db = repo / "data" / "online_store.db"
    db.unlink()
    with pytest.raises(ConfigError, match=r"run `features apply --repo "):
        _writer(repo, USER).write(_count_rows(T0, {"u1": 1}))
    assert not db.exists()


def test_missing_column_and_null_key_are_data_errors(repo: Path) -> None:
    writer = _writer(repo, USER)
    with pytest.raises(DataError, match="'amount_sum'"):
        writer.write(_count_rows(T0, {"u1": 1}).drop(columns=["amount_sum"]))
    rows = _count_rows(T0, {"u1": 1})
    rows["user_id"] = [None]
    with pytest.raises(DataError, match="join key 'user_id'"):
        writer.write(rows)


def test_unsupported_online_store_type(repo: Path) -> None:
    from feast.repo_config import load_repo_config

    config = load_repo_config(repo, repo / "feature_store.yaml")
    config.online_config = {"type": "remote", "path": "http://feature-server:6566"}
    config._online_store = None
    with pytest.raises(ConfigError, match=r"online_store.type: 'remote'.*sqlite or redis"):
        online_writer(config, USER, USER.output_types(SOURCE.schema))


def test_empty_frame_writes_nothing(repo: Path) -> None:
    assert _writer(repo, USER).write(_count_rows(T0, {}).iloc[0:0]) == 0


# feature_store.yaml files whose online settings must read the same without Feast as through Feast.
CONFIGS = {
    "defaults": "project: p1\nregistry: data/registry.db\nprovider: local\n",
    "sqlite": FEATURE_STORE_YAML,
    "class path, variable": (
        "project: p2\nprovider: local\nregistry: {path: data/registry.db}\n"
        "online_store:\n  type: feast.infra.online_stores.sqlite.SqliteOnlineStore\n  path: ${FX_ONLINE_DIR}/on.db\n"
    ),
    "redis": (
        "project: p3\nprovider: local\nregistry: data/registry.db\nentity_key_serialization_version: 3\n"
        "online_store:\n  type: redis\n  redis_type: redis_sentinel\n  sentinel_master: m1\n"
        "  connection_string: redis.example:7000,db=1\n  key_ttl_seconds: 600\n"
    ),
    "versioned": (
        "project: p4\nprovider: local\n"
        "registry:\n  path: data/registry.db\n  enable_online_feature_view_versioning: true\n"
        "online_store: redis\n"
    ),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_online_config_reads_as_feast_does(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from feast.repo_config import load_repo_config

    from features.stores.online_config import online_config

    monkeypatch.setenv("FX_ONLINE_DIR", str(tmp_path / "online"))
    (tmp_path / "feature_store.yaml").write_text(CONFIGS[name])
    ours = online_config(tmp_path)
    feasts = online_config(load_repo_config(tmp_path, tmp_path / "feature_store.yaml"))
    assert ours == feasts
    if ours.kind == "sqlite":
        assert ours.sqlite_path() == feasts.sqlite_path()
        assert ours.sqlite_path().startswith(str(tmp_path))


def test_a_writer_from_a_repo_folder_does_not_import_feast(repo: Path) -> None:
    # Importing Feast costs a cold job seconds; the writer's settings come from feature_store.yaml alone.
    import subprocess
    import sys

    script = (
        "import sys\nfrom features.stores.online import online_writer\nfrom features.spec import DType, FeatureGroup\n"
        "from features import Entity, EventSource, Feature, Hop, agg\n"
        "g = FeatureGroup('user_transactions', Entity('user', join_keys=['user_id']), "
        "EventSource('t', path='x', timestamp='ts', schema={'user_id': 'string', 'ts': 'timestamp'}), "
        "[Feature('txn_count', agg.count(), window=Hop('1h', every='5m'))])\n"
        f"w = online_writer({str(repo)!r}, g, {{'user_id': DType.STRING, 'txn_count': DType.INT64}})\n"
        "w.check_ready()\nprint(w.table, 'feast' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["test_user_transactions", "False"]
