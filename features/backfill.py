"""Backfill: compute a group's change points for [start, end), replace them in the offline table, and bring
the online store up to each key's value as of `end`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pandas as pd
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from features.engine.batch import change_points
from features.engine.session import get_spark
from features.engine.source import read_events
from features.errors import ConfigError
from features.offline import replace_range
from features.progress import spark_progress
from features.repo import Repo

if TYPE_CHECKING:
    from features.online import OnlineWriter
from features.spec import WINDOW_END, FeatureGroup


@dataclass(frozen=True)
class BackfillResult:
    group: str
    start: datetime
    end: datetime
    rows_in: int
    rows_out: int
    online_rows: int
    seconds: float

    def summary(self) -> str:
        return (
            f"{self.group}: {self.rows_in:,} events in, {self.rows_out:,} change points out "
            f"for [{self.start.isoformat()}, {self.end.isoformat()}), "
            f"{self.online_rows:,} keys online, {self.seconds:.1f}s"
        )


def parse_time(value: str | datetime, field: str) -> datetime:
    """An ISO-8601 time as an aware UTC datetime (naive input is taken as UTC)."""
    if isinstance(value, datetime):
        parsed = value
    else:
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(
                f"{field}: {value!r} is not an ISO-8601 time; write e.g. 2026-01-31 or 2026-01-31T06:00"
            ) from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def micros(t: datetime) -> int:
    return int(t.timestamp()) * 1_000_000 + t.microsecond


def backfill(
    repo: Repo,
    start: str | datetime,
    end: str | datetime,
    groups: list[str] | None = None,
    *,
    spark: SparkSession | None = None,
    online: bool = True,
    progress: bool | None = None,
) -> list[BackfillResult]:
    """Backfill the named groups (all by default) over [start, end)."""
    start_t, end_t = parse_time(start, "--start"), parse_time(end, "--end")
    if start_t >= end_t:
        raise ConfigError(f"--start {start_t.isoformat()} is not before --end {end_t.isoformat()}; swap them")
    selected = repo.select(groups)
    if online:  # fail before Spark starts when a store cannot take writes (e.g. the repo was never applied)
        for group in selected:
            ready_writer(repo, group)
    spark = spark or get_spark()
    return [backfill_group(spark, repo, g, start_t, end_t, online=online, progress=progress) for g in selected]


def ready_writer(repo: Repo, group: FeatureGroup) -> OnlineWriter:
    """The group's online writer, checked to be able to write (types from the declared or stored schema)."""
    from features.feast_objects import source_schema
    from features.online import online_writer

    writer = online_writer(repo, group, group.output_types(source_schema(group, repo.root)))
    writer.check_ready()
    return writer


def backfill_group(
    spark: SparkSession,
    repo: Repo,
    group: FeatureGroup,
    start: datetime,
    end: datetime,
    *,
    online: bool = True,
    progress: bool | None = None,
) -> BackfillResult:
    began = time.perf_counter()
    events = read_events(spark, group, repo.source_path(group))
    writer = ready_writer(repo, group) if online else None
    with spark_progress(spark, f"backfill {group.name}", progress):
        computed = change_points(group, events, micros(start), micros(end))
        points = computed.rows.persist()
        try:
            rows_out = replace_range(spark, points, repo.offline_path(group), start, end)
            online_rows = 0 if writer is None else write_latest(writer, group, points)
        finally:
            points.unpersist()
    rows_in = computed.events_read()
    return BackfillResult(group.name, start, end, rows_in, rows_out, online_rows, time.perf_counter() - began)


def latest_rows(group: FeatureGroup, points: DataFrame) -> DataFrame:
    """Each key's newest change point: its value as of the range end."""
    keys = list(group.join_keys)
    newest = Window.partitionBy(*keys).orderBy(F.col(WINDOW_END).desc())
    return points.withColumn("_rank", F.row_number().over(newest)).where(F.col("_rank") == 1).drop("_rank")


def write_latest(writer: OnlineWriter, group: FeatureGroup, points: DataFrame) -> int:
    """Write each key's newest value to the online store from the executors; returns rows written."""
    rows = latest_rows(group, points)
    if not writer.parallel:
        rows = rows.coalesce(1)  # a serial store (SQLite) takes one writer at a time

    def write(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        total = 0
        for batch in batches:
            batch[WINDOW_END] = pd.to_datetime(batch[WINDOW_END]).dt.tz_localize(UTC)
            total += writer.write(batch)
        yield pd.DataFrame({"written": [total]})

    return int(rows.mapInPandas(write, "written long").agg(F.sum("written")).first()[0] or 0)
