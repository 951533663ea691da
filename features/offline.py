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
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

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


def replace_range(spark: SparkSession, rows: DataFrame, table: str, start: datetime, end: datetime) -> int:
    """Make `rows` (window ends in [start, end)) the table's content for that range; returns how many rows
    the range now holds. `rows` should be persisted: it is read twice."""
    days = dates_between(start, end)
    start_ts, end_ts = F.lit(start).cast("timestamp"), F.lit(end).cast("timestamp")
    new = rows.where((F.col(WINDOW_END) >= start_ts) & (F.col(WINDOW_END) < end_ts))
    new = new.withColumn(DATE, F.date_format(F.col(WINDOW_END), "yyyy-MM-dd"))
    in_range = new.count()
    existing = read_table(spark, table)
    if existing is not None:
        keep = existing.where(
            F.col(DATE).cast("string").isin([d.isoformat() for d in days])
            & ((F.col(WINDOW_END) < start_ts) | (F.col(WINDOW_END) >= end_ts))
        ).withColumn(DATE, F.col(DATE).cast("string"))
        new = new.unionByName(keep.select(*new.columns))
    staging = Path(table) / f"_staging-{uuid.uuid4().hex}"
    # One task per date, so that every partition is exactly one file that can be swapped atomically.
    new.repartition(DATE).write.partitionBy(DATE).parquet(str(staging))
    _swap_in(staging, table, days)
    return in_range


def _swap_in(staging: Path, table: str, days: list[date]) -> None:
    try:
        for day in days:
            produced = sorted((staging / f"{DATE}={day.isoformat()}").glob("*.parquet"))
            target = partition_dir(table, day)
            if not produced:
                _drop_partition(target)
                continue
            target.mkdir(parents=True, exist_ok=True)
            # A dot-name is invisible to readers' "*.parquet" globs until the rename makes it the partition.
            tmp = target / f".{PART_FILE}.{uuid.uuid4().hex}.tmp"
            shutil.move(produced[0], tmp)
            os.replace(tmp, target / PART_FILE)
            for other in target.glob("*.parquet"):
                if other.name != PART_FILE:
                    other.unlink()
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _drop_partition(target: Path) -> None:
    for old in target.glob("*.parquet"):
        old.unlink()
    if target.exists() and not any(target.iterdir()):
        target.rmdir()
