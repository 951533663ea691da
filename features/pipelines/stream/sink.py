"""The stream's micro-batch sink (foreachBatch): each batch validated, then appended to the offline table in one
commit per batch (features.stores.offline.append_batch) and written to the online store, late events and bad
records set aside (features.pipelines.stream.aside), and its progress reported (features.pipelines.stream.runner
runs the queries; features.engine.stream_operator computes what a batch holds).
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys
import threading
import time
from dataclasses import replace
from datetime import UTC, date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from features import quality
from features.engine import source_log, stream_rows
from features.engine.online_rows import write_online
from features.engine.query_log import handed_watermark, record_emitted
from features.engine.source_log import Pruning
from features.ml.runs import validation_metrics, validation_prefix
from features.pipelines.rollup import MetricRollup
from features.pipelines.stream.aside import SetAside
from features.pipelines.stream.batch_progress import ListingWatch, RunState
from features.quality.profiling import ProfileSoon
from features.quality.screen import Screen
from features.repo import Repo
from features.spec import WINDOW_END, FeatureGroup
from features.stores import offline
from features.stores.compaction import StreamCompaction

# Spark tells a stop from a failure, when a Python foreachBatch raises, by the error's text alone: it matches it with
# StreamExecution.PROXY_ERROR, a pattern whose repeated group recurses once per character. The Py4JJavaError of a
# Spark job that the stop interrupted carries a Java trace of some 20,000 characters: the match overflows the stack,
# and every stop in the middle of a batch printed a thousand-line StackOverflowError. A batch cut short by
# `StreamRun.stop` therefore ends with this short text, the one Spark looks for.
STOPPED_IN_BATCH = (
    "py4j.protocol.Py4JJavaError: An error occurred while calling the micro-batch: java.lang.InterruptedException"
)


# A stats row's record, null on the other kinds' rows: what tells the buckets' stats rows apart in the screen.
STAT_RECORD = "fx_stat_record"


class StoppedInBatch(Exception):
    """The run was stopped during this micro-batch: nothing of it is committed, and it runs again at the next
    start."""


if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

    from features.stores.online import OnlineWriter


class BatchSink:
    """foreachBatch: validate, write the offline table and the online store, set aside late and bad rows."""

    statistics = True  # record the statistics of the rows appended (features.stores.statistics); benches turn it off
    profiling: ProfileSoon | None = None  # the statistics of the batch's rows, as its offline commit collects them

    def __init__(
        self,
        repo: Repo,
        group: FeatureGroup,
        writer: OnlineWriter | None,
        validate: bool,
        run: RunState,
        show: bool,
        spark: SparkSession,
        aside: SetAside,
        rollup: MetricRollup,
    ) -> None:
        self.repo, self.group, self.writer, self.validate = repo, group, writer, validate
        self.run, self.show = run, show
        self.policy = quality.policy(group, quality.STREAM_DEFAULT)
        self.state: dict[int, tuple[int, int]] = {}  # bucket -> (pane rows, bytes)
        self.query: StreamingQuery | None = None
        self.lock = threading.Lock()
        self.spark = spark
        self.stream_id = ""  # the checkpoint's, which the stream's offline commits record
        self.offline_log: offline.StreamLog | None = None
        self.compaction: StreamCompaction | None = None
        self.last_appended = 0  # the last batch appended: a round's files are told with the batch that sees it end
        self.aside, self.rollup = aside, rollup
        self.quarantined = 0  # batches that failed validation
        self.finish_upgrade: Any = None  # an upgrade.Finish while a definition change is pending
        self.source_log: Pruning | None = None  # a file source's log, kept to what Spark still needs
        self.checkpoint: Path | None = None  # the group's checkpoint folder
        self.listing: ListingWatch | None = None  # a live file source's listing time, told when it grows
        self.retiring = (
            False  # its query is being stopped for one on a new definition (features.pipelines.stream.reload)
        )

    @functools.cached_property
    def columns(self) -> _Columns:
        return _Columns(self.group)

    @property
    def query_checkpoint(self) -> Path | None:
        """The query's checkpoint, where the watermark each batch emitted up to is noted."""
        return None if self.checkpoint is None else self.checkpoint / "query"

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        try:
            self._batch(batch, batch_id)
        except Exception as exc:
            if self.run.stopping or self.retiring:
                raise StoppedInBatch(STOPPED_IN_BATCH) from None
            self.run.errors[self.group.name] = exc
            raise

    def _batch(self, batch: DataFrame, batch_id: int) -> None:
        """Screen -> validate -> publish (the offline append, then the online write) or quarantine -> set aside
        late and bad records. Three Spark jobs when all is well: one computes the batch (and caches it), counts
        its rows of each kind, screens the final and eager rows and brings the buckets' stats; one collects the
        change points for the offline table; one the online rows. (And one collects the late events'
        records, when a batch has a few.)"""
        began = time.perf_counter()
        # The cache lives for this batch only and is read twice: compressing it costs more than it saves. (The
        # batch's session is the query's own, so users' caches keep the setting.)
        batch.sparkSession.conf.set("spark.sql.inMemoryColumnarStorage.compressed", "false")
        batch = batch.persist()
        try:
            screens, stats = self._screen_kinds(batch)
            counts = {k: s.rows for k, s in screens.items()}
            late_records = None
            if self.aside.collects_late(counts.get(stream_rows.LATE, 0)):
                late_records = [r[0] for r in batch.where(self.columns.late).select(stream_rows.RECORD).collect()]
            # The watermark (µs) the buckets emitted up to; None when no bucket ran (a batch of bad records only).
            upto = max((r["watermark"] for r in stats), default=0) or None
            eager = bool(counts.get(stream_rows.EAGER)) and self._eager_valid(
                batch, batch_id, screens[stream_rows.EAGER]
            )
            rows = self._rows_of(batch, self.columns.final)
            final = bool(counts.get(stream_rows.ROW)) and self._rows_valid(rows, batch_id, screens[stream_rows.ROW])
            rows_out = counts[stream_rows.ROW] if final else 0
            appended = self._publish(batch, batch_id, rows if final else None, eager, rows_out, upto)
            late, bad = self.aside.write(batch, batch_id, counts, late_records, self._landed(batch_id))
            if self.statistics:
                events = sum(r["events"] for r in stats)
                record_batch_statistics(self, rows if appended else None, batch_id, (events, late, bad), upto)
        finally:
            batch.unpersist()
        self._report(batch_id, stats, upto, rows_out, late, bad, time.perf_counter() - began)
        if upto is not None and self.query_checkpoint is not None:
            record_emitted(self.query_checkpoint, batch_id, upto)
        self.aside.sweep(batch_id)
        pruned = self.source_log.after_batch() if self.source_log is not None else None
        if pruned is not None:
            self.rollup.add({"source_log_entries_dropped": pruned.entries}, batch_id, self.group.name)

    def _publish(
        self, batch: DataFrame, batch_id: int, rows: DataFrame | None, eager: bool, count: int, upto: int | None
    ) -> bool:
        """The valid change points appended to the offline table, then each key's newest final row and the valid
        eager rows written to the online store, then the table compacted when a round is due. The online write waits
        for the commit: a commit that fails leaves the online store as it was (the batch runs again at the next
        start), so that it never serves a value the table cannot reproduce. Whether rows were appended."""
        newest = self._online_rows(batch, rows is not None, eager)
        self.profiling = ProfileSoon(self.group, rows) if self.statistics and rows is not None else None
        with self.profiling.watching() if self.profiling is not None else contextlib.nullcontext():
            appended = rows is not None and self._write_offline(rows, batch_id, count, upto)
        if newest is not None and self.writer is not None:
            write_online(self.writer, newest)
        if appended and self.compaction is not None:
            self.last_appended = batch_id
            self._compacted(self.compaction.after_append(batch.sparkSession))  # the query's own session
        return appended

    def _compacted(self, compacted: dict[date, int]) -> None:
        if compacted:
            self.rollup.add({"compacted_files": sum(compacted.values())}, self.last_appended, self.group.name)

    def end_rounds(self) -> None:
        """Once its query has stopped: wait for the offline table's compaction round under way (its error
        raised)."""
        if self.compaction is not None:
            self._compacted(self.compaction.wait())

    def _online_rows(self, batch: DataFrame, final: bool, eager: bool) -> DataFrame | None:
        """What the online store gets of the batch: each key's newest final row (when the final rows are valid) and
        the valid eager rows; None when there is no store or nothing to write."""
        if self.writer is None or not (final or eager):
            return None
        # Eager values are ahead of the final rows, and newer-or-equal wins: one write takes both.
        return self._rows_of(batch, self.columns.online[final, eager])

    def _landed(self, batch_id: int) -> list[str] | None:
        """The files the batch read, from its file sources' logs; None for a Kafka source or when the logs do not
        tell."""
        query = self.query_checkpoint
        return None if self.source_log is None or query is None else source_log.batch_files(query, batch_id)

    def _rows_of(self, batch: DataFrame, kinds: Column) -> DataFrame:
        """The batch's feature rows that `kinds` (one of `self.columns`' conditions) selects, as the stores take
        them."""
        return batch.where(kinds).select(*self.columns.features)

    def _screen_kinds(self, batch: DataFrame) -> tuple[dict[str, Screen], list[dict[str, Any]]]:
        """The batch's rows of each kind but the stats, screened (final and eager rows; the others are only
        counted), and each bucket's stats row (events read, watermark, state held, oldest landing). In one job: a
        stats row's record is a group of the screen's of its own (a bucket has one such row; the other kinds' rows
        have none), where a job of their own cost 0.05 s a batch."""
        by = [stream_rows.KIND, STAT_RECORD]
        if self.validate:
            rows = batch.select(stream_rows.KIND, self.columns.stat_record, *self.columns.features)
            found = quality.screen_batches(self.group, rows, by)
        else:
            counted = batch.groupBy(stream_rows.KIND, self.columns.stat_record).agg(self.columns.count).collect()
            found = {(kind, record): Screen(n, {}, {}) for kind, record, n in counted}
        screens, stats = {}, []
        for (kind, record), screen in found.items():
            if kind == stream_rows.STAT:
                stats.append(dict(zip(stream_rows.STAT_FIELDS, json.loads(record), strict=True)))
            else:
                screens[kind] = screen
        return screens, stats

    def _rows_valid(self, rows: DataFrame, batch_id: int, screened: Screen) -> bool:
        """Validate the change points; False when they were quarantined (the policy "fail" raises)."""
        if not self.validate:
            return True

        report = quality.validate_batch(self.group, rows, screened=screened)
        self.rollup.add(validation_metrics(report), batch_id, validation_prefix(self.group.name))
        if not report.success:
            self.run.tracker.log_validation(report, step=batch_id, metrics=False)
        if report.success:
            return True
        if self.policy == quality.FAIL:
            quality.handle_invalid(report, rows, self.group, self.repo.root, quality.FAIL, "change points")
        folder = quality.quarantine_root(self.repo.root, self.group.name) / "batches" / f"stream-b{batch_id}"
        quality.quarantine_batch(report, rows, folder)
        self.quarantined += 1
        return False

    def _write_offline(self, rows: DataFrame, batch_id: int, count: int, upto: int | None) -> bool:
        """Append the batch's change points; whether any were (a compaction round may then be due,
        features.stores.compaction). `upto`: the watermark (µs) the batch emitted up to, which the commit records: a
        replay of the batch by a later version of features may emit further, and appends what is beyond it
        (`offline.append_batch`)."""
        if self.offline_log is None:
            table = self.repo.offline_path(self.group)
            spans = offline.completed_days(table, self.group.name)
            self.offline_log = offline.StreamLog(table, self.stream_id, spans=spans)
            self.compaction = StreamCompaction(table)
        self.offline_log.refresh()
        query = self.query_checkpoint
        handed = None if query is None else handed_watermark(query, batch_id)
        return bool(offline.append_batch(self.spark, rows, self.offline_log, batch_id, count, upto, handed))

    def _eager_valid(self, batch: DataFrame, batch_id: int, screened: Screen) -> bool:
        """Whether the eager rows (each touched key's value ahead of the watermark, for the online store only)
        pass validation like the change points; they are left out of the store when they fail."""
        if not self.validate or self.writer is None:
            return self.writer is not None
        report = quality.validate_batch(self.group, self._rows_of(batch, self.columns.eager), screened=screened)
        if not report.success:
            self.run.tracker.log_validation(report, step=batch_id, artifact=True)
        return report.success

    def _report(
        self,
        batch_id: int,
        stats: list[dict[str, Any]],
        watermark: int | None,
        rows_out: int,
        late: int,
        bad: int,
        seconds: float,
    ) -> None:
        events = 0
        landed = [r["landed"] for r in stats if r["landed"] is not None]
        if self.finish_upgrade is not None:
            self.finish_upgrade.observe(batch_id, len(stats))
        for r in stats:
            self.state[r["bucket"]] = (r["state_rows"], r["state_bytes"])
            events += r["events"]
        # Landing to online: how long the batch's oldest landed event waited until the batch's rows were written.
        freshness = time.time() - min(landed) / 1e6 if landed else None
        before = self.run.latest[self.group.name]
        spark_progress = self.query.lastProgress if self.query is not None else None
        told = self.listing.observe(spark_progress) if self.listing is not None else None
        if told is not None:
            print(told, file=sys.stderr, flush=True)
        listing = self.listing.seconds if self.listing is not None else None
        input_rate = float((spark_progress or {}).get("inputRowsPerSecond") or 0.0)
        now = replace(
            before,
            batch_id=batch_id,
            events=events,
            input_rate=input_rate,
            processing_rate=events / seconds if seconds > 0 else 0.0,
            # A batch that ran no bucket reports none: the watermark emitted up to stands (it never moves back).
            watermark=before.watermark if not watermark else datetime.fromtimestamp(watermark / 1e6, UTC),
            state_rows=sum(v[0] for v in self.state.values()) if self.state else None,
            state_bytes=sum(v[1] for v in self.state.values()) if self.state else None,
            rows_emitted=rows_out,
            rows_total=before.rows_total + rows_out,
            late=late,
            late_total=before.late_total + late,
            bad_records_total=before.bad_records_total + bad,
            batches_quarantined=self.quarantined,
            batch_seconds=seconds,
            freshness_seconds=freshness,
        )
        with self.lock:
            self.run.latest[self.group.name] = now
            self.run.history.append(now)
            self.rollup.add(
                {
                    "events": events,
                    "rows_out": rows_out,
                    "late": late,
                    "records_quarantined": bad,
                    "batches_quarantined": now.batches_quarantined,
                    **({"state_rows": now.state_rows} if now.state_rows is not None else {}),
                    "batch_seconds": seconds,
                    **({"freshness_seconds": freshness} if freshness is not None else {}),
                    **({"listing_seconds": listing} if listing is not None else {}),
                },
                batch_id,
                self.group.name,
            )
        if self.show:
            print(now.line(), file=sys.stderr, flush=True)


