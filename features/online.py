"""Online writers: put each key's latest change point into Feast's online store, in Feast's own format.

Feast reads what these write (`FeatureStore.get_online_features`, `feast serve`); nothing here is a parallel
store. Unlike Feast's own writes, every write is guarded by event time: a stored value with a newer
`window_end` is never replaced by an older one, so replays, backfills and restarts cannot move a key back.
A value with the same `window_end` is replaced (a replay may carry a corrected value).

Writers are built from plain data (paths, names, types) and open their connection lazily, so they can be
pickled to Spark executors and used inside `mapInPandas` / `foreachPartition`. They encode a pandas batch a
column at a time (entity keys and Feast's `ValueProto` bytes are built with numpy or one concatenation per
value, not through protobuf objects; tests check them byte for byte against Feast and protobuf), then hand
it to the store in bulk:

- SQLite (`SqliteOnlineWriter`): multi-row upserts in the B-tree order of the table's key, the whole batch in
  one transaction, the next part encoded while SQLite writes the previous one. SQLite takes one writer at a
  time (`parallel = False`).
- Redis (`RedisOnlineWriter`): pipelined `EVALSHA` calls of a Lua script that, for each key, compares the
  stored `_ts:<view>` field with the new event time and writes the view's fields only if the new one is newer
  or equal. Each check-and-write is atomic in Redis, so any number of executors may write at once
  (`parallel = True`). The calls are written in the Redis protocol directly from the encoded columns.
"""

from __future__ import annotations

import math
import sqlite3
import struct
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from itertools import accumulate, chain, repeat
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar
from urllib.parse import quote

import numpy as np
import pandas as pd

from features.errors import ConfigError, DataError
from features.online_config import online_config
from features.spec import WINDOW_END, DType, FeatureGroup

if TYPE_CHECKING:
    from feast import FeatureStore, RepoConfig
    from feast.protos.feast.types.Value_pb2 import Value as ValueProto

    from features.repo import Repo

T = TypeVar("T")

# feast.value_type.ValueType numbers of the key types encoded here (importing Feast for two constants would cost
# every Spark task that writes seconds: the `feast` package imports all of Feast). tests/test_online_redis.py
# checks them against Feast's.
STRING_TYPE, INT64_TYPE = 2, 4
# How long a writer waits for another writer's lock (other Spark tasks, `feast materialize`) before failing.
SQLITE_BUSY_TIMEOUT_S = 60.0
# Page cache of a writer's connection (KiB): big batches touch many B-tree pages of the table and its indexes.
SQLITE_CACHE_KIB = 65_536


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
        """Write the rows (newer-or-equal wins per key); return how many input rows were processed.

        When it returns, the store has acknowledged every row: the values are readable online from then on (the
        point a freshness measurement ends). Writing the same rows again changes nothing (idempotent).
        """

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


# ---------------------------------------------------------------------------------------------------------
# SQLite


