"""Keeping the offline table small: compaction of small files, and removal of the files no version needs.

A stream appends one file per date a micro-batch touches (features.stores.offline.append_batch): at a 1 s trigger,
86,400 a day, which every training set and `features verify` would open. A compaction rewrites a date's
files as one in a commit that changes no row (a stream's rounds with deltalake's compaction, `features compact`
with Delta's OPTIMIZE), so readers (Spark, Feast through DuckDB, pandas through deltalake)
see the files before it or after it, never both and never neither. A stream's appends go on beside it (they add
files it did not read). A backfill that replaces the same date at the same moment makes one of the two commits
fail: a backfill commits again (features.stores.offline), a compaction waits for its next round.

A stream compacts every `EVERY_APPENDS` of its appends, the dates then holding more than `COMPACT_ABOVE` small
files, in a thread of its own: the micro-batches go on while a round runs (a round rewrites the live day's
not-yet-full file, a second or more, which every sixteenth batch waited for, and the online values with it). A
round still running `WAIT_AFTER` appends after it started is waited for. As each append adds at most one file per
date, a date holds at most COMPACT_ABOVE + EVERY_APPENDS small files when a round starts (what the round before
left, one file or at most COMPACT_ABOVE, and the appends since) and WAIT_AFTER more before it commits (32 <=
MAX_FILES), however many batches ran, and a day whose windows are final is compacted at the next round after its
last append. A file of `FULL_FILE_BYTES` or more is full: a stream's rounds leave it as it is.
Delta's OPTIMIZE rewrites every file under its `optimize.minFileSize` (1 GiB unless set), as deltalake's does
every file under its target size, so that without this bound each round rewrote the live day's whole compacted
file with the few new ones, work that grows with the day (a stream of 10,000 events a second wrote 90 MB to its
day in 5 minutes); with it, a round rewrites at most one not-yet-full file beside the new ones, and a day holds
its full files besides. `features compact` compacts every date with more than one file on demand, with Delta's
own setting.

The files a compaction or a backfill replaced stay for older versions (time travel, `training_set(...,
as_of_version=)`) until VACUUM deletes them, once they are older than the table's retention, Delta's own
setting `delta.deletedFileRetentionDuration` (7 days unless set; `features compact --retention` sets it). A
stream vacuums once an hour.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import TYPE_CHECKING

from features.errors import ConfigError
from features.session_conf import session_setting
from features.stores.driver_writes import plain
from features.stores.offline import DATE, MAX_FILES, exists, files_per_date, is_conflict

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)

EVERY_APPENDS = 16  # a stream's appends between compaction rounds
WAIT_AFTER = EVERY_APPENDS // 2  # appends after which a round still running is waited for
COMPACT_ABOVE = 8  # a round compacts the dates holding more small files than this
FULL_FILE_BYTES = 128 * 1024 * 1024  # a stream's rounds leave files of this size or more (Delta's usual target)
MIN_FILE_SIZE = "spark.databricks.delta.optimize.minFileSize"  # OPTIMIZE rewrites the files under it
assert COMPACT_ABOVE + EVERY_APPENDS + WAIT_AFTER <= MAX_FILES  # the bound the module docstring derives
VACUUM_EVERY_S = 3600.0


def compact(spark: SparkSession, table: str, above: int = 1, full_bytes: int | None = None) -> dict[date, int]:
    """Rewrite the files of each date partition holding more than `above` files as one file (one commit that
    changes no row); with `full_bytes`, only the files smaller than that count and are rewritten, into files of
    at most about `full_bytes`. Returns the files each compacted date held before (those counted).

    A stream's rounds (`full_bytes`) run inside a micro-batch, which waits for them: there deltalake's compaction
    merges the files in the driver, where Delta's OPTIMIZE, five Spark jobs, took 1.3-2.0 s for 16 appends of
    25,000 rows and deltalake 0.1 s. A table of a higher Delta protocol (table features deltalake may not write)
    and `features compact` use Delta's OPTIMIZE."""
    crowded = {day: n for day, n in files_per_date(table, full_bytes).items() if n > above}
    if not crowded:
        return crowded
    if full_bytes is not None:
        from deltalake import DeltaTable

        delta = DeltaTable(table)
        if plain(delta):
            days = [day.isoformat() for day in crowded]
            delta.optimize.compact(partition_filters=[(DATE, "in", days)], target_size=full_bytes)
            return crowded
    optimize(spark, table, list(crowded), full_bytes)
    return crowded


