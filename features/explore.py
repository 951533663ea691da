"""A preview of a group's change points on events in hand (pandas or Spark), with nothing written: what a
notebook explores before `features backfill` writes the same rows to the stores.

Runs on any session, classic or Spark Connect: a Spark DataFrame brings its own (`df.sparkSession`), pandas
events go to the session given or the one `get_spark` finds (the active one on Databricks).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from features.errors import ConfigError
from features.spec import WINDOW_END, FeatureGroup

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession


def preview(
    group: FeatureGroup,
    events: pd.DataFrame | DataFrame,
    start: str | datetime,
    end: str | datetime,
    *,
    spark: SparkSession | None = None,
) -> pd.DataFrame | DataFrame:
    """The change points of `group` with window ends in [start, end) computed from `events`: the rows a
    backfill of that range writes to the offline table (one per key and window end at which some feature
    changes; a feature's value at `t` is the latest row with `window_end <= t`). Nothing is written.

    `events` holds the source's columns, as a pandas or a Spark DataFrame; the result is of the same kind (pandas
    sorted by key and window end, `window_end` in UTC). Events before `start` count as history: pass everything
    from `start` minus the longest window (all of it for a Lifetime feature). Records a backfill would set aside
    as bad (no key or timestamp, ...) are left out. `start`/`end`: ISO-8601 or datetimes, naive means UTC."""
    from features.pipelines.backfill import micros, parse_time

    start_t, end_t = parse_time(start, "start"), parse_time(end, "end")
    if start_t >= end_t:
        raise ConfigError(f"end: {end_t.isoformat()} is not after start {start_t.isoformat()}; pass a later end")
    frame, from_pandas = _as_spark(events, spark)
    rows = _change_points(group, frame, micros(start_t), micros(end_t))
    if not from_pandas:
        return rows
    return _sorted_pandas(group, rows)


def _as_spark(events: object, spark: SparkSession | None) -> tuple[DataFrame, bool]:
    """`events` as a Spark DataFrame, and whether it came as pandas."""
    import pandas as pd

    if isinstance(events, pd.DataFrame):
        from features.engine.session import get_spark

        return (spark or get_spark()).createDataFrame(events), True
    if hasattr(events, "sparkSession") and hasattr(events, "schema"):  # classic or Spark Connect DataFrame
        return events, False  # type: ignore[return-value]
    raise ConfigError(f"events: a {type(events).__name__} is not a table of events; pass a pandas or Spark DataFrame")


def _change_points(group: FeatureGroup, events: DataFrame, start_us: int, end_us: int) -> DataFrame:
    """The batch engine's change points in [start, end), from the events a backfill would accept."""
    from datetime import UTC

    from pyspark.sql import functions as F

    from features.engine.batch import change_points
    from features.engine.source import check_columns, reason_of

    check_columns(group, events)
    good = events.where(reason_of(group, events, datetime.now(UTC)).isNull())
    rows = change_points(group, good, start_us, end_us).rows
    return rows.where(F.col(WINDOW_END) < F.timestamp_micros(F.lit(end_us)))


def _sorted_pandas(group: FeatureGroup, rows: DataFrame) -> pd.DataFrame:
    frame = rows.toPandas().sort_values([*group.join_keys, WINDOW_END], kind="stable").reset_index(drop=True)
    frame[WINDOW_END] = frame[WINDOW_END].dt.tz_localize("UTC")
    return frame