class SqliteOnlineWriter(OnlineWriter):
    """Writes into the table Feast's SQLite online store created for the view (`feast apply`).

    SQLite takes one writer at a time (others wait up to SQLITE_BUSY_TIMEOUT_S), hence `parallel = False`.
    A batch is one transaction of multi-row upserts (ROWS_PER_STATEMENT rows each) in the order of the table's
    primary key: SQLite then does far less work per row than for one statement per (key, feature) in random
    order, as Feast does.
    """

    ROWS_PER_STATEMENT: ClassVar[int] = 128
    ROWS_PER_ENCODE: ClassVar[int] = 8192

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
        self._columns: list[str] = []

    def __getstate__(self) -> dict[str, Any]:
        # A connection cannot cross processes; each executor opens its own on first write.
        return {**self.__dict__, "_conn": None, "_columns": []}

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def check_ready(self) -> None:
        self._connection()
        self.close()

    def write(self, rows: pd.DataFrame) -> int:
        """Upsert the rows in one transaction: a failed batch leaves the store as it was.

        Rows go in the order of the table's primary key: SQLite then touches each page of the table and its
        indexes once instead of at random. The sort is stable, so rows of one key keep their batch order (the
        event-time guard keeps the newest anyway; between equal times the later row wins). A big batch is
        encoded ROWS_PER_ENCODE rows at a time, each part while SQLite writes the previous one.
        """
        self.check_columns(rows)
        if rows.empty:
            return 0
        conn = self._connection()
        keys = entity_keys(rows, self.join_keys, self.entity_key_serialization_version)
        order = sorted(range(len(keys)), key=keys.__getitem__)
        keys = [keys[i] for i in order]
        rows = rows.take(order)
        created = _feast_epoch(datetime.now(UTC))
        step = self.ROWS_PER_ENCODE
        parts = (
            self._flat_parameters(rows.iloc[i : i + step], keys[i : i + step], created)
            for i in range(0, len(keys), step)
        )
        with conn:
            _overlapped(parts, self._upsert)
        return len(rows)

    def _upsert(self, flat: list[Any]) -> None:
        per_statement = self.ROWS_PER_STATEMENT * len(self._columns)
        whole = len(flat) - len(flat) % per_statement
        conn = self._connection()
        if whole:
            statements = (flat[i : i + per_statement] for i in range(0, whole, per_statement))
            conn.executemany(self._upsert_sql(self.ROWS_PER_STATEMENT), statements)
        if whole < len(flat):
            conn.execute(self._upsert_sql((len(flat) - whole) // len(self._columns)), flat[whole:])

    def _flat_parameters(self, rows: pd.DataFrame, keys: list[bytes], created: int) -> list[Any]:
        """The values of every (key, feature) row of the table, one row after the other."""
        names = sorted(self.features)
        num = "value_num" in self._columns
        encoded = [encode_values(rows[n], self.features[n], f"feature {n!r}", text=True, num=num) for n in names]
        width = len(names)
        columns: list[Any] = [
            chain.from_iterable(map(repeat, keys, repeat(width))),
            chain.from_iterable(repeat(names, len(keys))),
            chain.from_iterable(zip(*(e.values for e in encoded), strict=True)),
            chain.from_iterable(zip(*(e.text for e in encoded), strict=True)),  # type: ignore[misc]
        ]
        if num:
            columns.append(chain.from_iterable(zip(*(e.num for e in encoded), strict=True)))  # type: ignore[misc]
        event_ts = _feast_epoch_seconds(rows[WINDOW_END])
        columns.append(chain.from_iterable(map(repeat, event_ts, repeat(width))))
        columns.append(repeat(created))
        # The last column (created_ts) repeats forever; the others end together.
        return list(chain.from_iterable(zip(*columns, strict=False)))

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = self._open()
            existing = self._table_columns(conn)
            self._columns = ["entity_key", "feature_name", "value", "value_text"]
            if "value_num" in existing:  # created by Feast when enable_openai_compatible_store is on
                self._columns.append("value_num")
            self._columns += ["event_ts", "created_ts"]
            conn.execute(f"PRAGMA cache_size = -{SQLITE_CACHE_KIB}")  # this connection only; no durability change
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

    def _upsert_sql(self, n_rows: int) -> str:
        """An upsert of `n_rows` rows that only replaces a stored value whose event time is not newer.

        Rows of one statement are applied in order, so a later row of the same key meets the guard too.
        """
        table = _quote_id(self.table)
        row = f"({', '.join('?' * len(self._columns))})"
        updates = ", ".join(f"{c} = excluded.{c}" for c in self._columns[2:])
        return (
            f"INSERT INTO {table} ({', '.join(self._columns)}) VALUES {', '.join([row] * n_rows)} "
            f"ON CONFLICT(entity_key, feature_name) DO UPDATE SET {updates} "
            f"WHERE {table}.event_ts IS NULL OR excluded.event_ts >= {table}.event_ts"
        )


def _overlapped(parts: Iterator[T], consume: Callable[[T], None]) -> None:
    """consume(part) for every part, in order; from the second part on, in a worker thread while the next part
    is produced here (SQLite lets other threads run while it writes). Errors of either side propagate, after
    the worker has stopped."""
    first = next(parts, None)
    if first is None:
        return
    second = next(parts, None)
    if second is None:
        consume(first)
        return
    from concurrent.futures import ThreadPoolExecutor, wait

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="online-writer") as worker:
        pending = worker.submit(consume, first)
        try:
            for part in chain([second], parts):
                pending.result()
                pending = worker.submit(consume, part)
        except BaseException:
            wait([pending])
            raise
        pending.result()


# ---------------------------------------------------------------------------------------------------------
# Redis

# Feast's Redis layout (feast/infra/online_stores/redis.py): one hash per entity key, named
# serialize_entity_key(key) + project; per view, field mmh3("<view>:<feature>") holds the serialized ValueProto
# and field "_ts:<view>" the serialized google.protobuf.Timestamp of the row. Other views' fields in the same
# hash are left alone.
#
# The script that writes them, for a view with F features: KEYS are the n hashes; ARGV holds "_ts:<view>", the
# key ttl in seconds (0: none), the F field names, then column by column: n timestamps, n values of feature 1,
# ..., n values of feature F. A key is written only if it has no timestamp for the view yet, or the new one is
# newer or equal. It returns how many keys it wrote.
_LUA_HEAD = """
local function seconds_nanos(ts)
  -- google.protobuf.Timestamp: field 1 seconds, field 2 nanos, both varints. A negative int64 takes ten
  -- bytes (two's complement); it is -(1 + the complement of its low 63 bits), exact below 2^53 in a double.
  local seconds, nanos, i, n = 0, 0, 1, #ts
  while i <= n do
    local tag = string.byte(ts, i)
    i = i + 1
    local value, inverse, scale, count = 0, 0, 1, 0
    repeat
      local b = string.byte(ts, i)
      i = i + 1
      count = count + 1
      if count <= 9 then
        inverse = inverse + (127 - b % 128) * scale
      end
      value = value + (b % 128) * scale
      scale = scale * 128
    until b < 128
    if count == 10 then
      value = -(1 + inverse)
    end
    if tag == 8 then
      seconds = value
    elseif tag == 16 then
      nanos = value
    end
  end
  return {seconds, nanos}
end
local decoded = {}
local function time_of(ts)
  local t = decoded[ts]
  if not t then
    t = seconds_nanos(ts)
    decoded[ts] = t
  end
  return t
end
local ts_field = ARGV[1]
local ttl = tonumber(ARGV[2])
local n = #KEYS
local written = 0
for i = 1, n do
  local key = KEYS[i]
  local new = ARGV[FIRST + i]
  local old = redis.call('HGET', key, ts_field)
  local write = true
  if old and old ~= new then
    local o, t = time_of(old), time_of(new)
    write = t[1] > o[1] or (t[1] == o[1] and t[2] >= o[2])
  end
  if write then
"""
_LUA_TAIL = """
    if ttl > 0 then
      redis.call('EXPIRE', key, ttl)
    end
    written = written + 1
  end
end
return written
"""


def guarded_hset_lua(n_features: int) -> str:
    """The Lua script that writes the rows of a view with `n_features` features (one HSET per key)."""
    first = 2 + n_features  # ARGV[FIRST + i]: the timestamp of key i
    pairs = "".join(f", ARGV[{3 + j}], ARGV[{first} + {j + 1} * n + i]" for j in range(n_features))
    body = f"    redis.call('HSET', key, ts_field, new{pairs})"
    return _LUA_HEAD.replace("FIRST", str(first)) + body + _LUA_TAIL


class RedisOnlineWriter(OnlineWriter):
    """Writes into Feast's Redis online store, in Feast's key and hash layout, with an atomic event-time guard.

    `keys_per_call` keys go into one script call, which holds Redis for well under a millisecond, so reads
    are not held up; all calls of a batch go into one pipeline. A batch is not one transaction (each key's
    check-and-write is): if it fails half-way, writing it again completes it, since writes are idempotent.
    """

    parallel: ClassVar[bool] = True
    ROWS_PER_ENCODE: ClassVar[int] = 8192

    def __init__(
        self,
        connection_string: str,
        project: str,
        view: str,
        join_keys: Mapping[str, DType],
        features: Mapping[str, DType],
        *,
        view_name: str | None = None,
        redis_type: str = "redis",
        sentinel_master: str = "mymaster",
        key_ttl_seconds: int | None = None,
        entity_key_serialization_version: int = 3,
        keys_per_call: int = 256,
    ) -> None:
        super().__init__(view, join_keys, features)
        if redis_type not in ("redis", "redis_sentinel"):
            raise ConfigError(
                f"feature_store.yaml online_store.redis_type: {redis_type!r} is not supported by the online writer "
                "(its multi-key script calls need one Redis node). Fix: use redis_type redis or redis_sentinel"
            )
        self.connection_string = connection_string
        self.project = project
        self.view_name = view_name or view  # the name in the hash fields (with Feast's version suffix, if any)
        self.redis_type = redis_type
        self.sentinel_master = sentinel_master
        self.key_ttl_seconds = int(key_ttl_seconds or 0)
        self.entity_key_serialization_version = entity_key_serialization_version
        self.keys_per_call = max(1, int(keys_per_call))
        self._client: Any = None
        self._sha: str = ""

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None, "_sha": ""}

    @property
    def address(self) -> str:
        """Where the writer connects, without credentials (for messages)."""
        return ",".join(part for part in self.connection_string.split(",") if "=" not in part)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
            self._sha = ""

    def check_ready(self) -> None:
        self._connection()
        self.close()

    def write(self, rows: pd.DataFrame) -> int:
        self.check_columns(rows)
        if rows.empty:
            return 0
        client = self._connection()
        self._run(client, lambda: self._calls(rows))
        return len(rows)

    def _calls(self, rows: pd.DataFrame) -> Iterator[tuple[int, bytes]]:
        """The script calls for the rows as (number of keys, RESP-encoded arguments after the key count),
        encoded ROWS_PER_ENCODE rows at a time, so Redis runs the first calls while later rows are encoded.

        The arguments are Redis protocol bulk strings built a column at a time (`resp_values`): no Python
        object per value, no per-argument packing.
        """
        version, suffix = self.entity_key_serialization_version, self.project.encode("utf8")
        header = b"".join(_resp_bulk(a) for a in [f"_ts:{self.view_name}".encode(), b"%d" % self.key_ttl_seconds])
        header += b"".join(_resp_bulk(field) for field in self._fields())
        for start in range(0, len(rows), self.ROWS_PER_ENCODE):
            part = rows.iloc[start : start + self.ROWS_PER_ENCODE]
            keys = resp_bulks(entity_keys(part, self.join_keys, version, suffix=suffix, resp=True), framed=True)
            stamps = timestamp_resp(part[WINDOW_END])
            values = [resp_values(part[n], t, f"feature {n!r}") for n, t in self.features.items()]
            for lo in range(0, len(part), self.keys_per_call):
                hi = min(lo + self.keys_per_call, len(part))
                chunks = [keys.slice(lo, hi), header, stamps.slice(lo, hi), *(v.slice(lo, hi) for v in values)]
                yield hi - lo, b"".join(chunks)

    def _fields(self) -> list[bytes]:
        from feast.infra.online_stores.helpers import _mmh3

        return [_mmh3(f"{self.view_name}:{name}") for name in self.features]

    def _run(self, client: Any, calls: Callable[[], Iterator[tuple[int, bytes]]]) -> None:
        """Send every script call on one connection, then read the replies: one pipeline, in which Redis runs
        the first calls while the later ones are still being encoded and sent."""
        from redis.exceptions import NoScriptError, ResponseError

        for attempt in (1, 2):
            pool = client.connection_pool
            try:
                connection = pool.get_connection()
            except TypeError:  # redis-py < 5.3 wants a command name
                connection = pool.get_connection("EVALSHA")
            errors: list[ResponseError] = []
            sent = 0
            try:
                head = b"$7\r\nEVALSHA\r\n" + _resp_bulk(self._sha.encode())
                fixed = 5 + len(self.features)  # EVALSHA, sha, key count, ts field, ttl, the field names
                for n_keys, arguments in calls():
                    count = b"*%d\r\n" % (fixed + n_keys * (2 + len(self.features)))  # + keys, times, values
                    connection.send_packed_command([count + head + _resp_bulk(b"%d" % n_keys) + arguments], False)
                    sent += 1
                for _ in range(sent):
                    try:
                        connection.read_response()
                    except ResponseError as exc:  # an error reply: the connection stays in step
                        errors.append(exc)
            except BaseException:
                connection.disconnect()  # replies may be pending: never hand this connection out again
                raise
            finally:
                pool.release(connection)
            if not errors:
                return
            if attempt == 1 and all(isinstance(e, NoScriptError) for e in errors):
                # The server restarted or flushed its scripts: load it again and resend (writes are idempotent).
                self._sha = client.script_load(guarded_hset_lua(len(self.features)))
                continue
            raise errors[0]

    def _connection(self) -> Any:
        if self._client is None:
            from feast.infra.online_stores.redis import RedisOnlineStore
            from redis import Redis
            from redis.exceptions import RedisError
            from redis.sentinel import Sentinel

            nodes, options = RedisOnlineStore._parse_connection_string(self.connection_string)
            try:
                if self.redis_type == "redis_sentinel":
                    sentinel = Sentinel([(n["host"], int(n["port"])) for n in nodes], **options)
                    client = sentinel.master_for(self.sentinel_master)
                else:
                    client = Redis(host=nodes[0]["host"], port=int(nodes[0]["port"]), **options)
                self._sha = client.script_load(guarded_hset_lua(len(self.features)))
            except RedisError as exc:
                raise ConfigError(
                    f"online store of feature view {self.view!r}: cannot use Redis at {self.address} ({exc}). "
                    "Fix: start redis-server there, or set online_store.connection_string in feature_store.yaml "
                    "to a reachable Redis (host:port[,db=N,password=...])"
                ) from exc
            self._client = client
        return self._client