def optimize(spark: SparkSession, table: str, days: list[date], full_bytes: int | None = None) -> None:
    """Delta's OPTIMIZE of the date partitions `days`; with `full_bytes`, only the files smaller than that are
    rewritten (its `minFileSize`, set for this command only)."""
    days_sql = ", ".join(f"'{day.isoformat()}'" for day in days)
    command = f"OPTIMIZE delta.`{_sql_path(table)}` WHERE {DATE} IN ({days_sql})"
    if full_bytes is None:
        spark.sql(command).collect()
        return
    # A stream passes its query's own session (each query has one).
    with session_setting(spark, MIN_FILE_SIZE, str(full_bytes)):
        spark.sql(command).collect()


def vacuum(spark: SparkSession, table: str, retention: timedelta | None = None) -> None:
    """Delete the files no version within the table's retention needs (Delta's VACUUM). `retention`, when given,
    becomes the table's `delta.deletedFileRetentionDuration` first (versions older than it can no longer be
    read)."""
    if not exists(table):
        return
    path = _sql_path(table)
    if retention is not None:
        if retention < timedelta(0):
            raise ConfigError(f"--retention must not be negative, got {retention}")
        hours = int(retention.total_seconds() // 3600)
        spark.sql(
            f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
            f"('delta.deletedFileRetentionDuration' = 'interval {hours} hours')"
        ).collect()
    spark.sql(f"VACUUM delta.`{path}`").collect()


def _sql_path(table: str) -> str:
    return table.replace("`", "``")


@dataclass
class StreamCompaction:
    """A stream's rounds: after every `every` appends, compact the dates holding more than `above` files smaller
    than `full_bytes`; vacuum once per `vacuum_every_s` of `clock`. A round runs in a thread of its own, waited for
    when it still runs `every // 2` appends after it started, or by `wait`."""

    table: str
    every: int = EVERY_APPENDS
    above: int = COMPACT_ABOVE
    full_bytes: int = FULL_FILE_BYTES
    vacuum_every_s: float = VACUUM_EVERY_S
    clock: Callable[[], float] = time.monotonic
    appends: int = 0
    vacuumed: float | None = field(default=None)  # when it last vacuumed (the start counts: a stream's first
    # vacuum comes an hour in, not in its first minutes)
    running: Future[dict[date, int]] | None = field(default=None, repr=False)
    started_at: int = 0  # the appends counted when the running round started
    _pool: ThreadPoolExecutor | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.vacuumed is None:
            self.vacuumed = self.clock()

    def after_append(self, spark: SparkSession) -> dict[date, int]:
        """Count one append; start a round when due. Returns the dates a round that has ended since the last call
        compacted (files each held before); raises the error a round failed with (Delta refusing its commit
        because another came first is none: the next round compacts those files)."""
        self.appends += 1
        # Waited for `every // 2` appends after it started at the latest, so ended before the next is due.
        done = self._ended(wait=self.appends - self.started_at >= max(1, self.every // 2))
        if self.appends % self.every == 0:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="features-compaction")
            self.running, self.started_at = self._pool.submit(self._round, spark), self.appends
        return done

    def wait(self) -> dict[date, int]:
        """The running round's dates once it has ended ({} when none runs); its error, raised."""
        try:
            return self._ended(wait=True)
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=False)
                self._pool = None

    def _ended(self, wait: bool) -> dict[date, int]:
        round_, self.running = self.running, None
        if round_ is None or (not wait and not round_.done()):
            self.running = round_
            return {}
        return round_.result()

    def _round(self, spark: SparkSession) -> dict[date, int]:
        try:
            compacted = compact(spark, self.table, self.above, self.full_bytes)
        except Exception as exc:
            if not is_conflict(exc):
                raise
            # A backfill replaced one of the dates first: its rows are new files, compacted next round.
            logger.info("compaction of %s left for the next round: %s", self.table, type(exc).__name__)
            return {}
        now = self.clock()
        if self.vacuumed is None or now - self.vacuumed >= self.vacuum_every_s:
            self.vacuumed = now
            vacuum(spark, self.table)
        return compacted
