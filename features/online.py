"""Online writers: put each key's latest change point into Feast's online store, in Feast's own format.

Feast reads what these write (`FeatureStore.get_online_features`, `feast serve`); nothing here is a parallel
store. Unlike Feast's own writes, every write is guarded by event time: a stored value with a newer
`window_end` is never replaced by an older one, so replays, backfills and restarts cannot move a key back.

Writers are built from plain data (paths, names, types) and open their connection lazily, so they can be
pickled to Spark executors and used inside `foreachPartition`.
"""

from __future__ import annotations

import math
import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import quote

import numpy as np
import pandas as pd

from features.errors import ConfigError, DataError
from features.spec import WINDOW_END, DType, FeatureGroup

if TYPE_CHECKING:
    from feast import FeatureStore, RepoConfig
    from feast.protos.feast.types.Value_pb2 import Value as ValueProto

    from features.repo import Repo

SQLITE_TYPES = ("sqlite", "feast.infra.online_stores.sqlite.SqliteOnlineStore")
# How long a writer waits for another writer's lock (other Spark tasks, `feast materialize`) before failing.
SQLITE_BUSY_TIMEOUT_S = 60.0


class OnlineWriter(ABC):
    """Writes change-point rows of one FeatureView into an online store.

    Input rows: a pandas DataFrame with the join-key columns, `window_end` (UTC datetime64; naive values are
    taken as UTC) and one column per feature (scalars, None/NaN for null, lists or arrays for list features).
    """

    # Whether many processes may write at once; engines funnel the writes of a serial store into one task.
    parallel: ClassVar[bool] = False

    def __init__(self, view: str, join_keys: Mapping[str, DType], features: Mapping[str, DType]) -> None:
        self.view = view
        self.join_keys = dict(join_keys)
        self.features = dict(features)
        for name, dtype in {**self.join_keys, **self.features}.items():
            if dtype is DType.TIMESTAMP:
                raise ConfigError(
                    f"FeatureGroup({view!r}): column {name!r} is a timestamp, which the online writer does not "
                    "store; use a string, number or boolean key/feature"
                )

    @abstractmethod
    def write(self, rows: pd.DataFrame) -> int:
        """Write the rows (newer-wins per key and feature); return how many input rows were processed."""

    @abstractmethod
    def close(self) -> None:
        """Release connections; the writer reopens them if used again."""

    def __enter__(self) -> OnlineWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @abstractmethod
    def check_ready(self) -> None:
        """Raise a ConfigError now if the store cannot take writes (so jobs fail before any Spark work)."""

    def check_columns(self, rows: pd.DataFrame) -> None:
        missing = [c for c in [*self.join_keys, WINDOW_END, *self.features] if c not in rows.columns]
        if missing:
            raise DataError(
                f"rows for feature view {self.view!r}: missing column(s) {', '.join(map(repr, missing))}; "
                f"the writer needs the join keys, {WINDOW_END!r} and every feature of the group"
            )