# ---------------------------------------------------------------------------------------------------------
# The factory


def online_writer(
    repo_config_or_store: RepoConfig | FeatureStore | Repo | str | Path,
    group: FeatureGroup,
    types: Mapping[str, DType],
) -> OnlineWriter:
    """The writer for the repo's configured online store; `types` is `group.output_types(schema)`."""
    config = online_config(repo_config_or_store)
    join_keys = {k: types[k] for k in group.join_keys}
    features = {f.name: types[f.name] for f in group.features}
    if config.kind == "sqlite":
        return SqliteOnlineWriter(
            db_path=config.sqlite_path(),
            table=f"{config.project}_{config.online_name(group.name)}",
            view=group.name,
            join_keys=join_keys,
            features=features,
            entity_key_serialization_version=config.entity_key_serialization_version,
            repo_path=str(config.repo_path or ""),
        )
    options = config.options
    return RedisOnlineWriter(
        connection_string=options["connection_string"],
        project=config.project,
        view=group.name,
        view_name=config.online_name(group.name),
        join_keys=join_keys,
        features=features,
        redis_type=str(options["redis_type"]),
        sentinel_master=options["sentinel_master"],
        key_ttl_seconds=options["key_ttl_seconds"],
        entity_key_serialization_version=config.entity_key_serialization_version,
    )


