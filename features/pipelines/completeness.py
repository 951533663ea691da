"""When a day is complete: when its data is in, not merely when the clock has passed it (docs/operations.md,
"When a day is complete").

A day D is complete once the group's data has gone one source `watermark` past D's end:
- a group that streams (it has a stream checkpoint): the stream's emitted watermark is at or past D's end, so the
  stream takes no more events for D (a later one goes to the late folder, and makes D stale);
- a group that only backfills: the source holds an event at or after D's end plus the watermark (its newest event
  time, read from the Parquet files' footers, or by Spark for other formats);
and, in both cases, the clock has passed D's end by the watermark too (a timestamp in the future proves nothing).
Files that land late (an upstream outage, a delayed export) therefore leave their days waiting instead of letting a
backfill complete them empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from features.pipelines.days import DAY, midnight
from features.repo import Repo
from features.spec import FeatureGroup

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class DataHorizon:
    """What says how far a group's data is in, and the last complete day it gives."""

    group: FeatureGroup
    now: datetime
    streamed: bool  # the group has a stream checkpoint: its watermark decides
    stream_watermark: datetime | None  # that stream's emitted watermark (None before its first)
    newest_event: datetime | None  # the newest event time in the source (None: no events)

    @property
    def data_until(self) -> datetime | None:
        """Every event before this time is in (None: nothing is)."""
        if self.streamed:
            return self.stream_watermark
        if self.newest_event is None:
            return None
        return self.newest_event - timedelta(seconds=self.group.source.watermark_s)

    @property
    def clock_day(self) -> date:
        """The last day that ended one watermark ago: the most the clock allows to be complete."""
        return (self.now - timedelta(seconds=self.group.source.watermark_s)).date() - DAY

    @property
    def last_day(self) -> date | None:
        """The last complete day, or None when no day is complete yet."""
        until = self.data_until
        if until is None:
            return None
        return min(self.clock_day, until.astimezone(UTC).date() - DAY)

    @property
    def behind_clock(self) -> bool:
        """The data, not the clock, holds the last complete day back."""
        return self.last_day is None or self.last_day < self.clock_day

    def complete(self, day: date) -> bool:
        last = self.last_day
        return last is not None and day <= last

    def waiting(self) -> str:
        """Why the day after the last complete one is not complete yet, for plans and status."""
        nxt = (self.last_day + DAY) if self.last_day is not None else None
        if self.streamed:
            wm = f"{self.stream_watermark:%Y-%m-%d %H:%M} UTC" if self.stream_watermark else "none yet"
            what = f"the stream's watermark is {wm}"
        elif self.newest_event is None:
            what = "the source has no events"
        else:
            what = f"the source ends {self.newest_event:%Y-%m-%d %H:%M} UTC"
        day = f"{nxt.isoformat()} is" if nxt is not None else "no day is"
        return f"waiting for data: {what}; {day} complete once it is one watermark past the day's end"

    def complete_at(self, day: date) -> str:
        """When `day` becomes complete, in words."""
        edge = midnight(day + DAY) + timedelta(seconds=self.group.source.watermark_s)
        if self.streamed:
            return f"once the stream's watermark passes {midnight(day + DAY):%Y-%m-%d %H:%M} UTC"
        return f"once the source holds events at or after {edge:%Y-%m-%d %H:%M} UTC"


def data_horizon(
    repo: Repo, group: FeatureGroup, now: datetime, spark: SparkSession | None = None, *, scan: bool = True
) -> DataHorizon:
    """The group's horizon: its stream's watermark when it streams, else its source's newest event (Parquet
    footers; a Spark scan of other formats when `scan`, else taken as the clock's)."""
    from features.pipelines.stream.batch_progress import emitted_watermark

    now = now.astimezone(UTC)
    query = Path(repo.checkpoint_path(group)) / "query"
    if query.is_dir():
        return DataHorizon(group, now, True, emitted_watermark(query), newest_event(repo, group))
    newest = newest_event(repo, group)
    if newest is None and group.source.format != "parquet":
        newest = _scanned_newest(repo, group, spark, now) if scan else now
    return DataHorizon(group, now, False, None, newest)


def newest_event(repo: Repo, group: FeatureGroup) -> datetime | None:
    """The newest event time in the group's Parquet source, from the files' footers where they hold statistics
    (None for other formats, or a source without events). A file Parquet cannot open is skipped: the jobs set it
    aside."""
    import pyarrow.parquet as pq

    folder = Path(repo.source_path(group))
    if group.source.format != "parquet" or not folder.is_dir():
        return None
    newest: datetime | None = None
    for file in sorted(folder.rglob("*.parquet")):
        if any(p.startswith((".", "_")) for p in file.relative_to(folder).parts):
            continue
        try:
            parquet = pq.ParquetFile(file)
            found = _footer_max(parquet, group.source.timestamp)
            if found is None:  # no statistics (or a string column): read the column of this one file
                found = _column_max(file, group.source.timestamp)
        except (OSError, ValueError):
            continue
        if found is not None and (newest is None or found > newest):
            newest = found
    return newest


def _scanned_newest(repo: Repo, group: FeatureGroup, spark: SparkSession | None, now: datetime) -> datetime | None:
    """The newest good event time of a source Parquet footers cannot tell (JSON lines), read by Spark."""
    from pyspark.sql import functions as F

    from features.engine.session import get_spark
    from features.engine.source import read_source

    spark = spark or get_spark()
    events = read_source(spark, group, repo.source_path(group), now=now).events
    newest = events.agg(F.max(F.unix_micros(F.col(group.source.timestamp).cast("timestamp")))).first()[0]
    return None if newest is None else datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=int(newest))


def _column_max(file: Path, column: str) -> datetime | None:
    import pandas as pd
    import pyarrow.parquet as pq

    if column not in pq.ParquetFile(file).schema_arrow.names:
        return None
    values = pd.to_datetime(pq.read_table(file, columns=[column]).column(0).to_pandas(), utc=True, errors="coerce")
    newest = values.max()
    return None if pd.isna(newest) else newest.to_pydatetime()


def _footer_max(parquet: Any, column: str) -> datetime | None:
    import pyarrow as pa

    schema = parquet.schema_arrow
    if column not in schema.names or not pa.types.is_timestamp(schema.field(column).type):
        return None
    index = schema.get_field_index(column)
    meta = parquet.metadata
    found = None
    for i in range(meta.num_row_groups):
        stats = meta.row_group(i).column(index).statistics
        if stats is None or not stats.has_min_max:
            return None
        value = stats.max
        value = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        found = value if found is None or value > found else found
    return found
