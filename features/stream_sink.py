"""The stream's micro-batch sink (foreachBatch): each batch validated, then written to the offline table and
the online store, late events and bad records set aside, and its progress reported (features.stream runs the
queries; features.engine.stream computes what a batch holds).
"""

from __future__ import annotations

import hashlib
import json
import operator
import sys
import threading
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial, reduce
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from features.parallel import beside
from features.repo import Repo
from features.retention import SWEEP_EVERY_S, held, sweep
from features.rollup import MetricRollup
from features.spec import WINDOW_END, FeatureGroup

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from features import offline
    from features.compaction import StreamCompaction
    from features.engine.files import FileCheck
    from features.online import OnlineWriter
    from features.screen import Screen


class RunState(Protocol):
    """What a sink reports to: the stream run (features.stream.StreamRun) its query belongs to."""

    latest: dict[str, StreamProgress]
    history: list[StreamProgress]
    errors: dict[str, BaseException]
    tracker: Any
    rollups: list[MetricRollup]


@dataclass(frozen=True)
class StreamProgress:
    """Where one group's stream stands after its latest micro-batch (totals since this run started)."""

    group: str
    batch_id: int = -1
    events: int = 0  # read by the latest batch
    input_rate: float = 0.0  # events per second arriving, as Spark measures it
    processing_rate: float = 0.0  # events per second processed
    watermark: datetime | None = None
    state_rows: int = 0  # pane rows held in state, all buckets
    state_bytes: int = 0
    rows_emitted: int = 0  # change points written by the latest batch
    rows_total: int = 0
    late: int = 0  # events behind the watermark in the latest batch (written to the late-events folder)
    late_total: int = 0
    bad_records_total: int = 0  # bad source records quarantined
    batches_quarantined: int = 0  # micro-batches that failed validation (nothing of them written)
    batch_seconds: float = 0.0
    # From the landing of the batch's oldest file (Kafka: record time) to the batch's rows being written.
    freshness_seconds: float | None = None

    def line(self) -> str:
        wm = self.watermark.strftime("%Y-%m-%d %H:%M:%S") if self.watermark else "-"
        text = (
            f"{self.group} batch {self.batch_id}: {self.events:,} events in {self.batch_seconds:.1f}s "
            f"({self.processing_rate:,.0f}/s), watermark {wm}, {self.rows_emitted:,} rows out "
            f"({self.rows_total:,} total), state {self.state_rows:,} panes, late {self.late_total:,}"
        )
        if self.freshness_seconds is not None:
            text += f", landing to online {self.freshness_seconds:.1f}s"
        if self.bad_records_total:
            text += f", bad records {self.bad_records_total:,}"
        if self.batches_quarantined:
            text += f", batches quarantined {self.batches_quarantined}"
        return text


