"""Statistics of a batch of feature rows, computed by features.kernel.profile (the same code for a backfill
partition and a stream micro-batch), and the source events a backfill reads per day.

`profile_rows` profiles rows in Spark's workers: those validation's screen has just read, cached, so this pass reads
them from memory, not from the source. Each task profiles its rows per (feature, day of window_end) and hands one
small record per pair to the driver, which merges them (features.kernel.profile.FeatureProfile.merge): nothing the
size of the rows travels. A local backfill's commit collects its rows to the driver anyway: `ProfileSoon` profiles
them there instead, while deltalake writes them.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from features.kernel.profile import DAY_US, FeatureProfile, from_records, merge_into, profile_batches, profile_days
from features.spec import WINDOW_END, FeatureGroup
from features.stores.driver_writes import COLLECTED

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, Observation

# features.kernel.profile.RECORD_SCHEMA in Spark's words
RECORD_DDL = (
    "day int, feature string, kind string, rows bigint, nulls bigint, n bigint, mean double, m2 double, "
    "min double, max double, sketch_codes array<int>, sketch_counts array<bigint>, registers binary, "
    "category_values array<string>, category_counts array<bigint>, category_other bigint"
)


def profile_rows(
    group: FeatureGroup, rows: DataFrame, before: datetime | None = None
) -> dict[tuple[int, str], FeatureProfile]:
    """Each feature's profile per day (days since 1970-01-01) of `rows` (the group's feature rows), those with
    window ends before `before` if given (a backfill's rows hold each key's value at the range's end too)."""
    from pyspark.sql import functions as F

    names = [f.name for f in group.features]
    if before is not None:
        rows = rows.where(F.col(WINDOW_END) < F.lit(before).cast("timestamp"))
    partials = rows.select(WINDOW_END, *names).mapInArrow(
        functools.partial(profile_batches, time_column=WINDOW_END, names=names), RECORD_DDL
    )
    found: dict[tuple[int, str], FeatureProfile] = {}
    for key, profile in from_records(partials.toArrow()):  # several tasks may hold rows of one (day, feature)
        merge_into(found, {key: profile})
    return found


class ProfileSoon:
    """A backfill's or micro-batch's statistics, computed beside its offline commit. A local commit collects the rows
    to the driver for deltalake (features.stores.driver_writes): they are profiled there, in a thread of their own
    while deltalake writes them, with no second conversion out of Spark. A commit by Spark's writer collects nothing:
    then `result` profiles the cached rows in Spark's workers (`profile_rows`)."""

    def __init__(self, group: FeatureGroup, rows: DataFrame, before: datetime | None = None) -> None:
        self.group, self.rows, self.before = group, rows, before
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="features-statistics")
        self._found: Future[dict[tuple[int, str], FeatureProfile]] | None = None

    def _offered(self, arrow: pa.Table) -> None:
        names = [f.name for f in self.group.features]
        self._found = self._pool.submit(profile_days, arrow, WINDOW_END, names)  # a retried commit: its last rows

    @contextmanager
    def watching(self) -> Iterator[None]:
        """Around the commit: the rows it collects are profiled."""
        token = COLLECTED.set(self._offered)
        try:
            yield
        finally:
            COLLECTED.reset(token)

    def result(self, rows: DataFrame | None = None) -> dict[tuple[int, str], FeatureProfile]:
        """The profiles of the rows the commit collected; else those of `rows` (default: the rows given), by Spark."""
        try:
            if self._found is None:
                return profile_rows(self.group, self.rows if rows is None else rows, self.before)
            return self._found.result()
        finally:
            self._pool.shutdown(wait=False)


def observe_days(events: DataFrame, timestamp: str, start: datetime, end: datetime) -> tuple[DataFrame, Observation]:
    """`events` counting, in the job that reads them, how many are stamped on each day of [start, end) (columns
    named by the days since 1970-01-01): a backfill's events in per day, without a job of its own."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    observation = Observation()
    day = F.floor(F.unix_micros(F.col(timestamp).cast("timestamp")) / DAY_US)
    first = int(start.timestamp() * 1e6) // DAY_US
    last = int((end - timedelta(microseconds=1)).timestamp() * 1e6) // DAY_US
    counts = [F.count_if(day == d).alias(str(d)) for d in range(first, last + 1)]
    return events.observe(observation, *counts), observation


def observed_days(observation: Observation) -> dict[int, int]:
    """What `observe_days` counted, by day; {} when Spark cannot tell (it skipped every row group by their
    statistics, see features.engine.source.observed_count)."""
    try:
        found = observation.get
    except Exception as exc:
        if "assertion failed" not in str(exc):
            raise
        return {}
    return {int(day): int(n) for day, n in found.items()}
