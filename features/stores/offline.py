"""The offline change-point table: a Delta Lake table partitioned by `date` (the window end's UTC date).

Two kinds of writer share it, each a Delta commit, so readers see the table before a write or after it, never
part of one, on a local disk and an object store alike (docs/table-format.md):
  * a backfill owns the rows with window ends in [start, end): one commit replaces exactly those rows
    (`replaceWhere`; whole days by their partitions, a part of a day by its window ends) after they were
    validated. A stream's append that lands in those days while the backfill computes makes Delta refuse the
    backfill's commit (its isolation is serializable), and the commit is made again on the new version.
  * a stream appends each micro-batch's change points in one blind commit that records the stream and the
    batch id; after a restart the stream finds its last committed batch in the log, so a replayed batch is not
    written twice. It leaves out rows in the ranges backfills wrote (they hold every change point there), and
    if a backfill committed between its look at the log and its own commit, it takes its rows there out again.

What each commit wrote is in its commit info (`userMetadata`): the writer, the range or the batch, and what the
caller adds (the group, its definition hash). The log is read with `deltalake` (the library Feast reads the
table with), the data written and read with Spark; a stream's appends, and a local session's backfills, are written
by deltalake where it may (features.stores.driver_writes).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from features.errors import ConfigError, EnvironmentProblem
from features.spec import WINDOW_END
from features.spec.definitions import DATE, LATEST
from features.stores import driver_writes
from features.stores.delta_open import newest
from features.stores.earlier_tables import earlier_files

if TYPE_CHECKING:
    import pandas as pd
    from deltalake import DeltaTable

KEY = "features"  # the commit info's key for what this package wrote
BACKFILL, STREAM, MIGRATED = "backfill", "stream", "migrate"
MAX_FILES = 32  # a date's files from one write (its tasks) at most, and a stream's small files between compactions
ATTEMPTS = 5  # commits tried before a conflict is raised (each after the other writer's commit)
CHECKPOINT_INTERVAL = "100"  # commits between Delta's checkpoints (its default of 10 is one per 10 s at a 1 s trigger)
# Set by the table's first commit. Statistics of the window end alone, the column readers filter on (a training set's
# range, Feast's time bounds): statistics of every column cost the demo backfill's commits 0.2-0.4 s each.
TABLE_CONF = {"delta.checkpointInterval": CHECKPOINT_INTERVAL, "delta.dataSkippingStatsColumns": WINDOW_END}


def dates_between(start: datetime, end: datetime) -> list[date]:
    """The UTC dates of window ends in [start, end)."""
    first = start.astimezone(UTC).date()
    last = (end.astimezone(UTC) - timedelta(microseconds=1)).date()
    return [first + timedelta(days=i) for i in range((last - first).days + 1)]


# ---------------------------------------------------------------------------------------------------------
# Reading


def exists(table: str) -> bool:
    """Whether a Delta table is at `table` (a write made it). A ConfigError when `table` holds the Parquet folders
    an earlier version of features wrote, which `features migrate` converts."""
    from deltalake import DeltaTable

    if DeltaTable.is_deltatable(table):
        return True
    if earlier_files(table):
        raise ConfigError(
            f"the offline table {table} was written by an earlier version of features (Parquet folders, not a Delta "
            "table). Fix: convert it in place with `features migrate` (add --repo <repo> outside the repo folder)"
        )
    return False


def read_table(spark: SparkSession, table: str, version: int | None = None) -> DataFrame | None:
    """The whole offline table (with its `date` column), as of `version` if given (Delta's time travel), or None
    if nothing was written yet."""
    if not exists(table):
        return None
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    try:
        return reader.load(table)
    except Exception as exc:
        raise _without_delta(exc) from None


def current_version(table: str) -> int | None:
    """The table's newest version (its last commit), or None if nothing was written yet."""
    if not exists(table):
        return None
    from deltalake import DeltaTable

    return int(DeltaTable(table).version())


def version_at(table: str, moment: datetime) -> int | None:
    """The table's version at `moment`: that of its last commit made at or before it (None if the table was made
    later, or not at all)."""
    if not exists(table):
        return None
    from deltalake import DeltaTable

    history = DeltaTable(table).history()
    made = [int(c["version"]) for c in history if c["timestamp"] <= moment.timestamp() * 1000]
    return max(made) if made else None


def _loaded(table: str, version: int | None) -> DeltaTable:
    """The table as of `version` (the newest if None); a ConfigError naming the retention when the log or the
    data files of that version are gone."""
    from deltalake import DeltaTable

    try:
        return DeltaTable(table, version=version)
    except Exception as exc:
        if version is None:
            raise
        raise ConfigError(
            f"version {version} of the offline table {table} cannot be read ({exc}). Delta keeps the log of "
            "30 days and deleted files for 7 by default (the table properties delta.logRetentionDuration and "
            "delta.deletedFileRetentionDuration); a version older than either, or one not written yet, is gone. "
            "Fix: ask for a version the table still holds (`features status` lists the newest)"
        ) from None


def read_pandas(table: str, with_date: bool = False) -> pd.DataFrame:
    """The table's current rows as pandas (read without Spark), with the `date` partition column if asked; a map
    column's values as dicts (pyarrow's default is a list of (key, value) pairs)."""
    from deltalake import DeltaTable

    frame = DeltaTable(table).to_pyarrow_table().to_pandas(maps_as_pydicts="strict")
    return frame if with_date else frame.drop(columns=[DATE])


def rows_by_date(table: str, version: int | None = None) -> dict[date, int]:
    """Rows per date partition (as of `version` if given), from the log's file statistics (no data is read); {}
    when there is no table."""
    return _per_date(table, version, "num_records")


def files_per_date(table: str, smaller_than: int | None = None) -> dict[date, int]:
    """The active data files of each date partition (from the log; no data is read), only those of fewer than
    `smaller_than` bytes if given; {} without a table."""
    return _per_date(table, None, None, smaller_than)


def _per_date(table: str, version: int | None, weight: str | None, smaller_than: int | None = None) -> dict[date, int]:
    """The sum of the `weight` column of the table's active files per date partition (their count for None)."""
    if not exists(table):
        return {}
    import pyarrow as pa

    actions = pa.table(_loaded(table, version).get_add_actions(flatten=True)).to_pydict()
    days = actions[f"partition.{DATE}"]
    sizes = actions["size_bytes"]
    out: dict[date, int] = {}
    for value, n, size in zip(days, actions[weight] if weight else [1] * len(days), sizes, strict=True):
        if smaller_than is not None and size >= smaller_than:
            continue
        day = value if isinstance(value, date) else date.fromisoformat(str(value))
        out[day] = out.get(day, 0) + int(n or 0)
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class Commit:
    version: int
    info: Mapping[str, Any]  # what this package recorded ({} for a commit made by something else)

    @property
    def writer(self) -> str | None:
        return self.info.get("writer")

    def spans(self) -> list[tuple[datetime, datetime]]:
        """The ranges of window ends [start, end) the commit wrote for backfills: a backfill's range, or those of
        the backfills of a table `migrate` converted."""
        if self.writer == BACKFILL:
            return [(datetime.fromisoformat(self.info["start"]), datetime.fromisoformat(self.info["end"]))]
        if self.writer == MIGRATED:
            return [(datetime.fromisoformat(lo), datetime.fromisoformat(hi)) for lo, hi in self.info["ranges"]]
        return []


def commits(table: str | DeltaTable, limit: int | None = None) -> list[Commit]:
    """The table's commits the log still holds, newest first (at least `limit` of them), up to the version
    `table` was loaded at when it is a DeltaTable."""
    from deltalake import DeltaTable

    out = []
    for entry in (DeltaTable(table) if isinstance(table, str) else table).history(limit):
        try:
            info = json.loads(entry.get("userMetadata") or "{}").get(KEY, {})
        except (ValueError, AttributeError):
            info = {}
        out.append(Commit(int(entry["version"]), info if isinstance(info, dict) else {}))
    return out


# ---------------------------------------------------------------------------------------------------------
# Backfill: replace a range


class Staged:
    """A backfill's rows, staged to become the table's content for window ends in [start, end): computed once
    and kept (Spark's cache) until they are published or discarded, so that the one computation feeds validation
    and both stores. Nothing is written until `publish`. Use it as a context manager, so that the cache goes
    whatever happens.

    The rows given carry the boolean column `LATEST` (features.engine.batch): true on a copy of each key's newest
    row (window end <= `end`), its value as of `end` for the online store. `rows` are the rows to validate: those
    with window ends in [start, end] (the newest rows at `end` included, as the online store gets them).
    `newest` is each key's newest row as of `end`, the online store's value."""

    def __init__(self, rows: DataFrame, table: str, start: datetime, end: datetime, *, in_driver: bool = False) -> None:
        start_ts, end_ts = F.lit(start).cast("timestamp"), F.lit(end).cast("timestamp")
        latest = F.col(LATEST)
        in_range = (F.col(WINDOW_END) >= start_ts) & (F.col(WINDOW_END) < end_ts)
        self.table, self.start, self.end = table, start, end
        self._kept = rows.where(latest | in_range).persist()
        self._new_rows = self._kept.where(~latest).drop(LATEST)
        # A comparison, not the bare flag: Spark's cache skips its batches by their statistics for comparisons only,
        # and the kernel puts each bucket's newest-row copies after its rows, so they fill batches of their own.
        self.newest = self._kept.where(latest >= F.lit(True)).drop(LATEST)
        # One filter, not a union of the two: a screen of them then reads the cached rows once.
        self.rows = self._kept.where(~latest | (F.col(WINDOW_END) == end_ts)).drop(LATEST)
        self._in_driver = in_driver
        # Before a commit can write, Delta reads the table's log and its list of files (small Spark jobs, and driver
        # time between them): read now, beside the computation of the rows (not for deltalake's commit in the driver).
        self._warming = ThreadPoolExecutor(1, thread_name_prefix="features-delta-log")
        self._warmed = self._warming.submit(lambda: None if in_driver else _read_log(rows.sparkSession, table))

    @property
    def days(self) -> list[date]:
        """The dates whose partitions a publish replaces (in part at the ends of the range)."""
        return dates_between(self.start, self.end)

    def publish(
        self,
        info: Mapping[str, Any] | None = None,
        online: Callable[[DataFrame], None] | None = None,
        count: int | None = None,
    ) -> int:
        """One commit replaces the range with the rows; once it is made, `online` gets `newest` (the online store's
        write). A commit that fails raises before the online store is written, so that both stores stay as they
        were: the online store never serves values the table cannot reproduce. Returns the rows written to the table.

        `in_driver`: rows that `driver_writes.fits`, by `count` (validation's) or else counted in the cache, are
        collected to the driver and written by deltalake (features.stores.driver_writes)."""
        self._warmed.result()
        meta = {**(info or {}), "writer": BACKFILL, "start": self.start.isoformat(), "end": self.end.isoformat()}
        condition = _range_condition(self.start, self.end)
        if self._in_driver and count is None:
            count = self._kept.count()
        small = self._in_driver and count is not None and driver_writes.fits(self._new_rows, count)
        written: int | None = None  # by deltalake; Spark's commit records its count in the log

        def commit() -> None:
            nonlocal written
            written = _replace(self._new_rows, self.table, condition, meta, in_driver=small)

        _retried(commit)
        if online is not None:
            online(self.newest)
        if written is not None:
            return written
        count = _rows_written(self.table, meta)
        if count is None:  # the log no longer shows the commit (a burst of other writers): count the rows
            count = self._new_rows.count()
        return count

    def discard(self) -> None:
        # The read ahead's error, if any, is raised by `publish` only: it only read the log, and without a publish
        # (a batch set aside) nothing reads it again.
        self._warming.shutdown(wait=True)
        self._kept.unpersist()

    def __enter__(self) -> Staged:
        return self

    def __exit__(self, *exc: object) -> None:
        self.discard()


def replace_range(
    spark: SparkSession,
    rows: DataFrame,
    table: str,
    start: datetime,
    end: datetime,
    info: Mapping[str, Any] | None = None,
) -> int:
    """Stage and publish `rows` (see `Staged`), unvalidated; returns the rows written."""
    with Staged(rows, table, start, end) as staged:
        return staged.publish(info)


def _read_log(spark: SparkSession, table: str) -> None:
    """Have Spark's Delta read the table's log and list its files (it keeps both for the next commit)."""
    if exists(table):
        try:
            spark.read.format("delta").load(table).inputFiles()
        except Exception as exc:
            raise _without_delta(exc) from None


def _rows_written(table: str, meta: Mapping[str, Any]) -> int | None:
    """The rows the newest commit recording `meta` wrote, from its metrics in the log (no Spark job)."""
    from deltalake import DeltaTable

    for entry in DeltaTable(table).history(10):
        try:
            info = json.loads(entry.get("userMetadata") or "{}").get(KEY)
        except (ValueError, AttributeError):
            continue
        written = (entry.get("operationMetrics") or {}).get("numOutputRows")
        if info == dict(meta) and written is not None:
            return int(written)
    return None


def _range_condition(start: datetime, end: datetime) -> str:
    """The rows of [start, end): whole days by their partitions alone (Delta then drops whole files without
    reading them), a part of a day by the window ends too (Delta rewrites that day's files without them)."""
    days = dates_between(start, end)
    condition = f"{DATE} >= '{days[0].isoformat()}' AND {DATE} <= '{days[-1].isoformat()}'"
    whole = start == _midnight(days[0]) and end == _midnight(days[-1] + timedelta(days=1))
    if whole:
        return condition
    return f"{condition} AND {_window_ends(start, end)}"


def _window_ends(start: datetime, end: datetime) -> str:
    return f"{WINDOW_END} >= '{_sql_time(start)}' AND {WINDOW_END} < '{_sql_time(end)}'"


def _sql_time(moment: datetime) -> str:
    """A UTC timestamp literal (the session's time zone is UTC: features.engine.session)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def _midnight(day: date) -> datetime:
    return datetime.combine(day, datetime.min.time(), UTC)


def _replace(
    rows: DataFrame, table: str, condition: str, meta: Mapping[str, Any], in_driver: bool = False
) -> int | None:
    """One commit: the rows matching `condition` become `rows` (the table is made if there is none), `in_driver` by
    deltalake where it may (returning the rows written), else by Spark (None), a file per date from each partition
    (at most MAX_FILES): a shuffle to one file per date cost the demo 0.3 s a group and funnels a day through a task."""
    made, dated = exists(table), _dated(rows)  # exists first: an earlier version's folders are refused
    if in_driver:
        recorded = _user_metadata(meta)
        if not made:
            return driver_writes.create(table, dated, recorded, partition_by=[DATE], configuration=TABLE_CONF)
        written = driver_writes.replace(table, dated, condition, recorded)
        if written is not None:
            return written
    writer = _writer(dated.coalesce(MAX_FILES), meta)
    if made:
        writer.mode("overwrite").option("replaceWhere", condition).save(table)
    else:
        _create(writer, table)
    return None


def _writer(rows: DataFrame, meta: Mapping[str, Any]) -> Any:
    """A Delta writer of `rows` whose commit records `meta`; a feature added to the group adds its column."""
    return rows.write.format("delta").option("userMetadata", _user_metadata(meta)).option("mergeSchema", "true")


def _user_metadata(meta: Mapping[str, Any]) -> str:
    return json.dumps({KEY: dict(meta)})


def create_table(rows: DataFrame, table: str, meta: Mapping[str, Any]) -> None:
    """A new table holding `rows` (one file per date), its first commit recording `meta`."""
    _create(_writer(_dated(rows).repartition(DATE), meta), table)


def _create(writer: Any, table: str) -> None:
    writer.mode("append").partitionBy(DATE).options(**TABLE_CONF).save(table)


def _dated(rows: DataFrame) -> DataFrame:
    """`rows` with their `date`, strings as plain strings: a Spark Connect client's string type names its
    collation, which Delta then records in the table's schema, where deltalake (and so Feast) cannot read it."""
    strings = {name for name, kind in rows.dtypes if kind.startswith("string")}
    columns = [
        F.expr(f"CAST(`{name}` AS STRING)").alias(name) if name in strings else F.col(name) for name in rows.columns
    ]
    return rows.select(*columns, F.to_date(F.col(WINDOW_END)).alias(DATE))


def _retried(commit: Callable[[], None]) -> None:
    """Run `commit` again when Delta refused it for another writer's concurrent commit."""
    for attempt in range(ATTEMPTS):
        try:
            commit()
            return
        except Exception as exc:
            if attempt == ATTEMPTS - 1 or not is_conflict(exc):
                raise _without_delta(exc) from None
            time.sleep(0.05 * (attempt + 1))


def _without_delta(exc: Exception) -> Exception:
    """`exc`, or the one-line fix when it is Spark not knowing the Delta data source (a session of the user's)."""
    text = str(exc)
    if ("DATA_SOURCE_NOT_FOUND" in text and "delta" in text.lower()) or "delta.DefaultSource" in text:
        return EnvironmentProblem(
            "the Spark session has no Delta Lake, which the offline tables are. Fix: start it with --packages "
            "io.delta:delta-spark_2.13:4.4.0 --conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension "
            "--conf spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog (Databricks "
            "runtimes have it; a local session started by features has it)"
        )
    return exc


def is_conflict(exc: BaseException) -> bool:
    """Whether `exc` is Delta refusing a commit because another one came first (retrying it is safe)."""
    text = f"{type(exc).__name__} {exc}"
    marks = (
        "DELTA_CONCURRENT",
        "ConcurrentAppend",
        "ConcurrentDelete",
        "DELTA_METADATA_CHANGED",
        "ProtocolChanged",
        "CommitFailedError",  # deltalake's (a stream's compaction round, features.stores.compaction)
    )
    return any(mark in text for mark in marks)


# ---------------------------------------------------------------------------------------------------------
# Stream: append micro-batches


@dataclass
class StreamLog:
    """What a stream knows of the table's log: the ranges backfills own, the newest version it has seen, and the
    last batch it committed itself. `refresh` reads the commits after `version` (features.stores.offline.commits)."""

    table: str
    stream: str  # the stream's id (a new checkpoint gets a new one)
    version: int = -1
    spans: list[tuple[datetime, datetime]] = field(default_factory=list)
    last_batch: int | None = None
    last_upto: int | None = None  # the watermark (µs) the last batch's commits emitted up to, where they say

    def refresh(self) -> list[Commit]:
        """Read the commits made since the last refresh, oldest first (the first time, all the log holds: every
        backfill's range counts); returns them."""
        if not exists(self.table):
            return []
        table = newest(self.table)
        unseen = table.version() - self.version
        if unseen <= 0:
            return []
        found = commits(table, None if self.version < 0 else unseen)
        new = sorted((c for c in found if c.version > self.version), key=lambda c: c.version)
        for commit in new:
            self.spans.extend(commit.spans())
            if commit.writer == STREAM and commit.info.get("stream") == self.stream:
                batch, upto = int(commit.info["batch"]), commit.info.get("upto_us")
                if self.last_batch is None or batch > self.last_batch:
                    self.last_batch, self.last_upto = batch, upto
                elif batch == self.last_batch and upto is not None:
                    self.last_upto = max(self.last_upto or upto, upto)
        if new:
            self.version = new[-1].version
        return new


def completed_days(table: str, group: str) -> list[tuple[datetime, datetime]]:
    """The days the group's manifest records as completed by a backfill, as ranges of window ends: they hold
    when the log no longer has the commits that wrote them (Delta drops old log entries)."""
    from features.stores.manifest import read_manifest

    return [(_midnight(day), _midnight(day + timedelta(days=1))) for day in read_manifest(table, group).completed()]


def not_backfilled(rows: DataFrame, spans: list[tuple[datetime, datetime]]) -> DataFrame:
    """Leave out rows in ranges a backfill wrote: a backfill's commit holds every change point of its range, so
    the stream's rows there (a replay of old files, a restart with --reset, a day backfilled while streaming)
    would only repeat them."""
    if not spans:
        return rows
    end = F.col(WINDOW_END)
    inside = F.lit(False)
    for lo, hi in merge_spans(spans):
        inside = inside | ((end >= F.lit(lo).cast("timestamp")) & (end < F.lit(hi).cast("timestamp")))
    return rows.where(~inside)


def merge_spans(spans: list[tuple[datetime, datetime]]) -> list[tuple[datetime, datetime]]:
    out: list[tuple[datetime, datetime]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def append_batch(
    spark: SparkSession,
    rows: DataFrame,
    log: StreamLog,
    batch_id: int,
    count: int | None = None,
    upto_us: int | None = None,
    handed_us: int | None = None,
) -> int:
    """Append one micro-batch's change points (outside the ranges `log` knows backfills own) in one commit that
    records the stream, `batch_id` and the watermark the batch emitted up to (`upto_us`); returns the rows
    appended. A replay of the batch the log shows committed last (a restart) appends only its rows after the
    watermark that commit reached: none, unless a later version of features emits further (that commit's record,
    else `handed_us`, the watermark Spark handed the batch, up to which earlier versions emitted). Call
    `log.refresh()` first: a backfill that committed after it and before this append is found afterwards, and
    this batch's rows in its range taken out. `count`: the rows' count if the caller knows it."""
    if log.last_batch is not None and batch_id < log.last_batch:
        return 0
    if log.last_batch == batch_id:
        reached = log.last_upto if log.last_upto is not None else handed_us
        if upto_us is None or reached is None or upto_us <= reached:
            return 0
        rows, count = rows.where(F.col(WINDOW_END) > F.lit(datetime.fromtimestamp(reached / 1e6, UTC))), None
    # Without backfilled ranges to leave out, rows the caller counted are written as they are; else the rows
    # kept are cached and counted, so that an empty batch makes no commit and a late correction reads them again.
    cached = count is None or bool(log.spans)
    kept = not_backfilled(rows, log.spans).persist() if cached else rows
    try:
        if cached:
            count = kept.count()
        if count:
            meta = {"writer": STREAM, "stream": log.stream, "batch": batch_id}
            if upto_us is not None:
                meta["upto_us"] = upto_us
            _retried(lambda: _append(kept, log.table, meta, count))
            after = log.refresh()
            mine = next((c.version for c in after if dict(c.info) == meta), None)
            for commit in after:
                for span in commit.spans() if mine is not None and commit.version < mine else []:
                    _take_out(spark, kept, log.table, span)
        log.last_batch, log.last_upto = batch_id, upto_us
        return count
    finally:
        if cached:
            kept.unpersist()


def _append(rows: DataFrame, table: str, meta: Mapping[str, Any], count: int) -> None:
    """A micro-batch of `count` rows written as one file per date, which features.stores.compaction counts on: by
    deltalake in the driver where it may and the rows fit there (features.stores.driver_writes; a first batch over
    weeks of history does not), else by one Spark task."""
    dated = _dated(rows)
    if not exists(table):
        _create(_writer(dated.coalesce(1), meta), table)
    elif not driver_writes.fits(rows, count) or not driver_writes.append(table, dated, _user_metadata(meta)):
        _writer(dated.coalesce(1), meta).mode("append").save(table)


def _take_out(spark: SparkSession, appended: DataFrame, table: str, span: tuple[datetime, datetime]) -> None:
    """Remove the rows `appended` put in the range of a backfill that committed just before them: the range's
    rows become the table's rows there less one copy of each appended row (a multiset difference, so the
    backfill's own equal rows stay)."""
    lo, hi = span
    mine = appended.where(F.expr(_window_ends(lo, hi)))
    if mine.isEmpty():
        return
    condition = f"{_range_condition(lo, hi)} AND {_window_ends(lo, hi)}"

    def commit() -> None:
        current = spark.read.format("delta").load(table).where(condition).drop(DATE)
        kept = current.exceptAll(mine.select(*current.columns)).localCheckpoint()
        _replace(kept, table, condition, {"writer": STREAM, "correction": True})

    _retried(commit)


def remove_stream_rows(spark: SparkSession, table: str, spans: list[tuple[datetime, datetime]]) -> None:
    """Remove every row outside the ranges backfills own (what streams wrote): a stream started over from its
    source writes them again."""
    if not exists(table):
        return
    inside = " OR ".join(f"({_window_ends(lo, hi)})" for lo, hi in merge_spans(spans))
    condition = f"NOT ({inside})" if inside else "true"
    empty = spark.read.format("delta").load(table).limit(0).drop(DATE)
    _retried(lambda: _replace(empty, table, condition, {"writer": STREAM, "reset": True}))