class BatchSink:
    """foreachBatch: validate, write the offline table and the online store, set aside late and bad rows."""

    def __init__(
        self,
        repo: Repo,
        group: FeatureGroup,
        writer: OnlineWriter | None,
        validate: bool,
        run: RunState,
        show: bool,
        spark: SparkSession,
        record_schema: str,
        metrics_s: float = 60.0,
        keep_s: float | None = None,
    ) -> None:
        from features import quality

        self.repo, self.group, self.writer, self.validate = repo, group, writer, validate
        self.run, self.show = run, show
        self.policy = quality.policy(group, quality.STREAM_DEFAULT)
        self.state: dict[int, tuple[int, int]] = {}  # bucket -> (pane rows, bytes)
        self.query: StreamingQuery | None = None
        self.lock = threading.Lock()
        self.spark = spark
        self.files: FileCheck | None = None  # unreadable Parquet files, checked as they land
        self.nanoseconds = True  # whether the stream reads nanosecond files (engine.stream.reads_nanoseconds)
        self.stream_id = ""  # the checkpoint's, which the stream's offline commits record
        self.offline_log: offline.StreamLog | None = None
        self.compaction: StreamCompaction | None = None
        self.checked: set[str] = set()
        tracker = run.tracker
        self.rollup = MetricRollup(lambda m, step, g: tracker.log_metrics(m, step=step, group=g), metrics_s)
        run.rollups.append(self.rollup)
        self.keep_s, self.swept = keep_s, None
        self.record_schema = record_schema  # a bad record's columns (engine.Projection.record_schema)
        self._sweep(-1)  # before the first batch: what an earlier run left beyond the retention

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        try:
            self._batch(batch, batch_id)
        except Exception as exc:
            self.run.errors[self.group.name] = exc
            raise

    def _batch(self, batch: DataFrame, batch_id: int) -> None:
        """Three Spark jobs when all is well: one computes the batch (and caches it), counts its rows of each
        kind and screens the final and eager rows; one writes the offline table; one the online store. (And a
        small one reads the buckets' stats from the cache.)"""
        from pyspark.sql import functions as F

        from features.engine import stream as engine
        from features.engine.online_rows import write_online

        began = time.perf_counter()
        # The cache lives for this batch only and is read twice: compressing it costs more than it saves. (The
        # batch's session is the query's own, so users' caches keep the setting.)
        batch.sparkSession.conf.set("spark.sql.inMemoryColumnarStorage.compressed", "false")
        batch = batch.persist()
        try:
            kind = F.col(engine.KIND)
            screens = self._summary(batch)
            counts = {k: s.rows for k, s in screens.items()}
            stat_rows = [
                dict(zip(engine.STAT_FIELDS, json.loads(r[0]), strict=True))
                for r in batch.where(kind == engine.STAT).select(engine.RECORD).collect()
            ]
            rows_out, online = 0, []
            eager = bool(counts.get(engine.EAGER)) and self._eager_valid(batch, batch_id, screens[engine.EAGER])
            rows = self._rows_of(batch, engine.ROW)
            if counts.get(engine.ROW) and self._rows_valid(rows, batch_id, screens[engine.ROW]):
                rows_out = counts[engine.ROW]
                latest = (kind == engine.ROW) & F.col(engine.LATEST)
                # A key's eager value is newer than its last change point: the store needs only that one.
                online.append(latest & ~F.coalesce(F.col(engine.REPLACED), F.lit(False)) if eager else latest)
            if eager:
                online.append(kind == engine.EAGER)
            write = None
            if self.writer is not None and online:
                # Eager values are ahead of the final rows, and newer-or-equal wins: one write takes both.
                newest = batch.where(reduce(operator.or_, online)).select(*self._columns())
                write = partial(write_online, self.writer, newest)
            # The offline commit (Spark's work) beside the online write (mostly Python's).
            beside(partial(self._write_offline, rows, batch_id) if rows_out else None, write)
            late = counts.get(engine.LATE, 0)
            if late:
                self._write_late(batch, batch_id)
            bad = counts.get(engine.BAD, 0)
            if bad:
                self._write_bad(batch, batch_id)
            bad += self._set_aside_unreadable_files()
        finally:
            batch.unpersist()
        self._report(batch_id, stat_rows, rows_out, late, bad, time.perf_counter() - began)
        self._sweep(batch_id)

    def _sweep(self, batch_id: int) -> None:
        """Remove what was set aside longer ago than the retention (hourly); log what is held."""
        if self.keep_s is None or (self.swept is not None and time.monotonic() - self.swept < SWEEP_EVERY_S):
            return
        self.swept = time.monotonic()
        sweep(self.repo, self.group.name, self.keep_s)
        kept = {
            f"aside.{h.kind}.{unit}": getattr(h, unit)
            for h in held(self.repo, self.group.name)
            for unit in ("files", "bytes")
        }
        self.rollup.add(kept, max(batch_id, 0), self.group.name)

    def _summary(self, batch: DataFrame) -> dict[str, Screen]:
        """The batch's rows of each kind, screened (final and eager rows; the other kinds are only counted)."""
        from pyspark.sql import functions as F

        from features import quality
        from features.engine import stream as engine
        from features.screen import Screen

        if self.validate:
            return quality.screen_batches(self.group, batch.select(engine.KIND, *self._columns()), engine.KIND)
        return {k: Screen(n, {}, {}) for k, n in batch.groupBy(engine.KIND).agg(F.count(F.lit(1))).collect()}

    def _rows_valid(self, rows: DataFrame, batch_id: int, screened: Screen) -> bool:
        """Validate the change points; False when they were quarantined (the policy "fail" raises)."""
        from features import quality

        if not self.validate:
            return True
        from features.tracking import validation_metrics, validation_prefix

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
        self.quarantined = getattr(self, "quarantined", 0) + 1
        return False

    def _write_offline(self, rows: DataFrame, batch_id: int) -> None:
        """Append the batch's change points, and compact the table when a round is due (features.compaction)."""
        from features import offline
        from features.compaction import StreamCompaction

        if self.offline_log is None:
            table = self.repo.offline_path(self.group)
            spans = offline.completed_days(table, self.group.name)
            self.offline_log = offline.StreamLog(table, self.stream_id, spans=spans)
            self.compaction = StreamCompaction(table)
        self.offline_log.refresh()
        if offline.append_batch(self.spark, rows, self.offline_log, batch_id) and self.compaction is not None:
            compacted = self.compaction.after_append(self.spark)
            if compacted:
                self.rollup.add({"compacted_files": sum(compacted.values())}, batch_id, self.group.name)

    def _eager_valid(self, batch: DataFrame, batch_id: int, screened: Screen) -> bool:
        """Whether the eager rows (each touched key's value ahead of the watermark, for the online store only)
        pass validation like the change points; they are left out of the store when they fail."""
        from features import quality
        from features.engine import stream as engine

        if not self.validate or self.writer is None:
            return self.writer is not None
        report = quality.validate_batch(self.group, self._rows_of(batch, engine.EAGER), screened=screened)
        if not report.success:
            self.run.tracker.log_validation(report, step=batch_id, artifact=True)
        return report.success

    def _rows_of(self, batch: DataFrame, kind: str) -> DataFrame:
        """The batch's feature rows of one kind (ROW or EAGER), as the stores take them."""
        from pyspark.sql import functions as F

        from features.engine import stream as engine

        return batch.where(F.col(engine.KIND) == kind).select(*self._columns())

    def _columns(self) -> list[Any]:
        from pyspark.sql import functions as F

        return [
            *self.group.join_keys,
            F.timestamp_micros(F.col(WINDOW_END)).alias(WINDOW_END),
            *[f.name for f in self.group.features],
        ]

    def _write_late(self, batch: DataFrame, batch_id: int) -> None:
        from pyspark.sql import functions as F

        from features.engine import stream as engine
        from features.kernel import TS

        key_types = {k: t for k, t in self._key_types().items()}
        late = batch.where(F.col(engine.KIND) == engine.LATE).select(
            F.from_json(F.col(engine.RECORD), engine.late_schema(self.group, key_types)).alias("r")
        )
        late = late.select(
            *[F.col(f"r.{k}").alias(k) for k in self.group.join_keys],
            F.timestamp_micros(F.col(f"r.{TS}")).alias(self.group.source.timestamp),
            F.lit(batch_id).alias("batch_id"),
        )
        engine.write_json_records(late, Path(self.repo.late_path(self.group)) / f"batch={batch_id}", None)

    def _write_bad(self, batch: DataFrame, batch_id: int) -> None:
        from pyspark.sql import functions as F

        from features import quality
        from features.engine import schema
        from features.engine import stream as engine

        # The columns of the backfill's quarantined records (features.engine.source.SourceRead.rejected); the batch
        # id is in the folder's name.
        bad = batch.where(F.col(engine.KIND) == engine.BAD).select(
            F.col(engine.REASON).alias(schema.REASON),
            F.from_json(F.col(engine.RECORD), self.record_schema).alias("r"),
        )
        bad = bad.select(schema.REASON, "r.*")
        if self.group.source.format != "json" and self.group.source.kafka is None:
            bad = bad.drop(schema.RAW_RECORD)  # only a JSON text has a raw text beside its parsed columns
        folder = quality.quarantine_root(self.repo.root, self.group.name) / "records" / f"stream-b{batch_id}"
        engine.write_json_records(bad, folder, None)

    def _set_aside_unreadable_files(self) -> int:
        """The landed Parquet files set aside whole (the stream's reads skip them): those that do not conform to
        the source's schema (`nonconforming_file: ...`, a column the group reads missing or of a type that does
        not convert without loss) and those Spark cannot read (`unreadable_file: ...`), each set aside once with
        its reason as a record of its own, like the backfill's; the number set aside. Files on a store the
        driver cannot open are skipped unreported."""
        from features import quality
        from features.engine import files, schema
        from features.engine import stream as engine

        if self.group.source.format != "parquet" or self.group.source.kafka is not None:
            return 0
        path = self.repo.source_path(self.group)
        if self.files is None:
            read_schema = engine.source_schema(self.spark, self.group, path)
            self.files = files.FileCheck(self.spark, read_schema, nanoseconds=self.nanoseconds)
        reader = self.spark.read.schema(self.files.schema).option("recursiveFileLookup", "true")
        listed = set(reader.parquet(path).inputFiles())
        new = sorted(listed - self.checked)
        # Only the names still landed: the set never outgrows the listing Spark's file source makes each batch.
        self.checked = listed
        bad = self.files.unreadable(new) or []
        for reason, file in bad:
            # Named by the file: a replay or a restart that finds it again replaces the same record.
            name = hashlib.sha1(file.encode()).hexdigest()[:16]
            folder = quality.quarantine_root(self.repo.root, self.group.name) / "records" / f"file-{name}"
            record = self.spark.createDataFrame(
                [(reason, file)], f"{schema.REASON} string, {schema.SOURCE_FILE} string"
            )
            engine.write_json_records(record, folder, None)
        return len(bad)

    def _key_types(self) -> dict[str, Any]:
        from features.feast_objects import source_schema

        types = self.group.output_types(source_schema(self.group, self.repo.root))
        return {k: types[k] for k in self.group.join_keys}

    def _report(
        self, batch_id: int, stats: list[dict[str, Any]], rows_out: int, late: int, bad: int, seconds: float
    ) -> None:
        events = 0
        watermark = None
        landed = [r["landed"] for r in stats if r["landed"] is not None]
        for r in stats:
            self.state[r["bucket"]] = (r["state_rows"], r["state_bytes"])
            events += r["events"]
            watermark = max(watermark or 0, r["watermark"])
        # Landing to online: how long the batch's oldest landed event waited until the batch's rows were written.
        freshness = time.time() - min(landed) / 1e6 if landed else None
        before = self.run.latest[self.group.name]
        spark_progress = self.query.lastProgress if self.query is not None else None
        input_rate = float((spark_progress or {}).get("inputRowsPerSecond") or 0.0)
        now = replace(
            before,
            batch_id=batch_id,
            events=events,
            input_rate=input_rate,
            processing_rate=events / seconds if seconds > 0 else 0.0,
            # A batch that ran no bucket reports none: the watermark emitted up to stands (it never moves back).
            watermark=before.watermark if not watermark else datetime.fromtimestamp(watermark / 1e6, UTC),
            state_rows=sum(v[0] for v in self.state.values()),
            state_bytes=sum(v[1] for v in self.state.values()),
            rows_emitted=rows_out,
            rows_total=before.rows_total + rows_out,
            late=late,
            late_total=before.late_total + late,
            bad_records_total=before.bad_records_total + bad,
            batches_quarantined=getattr(self, "quarantined", 0),
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
                    "state_rows": now.state_rows,
                    "batch_seconds": seconds,
                    **({"freshness_seconds": freshness} if freshness is not None else {}),
                },
                batch_id,
                self.group.name,
            )
        if self.show:
            print(now.line(), file=sys.stderr, flush=True)