def record_batch_statistics(
    sink: BatchSink, rows: DataFrame | None, batch_id: int, counts: tuple[int, int, int], upto: int | None
) -> None:
    """The statistics of the change points a micro-batch appended (outside the days backfills own), and its
    events in, late events and records set aside, counted on the day of the watermark it emitted up to."""
    from features.stores import statistics as stats

    profiles = {}
    if rows is not None and sink.offline_log is not None and sink.profiling is not None:
        profiles = sink.profiling.result(offline.not_backfilled(rows, sink.offline_log.spans))
    events, late, bad = counts
    if not profiles and not any(counts):
        return
    rows_out: dict[int, int] = {}
    for (day, _), p in profiles.items():
        rows_out[day] = p.rows
    today = stats.day_of(datetime.fromtimestamp(upto / 1e6, UTC) if upto else datetime.now(UTC))
    days = {**dict.fromkeys(rows_out, stats.GroupDay(0, 0, 0, 0)), today: stats.GroupDay(events, 0, bad, late)}
    totals = {d: c.plus(stats.GroupDay(rows_out=rows_out.get(d, 0))) for d, c in days.items()}
    table = stats.statistics_table(sink.repo.root, sink.group.name)
    stats.record_batch(table, profiles, totals, batch_id, {})
    if batch_id % stats.COMPACT_EVERY == stats.COMPACT_EVERY - 1:  # the days before the watermark's, merged
        stats.compact_stream_days(table, today)


class _Columns:
    """The Spark Columns a micro-batch's selections use, made once per query: each function and name is a call to
    the JVM (about 0.4 ms while a batch runs), and the selections made them anew each batch (0.05-0.1 s)."""

    def __init__(self, group: FeatureGroup) -> None:
        kind = F.col(stream_rows.KIND)
        self.features = [
            *group.join_keys,
            F.timestamp_micros(F.col(WINDOW_END)).alias(WINDOW_END),
            *[f.name for f in group.features],
        ]
        self.final, self.eager = kind == stream_rows.ROW, kind == stream_rows.EAGER
        self.count = F.count(F.lit(1))
        self.stat_record = F.when(kind == stream_rows.STAT, F.col(stream_rows.RECORD)).alias(STAT_RECORD)
        self.late = kind == stream_rows.LATE
        latest = self.final & F.col(stream_rows.LATEST)
        # A key's eager value is newer than its last change point: the store needs only that one.
        replaced = F.coalesce(F.col(stream_rows.REPLACED), F.lit(False))
        # What the online store gets, by (final rows valid, eager rows valid).
        self.online = {
            (True, False): latest,
            (False, True): self.eager,
            (True, True): (latest & ~replaced) | self.eager,
        }