class SqliteOnlineWriter(OnlineWriter):
    """Writes into the table Feast's SQLite online store created for the view (`feast apply`).

    SQLite takes one writer at a time (others wait up to SQLITE_BUSY_TIMEOUT_S), hence `parallel = False`.
    """

    def __init__(
        self,
        db_path: str,
        table: str,
        view: str,
        join_keys: Mapping[str, DType],
        features: Mapping[str, DType],
        *,
        entity_key_serialization_version: int = 3,
        repo_path: str = "",
    ) -> None:
        super().__init__(view, join_keys, features)
        self.db_path = db_path
        self.table = table
        self.entity_key_serialization_version = entity_key_serialization_version
        self.repo_path = repo_path
        self._conn: sqlite3.Connection | None = None
        self._sql: str = ""
        self._has_value_num = False

    def __getstate__(self) -> dict[str, Any]:
        # A connection cannot cross processes; each executor opens its own on first write.
        return {**self.__dict__, "_conn": None, "_sql": "", "_has_value_num": False}

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def check_ready(self) -> None:
        self._connection()
        self.close()

    def write(self, rows: pd.DataFrame) -> int:
        self.check_columns(rows)
        if rows.empty:
            return 0
        conn = self._connection()
        with conn:  # one transaction per call: a failed batch leaves the store as it was
            conn.executemany(self._sql, self._parameters(rows))
        return len(rows)

    def _parameters(self, rows: pd.DataFrame) -> Iterator[tuple[Any, ...]]:
        from feast.infra.online_stores.helpers import extract_text_and_num

        keys = self._entity_keys(rows)
        event_ts = _feast_epoch_seconds(rows[WINDOW_END])
        created_ts = _feast_epoch(datetime.now(UTC))
        for name, dtype in self.features.items():
            convert = _proto_converter(dtype, f"feature {name!r}")
            for key, value, ts in zip(keys, rows[name].tolist(), event_ts, strict=True):
                proto = convert(value)
                text, num = extract_text_and_num(proto, self._has_value_num)
                row: tuple[Any, ...] = (key, name, proto.SerializeToString(), text)
                if self._has_value_num:
                    row += (num,)
                yield (*row, ts, created_ts)

    def _entity_keys(self, rows: pd.DataFrame) -> list[bytes]:
        """The serialized entity key of every row, serialized once per distinct key."""
        from feast.infra.key_encoding_utils import serialize_entity_key
        from feast.protos.feast.types.EntityKey_pb2 import EntityKey as EntityKeyProto

        names = list(self.join_keys)
        converters = [_proto_converter(self.join_keys[k], f"join key {k!r}", nullable=False) for k in names]
        columns = [rows[k].tolist() for k in names]
        cache: dict[tuple[Any, ...], bytes] = {}
        out = []
        for values in zip(*columns, strict=True):
            key = cache.get(values)
            if key is None:
                proto = EntityKeyProto(
                    join_keys=names, entity_values=[c(v) for c, v in zip(converters, values, strict=True)]
                )
                key = serialize_entity_key(
                    proto, entity_key_serialization_version=self.entity_key_serialization_version
                )
                cache[values] = key
            out.append(key)
        return out

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = self._open()
            columns = self._table_columns(conn)
            self._has_value_num = "value_num" in columns
            self._sql = self._upsert_sql(columns)
            self._conn = conn
        return self._conn

    def _open(self) -> sqlite3.Connection:
        # mode=rw: never create an empty database file; a missing one means the repo was not applied.
        uri = f"file:{quote(str(Path(self.db_path).absolute()))}?mode=rw"
        try:
            return sqlite3.connect(uri, uri=True, timeout=SQLITE_BUSY_TIMEOUT_S, check_same_thread=False)
        except sqlite3.OperationalError as exc:
            raise self._not_applied(f"cannot open the online store {self.db_path} ({exc})") from exc

    def _table_columns(self, conn: sqlite3.Connection) -> set[str]:
        columns = {row[1] for row in conn.execute(f"PRAGMA table_info({_quote_id(self.table)})")}
        if not columns:
            conn.close()
            raise self._not_applied(f"the online store {self.db_path} has no table {self.table!r}")
        return columns

    def _not_applied(self, problem: str) -> ConfigError:
        repo = self.repo_path or "PATH"
        return ConfigError(
            f"online store of feature view {self.view!r}: {problem}. Fix: run `features apply --repo {repo}` "
            "(or `feast apply` in the repo) to create the feature views' tables, then write again"
        )

    def _upsert_sql(self, columns: set[str]) -> str:
        """An upsert that only replaces a stored value whose event time is not newer than the new one."""
        names = ["entity_key", "feature_name", "value", "value_text"]
        if "value_num" in columns:  # created by Feast when enable_openai_compatible_store is on
            names.append("value_num")
        names += ["event_ts", "created_ts"]
        table = _quote_id(self.table)
        updates = ", ".join(f"{c} = excluded.{c}" for c in names[2:])
        return (
            f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join('?' * len(names))}) "
            f"ON CONFLICT(entity_key, feature_name) DO UPDATE SET {updates} "
            f"WHERE {table}.event_ts IS NULL OR excluded.event_ts >= {table}.event_ts"
        )


def online_writer(
    repo_config_or_store: RepoConfig | FeatureStore | Repo | str | Path,
    group: FeatureGroup,
    types: Mapping[str, DType],
) -> OnlineWriter:
    """The writer for the repo's configured online store; `types` is `group.output_types(schema)`."""
    store, config = _store_and_config(repo_config_or_store)
    kind = str(config.online_store.type)
    join_keys = {k: types[k] for k in group.join_keys}
    features = {f.name: types[f.name] for f in group.features}
    repo_path = str(config.repo_path or "")
    if kind in SQLITE_TYPES:
        return SqliteOnlineWriter(
            db_path=_sqlite_path(config),
            table=_table_id(store, config, group.name),
            view=group.name,
            join_keys=join_keys,
            features=features,
            entity_key_serialization_version=config.entity_key_serialization_version,
            repo_path=repo_path,
        )
    raise ConfigError(
        f"feature_store.yaml online_store.type: {kind!r} is not supported by the online writer yet. "
        "Fix: use online_store type sqlite"
    )


