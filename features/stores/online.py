"""Online writers: put each key's latest change point into Feast's online store, in Feast's own format.

Feast reads what these write (`FeatureStore.get_online_features`, `feast serve`); nothing here is a parallel
store. Unlike Feast's own writes, every write is guarded by event time: a stored value with a newer
`window_end` is never replaced by an older one, so replays, backfills and restarts cannot move a key back.
A value with the same `window_end` is replaced (a replay may carry a corrected value).

Writers are built from plain data (paths, names, types) and open their connection lazily, so they can be
pickled to Spark executors and used inside `mapInPandas` / `foreachPartition`. They encode a pandas batch a
column at a time in Feast's format (features.stores.feast_codec), then hand it to the store in bulk:

- SQLite (`SqliteOnlineWriter`): multi-row upserts in the B-tree order of the table's key, the whole batch in
  one transaction, the next part encoded while SQLite writes the previous one. SQLite takes one writer at a
  time (`parallel = False`).
- Redis (`RedisOnlineWriter`): pipelined `EVALSHA` calls of a Lua script that, for each key, compares the
  stored `_ts:<view>` field with the new event time and writes the view's fields only if the new one is newer
  or equal. Each check-and-write is atomic in Redis, so any number of executors may write at once
  (`parallel = True`). The calls are written in the Redis protocol directly from the encoded columns.
"""

from __future__ import annotations

import copy
import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from itertools import chain, repeat
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar
from urllib.parse import quote

import pandas as pd

from features.errors import ConfigError, DataError
from features.spec import WINDOW_END, DType, FeatureGroup
from features.stores.feast_codec import (
    encode_values,
    entity_keys,
    feast_epoch,
    feast_epoch_seconds,
    resp_bulk,
    resp_bulks,
    resp_values,
    timestamp_resp,
)
from features.stores.online_config import online_config

if TYPE_CHECKING:
    from feast import FeatureStore, RepoConfig

    from features.repo import Repo

T = TypeVar("T")

# How long a writer waits for another writer's lock (other Spark tasks, `feast materialize`) before failing.
SQLITE_BUSY_TIMEOUT_S = 60.0
# Page cache of a writer's connection (KiB): big batches touch many B-tree pages of the table and its indexes.
SQLITE_CACHE_KIB = 65_536


class OnlineWriter(ABC):
    """Writes change-point rows of one FeatureView into an online store.

    Input rows: a pandas DataFrame with the join-key columns, `window_end` (UTC datetime64; naive values are
    taken as UTC) and one column per feature (scalars, None/NaN for null, lists or arrays for list features,
    dicts or (key, count) pairs for map features).
    """

    # Whether many processes may write at once; engines funnel the writes of a serial store into one task.
    parallel: ClassVar[bool] = False

    def __init__(self, view: str, join_keys: Mapping[str, DType], features: Mapping[str, DType]) -> None:
        self.view = view
        self.join_keys = dict(join_keys)
        self.features = dict(features)
        for name, dtype in self.join_keys.items():
            if dtype is DType.TIMESTAMP:
                raise ConfigError(
                    f"FeatureGroup({view!r}): join key {name!r} is a timestamp, which the online writer does not "
                    "store as a key; use a string, number or boolean key"
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

    def only(self, names: Sequence[str]) -> OnlineWriter:
        """A writer of these features alone, on connections of its own: the store's values of the others stay as
        they are."""
        narrowed = copy.copy(self)
        narrowed.__dict__.update(self.__getstate__())  # no connection shared with this writer
        narrowed.features = {n: self.features[n] for n in names}
        return narrowed

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
        created = feast_epoch(datetime.now(UTC))
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
        event_ts = feast_epoch_seconds(rows[WINDOW_END])
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
        header = b"".join(resp_bulk(a) for a in [f"_ts:{self.view_name}".encode(), b"%d" % self.key_ttl_seconds])
        header += b"".join(resp_bulk(field) for field in self._fields())
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
                head = b"$7\r\nEVALSHA\r\n" + resp_bulk(self._sha.encode())
                fixed = 5 + len(self.features)  # EVALSHA, sha, key count, ts field, ttl, the field names
                for n_keys, arguments in calls():
                    count = b"*%d\r\n" % (fixed + n_keys * (2 + len(self.features)))  # + keys, times, values
                    connection.send_packed_command([count + head + resp_bulk(b"%d" % n_keys) + arguments], False)
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
            from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
            from redis.exceptions import RedisError
            from redis.retry import Retry
            from redis.sentinel import Sentinel

            nodes, options = RedisOnlineStore._parse_connection_string(self.connection_string)
            try:
                if self.redis_type == "redis_sentinel":
                    sentinel = Sentinel([(n["host"], int(n["port"])) for n in nodes], **options)
                    client = sentinel.master_for(self.sentinel_master)
                else:
                    # The first call fails at once when nothing listens there (redis-py's default retries back off
                    # for about 10 s); the writes after it retry as redis-py does by default.
                    client = Redis(
                        host=nodes[0]["host"], port=int(nodes[0]["port"]), retry=Retry(NoBackoff(), 0), **options
                    )
                self._sha = client.script_load(guarded_hset_lua(len(self.features)))
                client.set_retry(Retry(ExponentialWithJitterBackoff(base=1, cap=10), 3))
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
