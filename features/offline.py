"""The offline change-point table: Parquet partitioned by `date=YYYY-MM-DD` (the window end's UTC date).

A backfill owns the rows with window ends in [start, end). Rewriting a range replaces exactly those rows:
every date partition the range touches is rebuilt (rows outside the range kept) into one file, written
aside and moved into place with an atomic rename, so a reader sees the old partition or the new one,
never a mix and never a duplicate (key, window_end) row.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from features.engine.batch import LATEST
from features.spec import WINDOW_END

DATE = "date"
PART_FILE = "part-0.parquet"


def dates_between(start: datetime, end: datetime) -> list[date]:
    """The UTC dates of window ends in [start, end)."""
    first = start.astimezone(UTC).date()
    last = (end.astimezone(UTC) - timedelta(microseconds=1)).date()
    return [first + timedelta(days=i) for i in range((last - first).days + 1)]


def partition_dir(table: str, day: date) -> Path:
    return Path(table) / f"{DATE}={day.isoformat()}"


def read_table(spark: SparkSession, table: str) -> DataFrame | None:
    """The whole offline table (with its `date` column), or None if nothing was written yet."""
    if not any(Path(table).glob(f"{DATE}=*/*.parquet")):
        return None
    return spark.read.option("basePath", table).parquet(str(Path(table) / f"{DATE}=*" / "*.parquet"))


ONLINE_ONLY = "online"  # staged copies of each key's newest row: its value as of `end`, not part of the range
TASK = "_task"  # the write task (and so the partition) of a staged row
TASKS = "_tasks"  # staging subfolder the write tasks write into


def _owned_partially(days: list[date], start: datetime, end: datetime) -> list[str]:
    """Dates whose partition also holds rows outside [start, end) (the range starts or ends mid-day)."""
    out = []
    if start != datetime.combine(days[0], datetime.min.time(), UTC):
        out.append(days[0].isoformat())
    if end != datetime.combine(days[-1] + timedelta(days=1), datetime.min.time(), UTC):
        out.append(days[-1].isoformat())
    return out


def replace_range(
    spark: SparkSession,
    rows: DataFrame,
    table: str,
    start: datetime,
    end: datetime,
    on_staged: Callable[[DataFrame, DataFrame], bool] | None = None,
    on_swapped: Callable[[date], None] | None = None,
) -> int:
    """Make `rows` with window ends in [start, end) the table's content for that range; returns their count.
    `rows` carries the boolean column `LATEST` (features.engine.batch): true on a copy of each key's newest row
    (window end <= `end`), its value as of `end` for the online store.

    The new partitions are staged beside the table (never under it, where readers' globs would see them),
    then swapped in. `on_staged` gets, before the swap, the staged rows with window ends in [start, end] (those
    at `end` included) and the newest-row copies, so that one computation feeds validation and both stores; when
    it returns False, the staged rows are dropped and the table is left as it was (the result is then 0).
    `on_swapped` gets each date right after its partition was swapped in (dates in order), so that a caller can
    record it before the next one: an interruption then loses at most the date being swapped."""
    days = dates_between(start, end)
    start_ts, end_ts = F.lit(start).cast("timestamp"), F.lit(end).cast("timestamp")
    latest = F.col(LATEST)
    in_range = (F.col(WINDOW_END) >= start_ts) & (F.col(WINDOW_END) < end_ts)
    # The newest-row copies go to a partition of their own; a row at `end` is its key's newest, so only its copy.
    task = F.when(latest, F.lit(len(days))).otherwise(_day_index(days))
    staged = rows.where(latest | in_range).withColumn(TASK, task).drop(LATEST)
    partial = _owned_partially(days, start, end)
    existing = read_table(spark, table) if partial else None
    if existing is not None:
        outside = (F.col(WINDOW_END) < start_ts) | (F.col(WINDOW_END) >= end_ts)
        keep = existing.where(F.col(DATE).cast("string").isin(partial) & outside).withColumn(TASK, _day_index(days))
        staged = staged.unionByName(keep.select(*staged.columns))
    staging = Path(table).parent / "_staging" / f"{Path(table).name}-{uuid.uuid4().hex}"
    try:
        # One write task per date partition (adaptive execution cannot merge tasks of a fixed count), so the
        # dates are written in parallel and each becomes exactly one file that can be swapped atomically.
        # Not `partitionBy`: it would sort every task's rows by a date they all share.
        by_task = staged.repartitionById(len(days) + 1, TASK).drop(TASK)
        by_task.write.option("maxRecordsPerFile", 0).parquet(str(staging / TASKS))
        _place_task_files(staging, days)
        # The range's rows and the newest-row copies, not rows kept from a partition at or after `end` (they
        # belong to another range). The staged schema keeps `date` a string: Spark would infer a date type.
        schema = StructType([*by_task.schema.fields, StructField(DATE, StringType())])
        written = spark.read.schema(schema).parquet(str(staging))
        online_only = F.col(DATE) == ONLINE_ONLY
        new_rows = written.where(~online_only & in_range)
        newest = written.where(online_only).drop(DATE)
        at_end = newest.where(F.col(WINDOW_END) == end_ts)
        if on_staged is not None and not on_staged(new_rows.drop(DATE).unionByName(at_end), newest):
            return 0
        count = _footer_rows(staging, days) if not partial else new_rows.count()
        _swap_in(staging, table, days, on_swapped)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return count


def _day_index(days: list[date]) -> Column:
    """The index in `days` of a row's window end date (its partition)."""
    return F.date_diff(F.to_date(F.col(WINDOW_END)), F.lit(days[0].isoformat()).cast("date"))


def _place_task_files(staging: Path, days: list[date]) -> None:
    """Move each write task's file to its partition folder: task i wrote the rows of days[i], the last task
    the rows at `end`. Spark names a task's file part-<task index>-...; a task without rows wrote none."""
    labels = [day.isoformat() for day in days] + [ONLINE_ONLY]
    for produced in (staging / TASKS).glob("part-*.parquet"):
        task = int(produced.name.split("-")[1])
        folder = staging / f"{DATE}={labels[task]}"
        if folder.exists():
            raise AssertionError(f"two files for partition {folder.name}: one task per date was expected")
        folder.mkdir()
        produced.rename(folder / PART_FILE)
    shutil.rmtree(staging / TASKS)


def _footer_rows(staging: Path, days: list[date]) -> int:
    """Rows staged for whole days, from the Parquet footers (no pass over the data)."""
    import pyarrow.parquet as pq

    files = [f for day in days for f in (staging / f"{DATE}={day.isoformat()}").glob("*.parquet")]
    return sum(pq.ParquetFile(f).metadata.num_rows for f in files)


def _swap_in(staging: Path, table: str, days: list[date], on_swapped: Callable[[date], None] | None = None) -> None:
    for day in days:
        _swap_day(staging, table, day)
        if on_swapped is not None:
            on_swapped(day)


def _swap_day(staging: Path, table: str, day: date) -> None:
    produced = sorted((staging / f"{DATE}={day.isoformat()}").glob("*.parquet"))
    target = partition_dir(table, day)
    if not produced:
        _drop_partition(target)
        return
    target.mkdir(parents=True, exist_ok=True)
    # A dot-name is invisible to readers' "*.parquet" globs until the rename makes it the partition.
    tmp = target / f".{PART_FILE}.{uuid.uuid4().hex}.tmp"
    shutil.move(produced[0], tmp)
    os.replace(tmp, target / PART_FILE)
    for other in target.glob("*.parquet"):
        if other.name != PART_FILE:
            other.unlink()


def _drop_partition(target: Path) -> None:
    for old in target.glob("*.parquet"):
        old.unlink()
    if target.exists() and not any(target.iterdir()):
        target.rmdir()