def _store_and_config(source: Any) -> tuple[FeatureStore | None, RepoConfig]:
    from feast import FeatureStore, RepoConfig
    from feast.repo_config import load_repo_config

    from features.repo import Repo

    if isinstance(source, FeatureStore):
        return source, source.config
    if isinstance(source, RepoConfig):
        return None, source
    root = source.root if isinstance(source, Repo) else Path(source).expanduser().resolve()
    config_file = root / "feature_store.yaml"
    if not config_file.is_file():
        raise ConfigError(f"--repo: {root} has no feature_store.yaml; point it at the Feast feature repository")
    return None, load_repo_config(root, config_file)


def _sqlite_path(config: RepoConfig) -> str:
    """The database file, resolved like Feast's SqliteOnlineStore (relative to the repo).

    Made absolute here, on the driver: executors may run in another working directory.
    """
    path = Path(config.online_store.path)
    if config.repo_path and not path.is_absolute():
        path = Path(config.repo_path) / path
    return str(path.absolute())


def _table_id(store: FeatureStore | None, config: RepoConfig, view: str) -> str:
    """Feast's online table name: `<project>_<view>`, with a version suffix when versioning is on."""
    from feast.infra.online_stores.helpers import compute_table_id

    if not config.registry.enable_online_feature_view_versioning:
        return f"{config.project}_{view}"
    # The suffix depends on the registered version, so ask the registry (driver side, once).
    if store is None:
        from feast import FeatureStore

        store = FeatureStore(config=config)
    return compute_table_id(config.project, store.get_feature_view(view), True)


def _quote_id(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _feast_epoch(ts: datetime) -> int:
    """event_ts as Feast's SQLite store keeps it, so that Feast reads back the same instant.

    Feast stores `int(naive_utc.timestamp())` (Python reads a naive datetime as local time) and reads it with
    `datetime.fromtimestamp` (local again), so the round trip is exact; mirroring it keeps our values
    comparable with rows Feast itself wrote. On a UTC machine this is plain epoch seconds.
    """
    return int(ts.astimezone(UTC).replace(tzinfo=None).timestamp())


def _feast_epoch_seconds(ends: pd.Series) -> list[int]:
    """`_feast_epoch` of every row, computed once per distinct window end (a batch has few)."""
    values = pd.to_datetime(ends)
    if values.dt.tz is None:
        values = values.dt.tz_localize("UTC")
    codes, uniques = pd.factorize(values)
    if (codes < 0).any():
        raise DataError(f"column {WINDOW_END!r}: null window end; every change point needs its window end")
    seconds = [_feast_epoch(ts.to_pydatetime(warn=False)) for ts in uniques]
    return [seconds[c] for c in codes]


def _is_null(value: Any) -> bool:
    if value is None or value is pd.NA or value is pd.NaT:
        return True
    return isinstance(value, float | np.floating) and math.isnan(value)


def _proto_converter(dtype: DType, what: str, nullable: bool = True) -> Callable[[Any], ValueProto]:
    """value -> ValueProto for one logical type; nulls become an empty ValueProto, which Feast reads as None."""
    from feast.protos.feast.types.Value_pb2 import BoolList, DoubleList, Int64List, StringList
    from feast.protos.feast.types.Value_pb2 import Value as ValueProto

    scalars: dict[DType, tuple[str, Callable[[Any], Any]]] = {
        DType.INT64: ("int64_val", int),
        DType.FLOAT64: ("double_val", float),
        DType.STRING: ("string_val", str),
        DType.BOOL: ("bool_val", bool),
    }
    lists: dict[DType, tuple[str, Any, Callable[[Any], Any]]] = {
        DType.INT64_LIST: ("int64_list_val", Int64List, int),
        DType.FLOAT64_LIST: ("double_list_val", DoubleList, float),
        DType.STRING_LIST: ("string_list_val", StringList, str),
        DType.BOOL_LIST: ("bool_list_val", BoolList, bool),
    }

    def null(value: Any) -> ValueProto:
        if not nullable:
            raise DataError(f"{what}: null value; change points need a non-null key")
        return ValueProto()

    if dtype in scalars:
        field, cast = scalars[dtype]

        def scalar(value: Any) -> ValueProto:
            return null(value) if _is_null(value) else ValueProto(**{field: cast(value)})

        return scalar

    field, list_type, cast = lists[dtype]

    def sequence(value: Any) -> ValueProto:
        if value is None or (not isinstance(value, list | tuple | np.ndarray) and _is_null(value)):
            return null(value)
        items = list(value)
        if any(_is_null(item) for item in items):
            raise DataError(f"{what}: a list holds a null element, which Feast cannot store; drop nulls first")
        return ValueProto(**{field: list_type(val=[cast(item) for item in items])})

    return sequence