def _quote_id(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


# ---------------------------------------------------------------------------------------------------------
# Feast's storage format, a column at a time


def entity_keys(
    rows: pd.DataFrame, join_keys: Mapping[str, DType], version: int = 3, suffix: bytes = b"", resp: bool = False
) -> list[bytes]:
    """`feast.infra.key_encoding_utils.serialize_entity_key` of every row's key (+ `suffix`), column-wise;
    with `resp`, each as a Redis protocol bulk string.

    String and integer keys (the types Feast can serialize) are encoded here byte for byte like Feast does
    (version 3: key count, sorted key names, then each value's type, length and bytes); anything else goes
    through Feast's own function.
    """
    if resp:
        if len(join_keys) == 1 and next(iter(join_keys.values())) is DType.STRING and version >= 3:
            return _resp_string_keys(rows[next(iter(join_keys))], next(iter(join_keys)), suffix)
        heads = _BulkHeads()
        return [heads[len(k)] + k + b"\r\n" for k in entity_keys(rows, join_keys, version, suffix)]
    names = sorted(join_keys)
    if version < 3 or any(join_keys[k] not in (DType.STRING, DType.INT64) for k in names):
        return [key + suffix for key in _entity_keys_by_feast(rows, join_keys, version)]
    header = [struct.pack("<I", len(names))]
    for name in names:
        encoded = name.encode("utf8")
        header.append(struct.pack("<II", STRING_TYPE, len(encoded)) + encoded)
    head = b"".join(header)
    parts: list[list[bytes]] = []
    for name in names:
        what = f"join key {name!r}"
        column = rows[name]
        if join_keys[name] is DType.STRING:
            if _null_mask(column).any():
                raise DataError(f"{what}: null value; change points need a non-null key")
            encoded = list(map(_utf8, column.tolist()))
            if len(names) == 1:  # the common case, in one pass
                prefix = _LengthPrefixes(head + struct.pack("<I", STRING_TYPE))
                return [prefix[len(e)] + e + suffix for e in encoded]
            prefix = _LengthPrefixes(struct.pack("<I", STRING_TYPE))
            parts.append([prefix[len(e)] + e for e in encoded])
        else:
            ints, null = _int_array(column, what)
            if null.any():
                raise DataError(f"{what}: null value; change points need a non-null key")
            record = np.zeros(len(ints), dtype=[("type", "<u4"), ("size", "<u4"), ("value", "<i8")])
            record["type"] = INT64_TYPE
            record["size"] = 8
            record["value"] = ints
            parts.append(_split_fixed(record.tobytes(), 16, len(ints)))
    return [head + b"".join(values) + suffix for values in zip(*parts, strict=True)]


def _resp_string_keys(column: pd.Series, name: str, suffix: bytes) -> list[bytes]:
    """The common case (one string join key) straight to bulk strings: one concatenation per key."""
    values = column.tolist()
    try:
        encoded = [value.encode("utf8") for value in values]
    except AttributeError:  # not all strings: nulls are an error, anything else is written as str(value)
        if _null_mask(column).any():
            raise DataError(f"join key {name!r}: null value; change points need a non-null key") from None
        encoded = list(map(_utf8, values))
    encoded_name = name.encode("utf8")
    head = struct.pack("<III", 1, STRING_TYPE, len(encoded_name)) + encoded_name
    head += struct.pack("<I", STRING_TYPE)
    frames = _KeyFrames(head, len(head) + 4 + len(suffix))
    tail = suffix + b"\r\n"
    return [frames[len(e)] + e + tail for e in encoded]


class _KeyFrames(dict):
    """Per value length: "$<key length>\\r\\n" + the key's bytes before the value."""

    def __init__(self, head: bytes, fixed: int) -> None:
        super().__init__()
        self.head, self.fixed = head, fixed

    def __missing__(self, length: int) -> bytes:
        frame = self[length] = b"$%d\r\n%b%b" % (self.fixed + length, self.head, struct.pack("<I", length))
        return frame


class _LengthPrefixes(dict):
    """`start + <4-byte little-endian length>` per length, built once per distinct length."""

    def __init__(self, start: bytes) -> None:
        super().__init__()
        self.start = start

    def __missing__(self, length: int) -> bytes:
        prefix = self[length] = self.start + struct.pack("<I", length)
        return prefix


def _utf8(value: Any) -> bytes:
    return (value if isinstance(value, str) else str(value)).encode("utf8")


def _entity_keys_by_feast(rows: pd.DataFrame, join_keys: Mapping[str, DType], version: int) -> list[bytes]:
    from feast.infra.key_encoding_utils import serialize_entity_key
    from feast.protos.feast.types.EntityKey_pb2 import EntityKey as EntityKeyProto

    names = list(join_keys)
    converters = [_proto_converter(join_keys[k], f"join key {k!r}", nullable=False) for k in names]
    cache: dict[tuple[Any, ...], bytes] = {}
    out = []
    for values in zip(*(rows[k].tolist() for k in names), strict=True):
        key = cache.get(values)
        if key is None:
            proto = EntityKeyProto(
                join_keys=names, entity_values=[c(v) for c, v in zip(converters, values, strict=True)]
            )
            key = serialize_entity_key(proto, entity_key_serialization_version=version)
            cache[values] = key
        out.append(key)
    return out


class Encoded:
    """A column as Feast stores it: serialized ValueProto bytes (b"" for null), and for the SQL stores the
    `value_text` / `value_num` columns Feast fills with `extract_text_and_num`."""

    __slots__ = ("num", "text", "values")

    def __init__(self, values: list[bytes], text: list[Any] | None = None, num: list[Any] | None = None) -> None:
        self.values = values
        self.text = text
        self.num = num


_TAG_STRING = 0x12  # field 2, length-delimited
_TAG_INT64 = 0x20  # field 4, varint
_TAG_DOUBLE = 0x29  # field 5, 64-bit
_TAG_BOOL = 0x38  # field 7, varint


def encode_values(column: pd.Series, dtype: DType, what: str, *, text: bool = False, num: bool = False) -> Encoded:
    """Serialized `feast.types.Value` of every value of a column, byte for byte what protobuf writes; with
    `text` / `num`, also what Feast's SQL stores put in `value_text` / `value_num` (`extract_text_and_num`)."""
    n = len(column)
    out = Encoded([])
    null: np.ndarray | None = None
    if dtype is DType.INT64:
        ints, null = _int_array(column, what)
        out.values = _varint_field(_TAG_INT64, ints)
        if text:
            out.text = _strings(ints)
        if num:
            out.num = ints.astype(np.float64).tolist()
    elif dtype is DType.FLOAT64:
        floats, null = _float_array(column, what)
        out.values = _fixed64_field(_TAG_DOUBLE, floats)
        if text:
            out.text = list(map(str, floats.tolist()))
        if num:
            out.num = floats.tolist()
    elif dtype is DType.BOOL:
        bools, null = _bool_array(column, what)
        out.values = [b"\x38\x01" if b else b"\x38\x00" for b in bools.tolist()]
        if text:
            out.text = [str(b) for b in bools.tolist()]
        if num:
            out.num = bools.astype(np.float64).tolist()
    elif dtype is DType.STRING:
        null = _null_mask(column)
        strings = ["" if isnull else str(v) for v, isnull in zip(column.tolist(), null.tolist(), strict=True)]
        encoded = [s.encode("utf8") for s in strings]
        out.values = [b"\x12" + _varint(len(e)) + e for e in encoded]
        out.text = strings if text else None
        out.num = [None] * n if num else None
    else:
        convert = _proto_converter(dtype, what)
        out.values = [convert(v).SerializeToString() for v in column.tolist()]
        out.text = [None] * n if text else None
        out.num = [None] * n if num else None
    if null is not None and null.any():
        for i in np.flatnonzero(null).tolist():
            out.values[i] = b""
            if out.text is not None:
                out.text[i] = None
            if out.num is not None:
                out.num[i] = None
    return out


def _strings(ints: np.ndarray) -> list[str]:
    """str() of every integer, once per distinct value (counts repeat a lot)."""
    cache: dict[int, str] = {}
    return [cache.get(i) or cache.setdefault(i, str(i)) for i in ints.tolist()]


class RespColumn:
    """Values as consecutive Redis protocol bulk strings (`$<length>\\r\\n<bytes>\\r\\n`), with where each starts."""

    __slots__ = ("data", "offsets")

    def __init__(self, data: bytes, offsets: list[int]) -> None:
        self.data = data
        self.offsets = offsets  # len(values) + 1 positions

    def slice(self, lo: int, hi: int) -> bytes:
        return self.data[self.offsets[lo] : self.offsets[hi]]


def _resp_bulk(value: bytes) -> bytes:
    return b"$%d\r\n%b\r\n" % (len(value), value)


class _BulkHeads(dict):
    def __missing__(self, length: int) -> bytes:
        head = self[length] = b"$%d\r\n" % length
        return head


def resp_bulks(values: list[bytes], framed: bool = False) -> RespColumn:
    """Any byte strings as bulk strings (one Python concatenation per value); `framed`: already are."""
    if not framed:
        heads = _BulkHeads()
        values = [heads[len(v)] + v + b"\r\n" for v in values]
    return RespColumn(b"".join(values), [0, *accumulate(map(len, values))])


_NULL_BULK = np.frombuffer(b"$0\r\n\r\n", dtype=np.uint8)


def resp_values(column: pd.Series, dtype: DType, what: str) -> RespColumn:
    """`encode_values` of a column as bulk strings; integers and doubles built as one byte matrix."""
    if dtype is DType.FLOAT64:
        floats, null = _float_array(column, what)
        n = len(floats)
        matrix = np.empty((n, 15), dtype=np.uint8)  # $9 CR LF, tag, 8 bytes, CR LF
        matrix[:, :4] = np.frombuffer(b"$9\r\n", dtype=np.uint8)
        matrix[:, 4] = _TAG_DOUBLE
        matrix[:, 5:13] = np.ascontiguousarray(floats, dtype="<f8").view(np.uint8).reshape(n, 8)
        matrix[:, 13:] = np.frombuffer(b"\r\n", dtype=np.uint8)
        lengths = np.full(n, 15, dtype=np.int64)
    elif dtype is DType.INT64:
        ints, null = _int_array(column, what)
        data, size = _varint_matrix(_TAG_INT64, ints)  # size: 2 to 11 bytes
        n, width = data.shape
        digits = 1 + (size >= 10)  # of the length: "$9" or "$11"
        matrix = np.zeros((n, width + 7), dtype=np.uint8)
        rows = np.arange(n)
        matrix[:, 0] = ord("$")
        matrix[rows, 1] = np.where(digits == 1, 48 + size, 48 + size // 10)
        matrix[digits == 2, 2] = 48 + size[digits == 2] % 10
        matrix[rows, digits + 1] = 13
        matrix[rows, digits + 2] = 10
        body = digits + 3  # where the value starts
        for count in (1, 2):  # rows whose value starts at the same column: plain slice assignments
            rows_of = digits == count
            matrix[rows_of, count + 3 : count + 3 + width] = data[rows_of]
        matrix[rows, body + size] = 13
        matrix[rows, body + size + 1] = 10
        lengths = body + size + 2
    else:
        return resp_bulks(encode_values(column, dtype, what).values)
    if null.any():
        matrix[null, :6] = _NULL_BULK
        lengths[null] = 6
    keep = np.arange(matrix.shape[1]) < lengths[:, None]
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return RespColumn(matrix[keep].tobytes(), offsets.tolist())


def timestamp_resp(ends: pd.Series) -> RespColumn:
    """`timestamp_protos` as bulk strings, each distinct window end framed once (a batch has few)."""
    codes, protos = _timestamp_codes(ends)
    framed = [_resp_bulk(p) for p in protos]
    lengths = np.array([len(f) for f in framed], dtype=np.int64)[codes]
    offsets = np.zeros(len(codes) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return RespColumn(b"".join(list(map(framed.__getitem__, codes.tolist()))), offsets.tolist())


def timestamp_protos(ends: pd.Series) -> list[bytes]:
    """Each window end as the serialized google.protobuf.Timestamp Feast's Redis store keeps in `_ts:<view>`.

    Feast builds it with `Timestamp.FromDatetime` from a Python datetime, i.e. at microsecond precision.
    """
    codes, protos = _timestamp_codes(ends)
    return [protos[c] for c in codes.tolist()]


def _timestamp_codes(ends: pd.Series) -> tuple[np.ndarray, list[bytes]]:
    """(index of each row's window end among the distinct ones, the distinct ones' Timestamp protos)."""
    from google.protobuf.timestamp_pb2 import Timestamp

    codes, uniques = pd.factorize(_utc(ends))
    if (codes < 0).any():
        raise DataError(f"column {WINDOW_END!r}: null window end; every change point needs its window end")
    protos = []
    for end in uniques:
        micros = end.value // 1000
        seconds, rest = divmod(micros, 1_000_000)
        protos.append(Timestamp(seconds=seconds, nanos=rest * 1000).SerializeToString())
    return codes, protos


def _utc(ends: pd.Series) -> pd.Series:
    values = ends if pd.api.types.is_datetime64_any_dtype(ends) else pd.to_datetime(ends)
    return values.dt.tz_localize("UTC") if values.dt.tz is None else values.dt.tz_convert("UTC")


def _null_mask(column: pd.Series) -> np.ndarray:
    return np.asarray(column.isna(), dtype=bool)


def _int_array(column: pd.Series, what: str) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(column.dtype, np.dtype) and column.dtype.kind in "iu":
        return column.to_numpy(dtype=np.int64), np.zeros(len(column), dtype=bool)
    try:
        array = pd.array(column, dtype="Int64")
    except (TypeError, ValueError) as exc:
        raise DataError(f"{what}: expected integers or nulls ({exc})") from exc
    return array.to_numpy(dtype=np.int64, na_value=0), np.asarray(array.isna(), dtype=bool)


def _float_array(column: pd.Series, what: str) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(column.dtype, np.dtype) and column.dtype.kind in "fiu":
        values = column.to_numpy(dtype=np.float64)
    else:
        try:
            values = pd.array(column, dtype="Float64").to_numpy(dtype=np.float64, na_value=np.nan)
        except (TypeError, ValueError) as exc:
            raise DataError(f"{what}: expected numbers or nulls ({exc})") from exc
    return values, np.isnan(values)


def _bool_array(column: pd.Series, what: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        array = pd.array(column, dtype="boolean")
    except (TypeError, ValueError) as exc:
        raise DataError(f"{what}: expected booleans or nulls ({exc})") from exc
    return array.to_numpy(dtype=bool, na_value=False), np.asarray(array.isna(), dtype=bool)


def _split_fixed(data: bytes, width: int, n: int) -> list[bytes]:
    return [data[i : i + width] for i in range(0, width * n, width)]


def _fixed64_field(tag: int, values: np.ndarray) -> list[bytes]:
    """tag + 8 little-endian bytes per value (a double field of ValueProto)."""
    n = len(values)
    buffer = np.empty((n, 9), dtype=np.uint8)
    buffer[:, 0] = tag
    buffer[:, 1:] = np.ascontiguousarray(values, dtype="<f8").view(np.uint8).reshape(n, 8)
    return _split_fixed(buffer.tobytes(), 9, n)


def _varint_matrix(tag: int, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """tag + base-128 varint per value (an int64 field: negatives as their 64-bit two's complement), as rows
    of a byte matrix, and each row's length."""
    n = len(values)
    rest = np.ascontiguousarray(values, dtype=np.int64).view(np.uint64).copy()
    columns = [np.full(n, tag, dtype=np.uint8)]
    length = np.ones(n, dtype=np.int64)
    active = np.ones(n, dtype=bool)
    seven, low_bits = np.uint64(7), np.uint64(0x7F)
    while active.any():
        low = (rest & low_bits).astype(np.uint8)
        rest >>= seven
        more = rest != 0
        columns.append(np.where(active, low | (more.astype(np.uint8) << 7), 0).astype(np.uint8))
        length += active
        active = more
    if n == 0:
        return np.zeros((0, 2), dtype=np.uint8), length
    return np.stack(columns, axis=1), length


def _varint_field(tag: int, values: np.ndarray) -> list[bytes]:
    matrix, length = _varint_matrix(tag, values)
    width = matrix.shape[1]
    data = matrix.tobytes()
    return [data[s : s + size] for s, size in zip(range(0, width * len(values), width), length.tolist(), strict=True)]


def _varint(value: int) -> bytes:
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _feast_epoch(ts: datetime) -> int:
    """event_ts as Feast's SQLite store keeps it, so that Feast reads back the same instant.

    Feast stores `int(naive_utc.timestamp())` (Python reads a naive datetime as local time) and reads it with
    `datetime.fromtimestamp` (local again), so the round trip is exact; mirroring it keeps our values
    comparable with rows Feast itself wrote. On a UTC machine this is plain epoch seconds.
    """
    return int(ts.astimezone(UTC).replace(tzinfo=None).timestamp())


def _feast_epoch_seconds(ends: pd.Series) -> list[int]:
    """`_feast_epoch` of every row, computed once per distinct window end (a batch has few)."""
    codes, uniques = pd.factorize(_utc(ends))
    if (codes < 0).any():
        raise DataError(f"column {WINDOW_END!r}: null window end; every change point needs its window end")
    seconds = [_feast_epoch(ts.to_pydatetime(warn=False)) for ts in uniques]
    return [seconds[c] for c in codes.tolist()]


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
