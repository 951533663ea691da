"""Statistics of a batch of feature rows, computed in Spark's workers by features.kernel.profile (the same code
for a backfill partition and a stream micro-batch), and the source events a backfill reads per day.

The rows are those validation's screen has just read: cached, so this pass reads them from memory, not from the
source. Each task profiles its rows per (feature, day of window_end) and hands one small record per pair to the
driver, which merges them (features.kernel.profile.FeatureProfile.merge): nothing the size of the rows travels.
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from features.kernel.profile import DAY_US, FeatureProfile, from_records, merge_into, profile_batches
from features.spec import WINDOW_END, FeatureGroup

if TYPE_CHECKING:
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
    """`profile_rows` in a thread of its own, beside what the caller does next: a local backfill's offline commit
    is the driver's work (the rows collected, written by deltalake), which leaves Spark's cores free for it."""

    def __init__(self, group: FeatureGroup, rows: DataFrame, before: datetime | None = None) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="features-statistics")
        self._found = self._pool.submit(profile_rows, group, rows, before)

    def result(self) -> dict[tuple[int, str], FeatureProfile]:
        try:
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
