"""The SQLite online store's writer: multi-row upserts in the B-tree order of the table Feast's SQLite online
store made for the view, the whole batch in one transaction, the next part encoded while SQLite writes the
previous one, each guarded by event time (features.stores.online). SQLite takes one writer at a time."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from itertools import chain, repeat
from pathlib import Path
from typing import Any, ClassVar, TypeVar
from urllib.parse import quote

import pandas as pd

from features.errors import ConfigError
from features.spec import WINDOW_END, DType
from features.stores.feast_codec import encode_values, entity_keys, feast_epoch, feast_epoch_seconds
from features.stores.online_interface import OnlineWriter

T = TypeVar("T")

# How long a writer waits for another writer's lock (other Spark tasks, `feast materialize`) before failing.
SQLITE_BUSY_TIMEOUT_S = 60.0
# Page cache of a writer's connection (KiB): big batches touch many B-tree pages of the table and its indexes.
SQLITE_CACHE_KIB = 65_536


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


def _quote_id(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'
