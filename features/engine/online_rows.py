"""Rows of a Spark DataFrame into the online store, for the backfill and the stream alike."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from features.spec import WINDOW_END

if TYPE_CHECKING:
    from features.stores.online import OnlineWriter


def write_online(writer: OnlineWriter, rows: DataFrame) -> int:
    """Write rows (each key's newest of the batch) to the online store: from the executors, partition by
    partition, for a store that takes parallel writers (Redis); from the driver for a serial one (SQLite, a
    local file that only one writer may hold), which saves a Python worker per batch."""

    def to_utc(batch: pd.DataFrame) -> pd.DataFrame:
        ends = pd.to_datetime(batch[WINDOW_END])
        batch[WINDOW_END] = ends.dt.tz_localize("UTC") if ends.dt.tz is None else ends.dt.tz_convert("UTC")
        return batch

    if not writer.parallel:
        return writer.write(to_utc(rows.toPandas()))

    def write(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        total = 0
        for batch in batches:
            total += writer.write(to_utc(batch))
        yield pd.DataFrame({"written": [total]})

    return int(rows.mapInPandas(write, "written long").agg(F.sum("written")).first()[0] or 0)
