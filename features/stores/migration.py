"""Offline tables of earlier versions of features (Parquet folders `date=YYYY-MM-DD/*.parquet`, before the table
was Delta Lake) converted in place: `features migrate` (docs/table-format.md)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from features.spec import WINDOW_END
from features.stores import offline
from features.stores.earlier_tables import earlier_files, earlier_stream_file, filesystem

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def needs_migration(table: str) -> bool:
    """Whether `table` holds Parquet folders an earlier version of features wrote (and no Delta table)."""
    from deltalake import DeltaTable

    return not DeltaTable.is_deltatable(table) and bool(earlier_files(table))


def migrate(spark: SparkSession, table: str) -> int:
    """Rewrite the Parquet folders of an earlier version as a Delta table in the same folder; returns the files
    converted (0 when there was nothing to convert). The rows are read and written by Spark in one commit, then
    the old files are deleted (Delta's own CONVERT TO DELTA records statistics other readers of the table, such
    as deltalake, cannot parse). The commit records the ranges the earlier backfills wrote (their files' first
    and last window ends; the stream's files are named stream-b*), which streams leave to them as they leave a
    backfill's. Interrupted before its commit, it can be run again; after it, the old files are ignored."""
    from deltalake import DeltaTable

    files = [] if DeltaTable.is_deltatable(table) else earlier_files(table)  # one listing of the folder
    if not files:
        return 0
    ranges = [[lo.isoformat(), hi.isoformat()] for lo, hi in offline.merge_spans(_backfill_ranges(table, files))]
    old = spark.read.option("basePath", table).option("mergeSchema", "true").parquet(*files)
    rows = old.drop(offline.DATE).localCheckpoint()
    offline.create_table(rows, table, {"writer": offline.MIGRATED, "ranges": ranges})
    fs, _ = filesystem(table)
    for path in files:
        fs.delete_file(path)
    return len(files)


def _backfill_ranges(table: str, files: list[str]) -> list[tuple[datetime, datetime]]:
    """[first, last] window end of each backfill file, as [first, last + 1 microsecond)."""
    import pyarrow.parquet as pq

    fs, _ = filesystem(table)
    out = []
    for path in files:
        if earlier_stream_file(path.rsplit("/", 1)[-1]):
            continue
        with fs.open_input_file(path) as handle:
            meta = pq.ParquetFile(handle).metadata
        column = meta.schema.names.index(WINDOW_END)
        stats = [meta.row_group(i).column(column).statistics for i in range(meta.num_row_groups)]
        stats = [s for s in stats if s is not None and s.has_min_max]
        if stats:
            lo, hi = min(s.min for s in stats), max(s.max for s in stats)
            out.append((_utc(lo), _utc(hi) + timedelta(microseconds=1)))
    return out


def _utc(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
