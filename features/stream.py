"""`features stream`: run feature groups as Spark Structured Streaming queries that keep the offline table and
the online store fresh (the engine is `features.engine.stream`).

    run = stream(Repo.load("feature_repo"), available_now=True)   # process what has landed, then stop
    run.await_termination()
    run.progress()            # one StreamProgress per group: rates, watermark, state, rows, late events

Per micro-batch, in this order: the change points are validated (features.quality; a failing batch is
quarantined by default and nothing of it is written), appended to the offline table as files named by the
batch id, and each key's newest value is written to the online store with the event-time guard. A batch
replayed after a crash rewrites the same files and cannot move an online value back in time, so both stores
end up as if each batch ran once. Late events go to `Repo.late_path(group)/batch=<id>`, bad source records to
the group's quarantine folder, both with the batch id.
"""

from __future__ import annotations

import hashlib
import json
import operator
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import reduce
from pathlib import Path
from typing import TYPE_CHECKING, Any

from features.errors import ConfigError, EnvironmentProblem, ValidationFailed
from features.locks import table_lock
from features.repo import Repo
from features.retention import DEFAULT_KEEP, SWEEP_EVERY_S, held, sweep
from features.rollup import MetricRollup
from features.spec import WINDOW_END, FeatureGroup
from features.spec.durations import parse_duration
from features.spec.fingerprint import definition_hash, describe

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from features.engine.source import FileCheck
    from features.online import OnlineWriter
    from features.screen import Screen


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


@dataclass
class StreamRun:
    """The running queries of one `stream()` call, one per group."""

    queries: dict[str, StreamingQuery]
    latest: dict[str, StreamProgress]
    history: list[StreamProgress] = field(default_factory=list)
    errors: dict[str, BaseException] = field(default_factory=dict)
    tracker: Any = None  # the MLflow run (features.tracking) the batches log to
    _tracking: Any = None  # its context manager, ended when the queries end
    rollups: list[MetricRollup] = field(default_factory=list)  # the batches' metrics not logged yet, per group

    def _finish(self, error: BaseException | None) -> None:
        """End the MLflow run once, after the metrics of the last batches: FINISHED, or FAILED with the error."""
        tracking, self._tracking = self._tracking, None
        if tracking is not None:
            for rollup in self.rollups:
                rollup.flush()
            if error is None:
                tracking.__exit__(None, None, None)
            else:
                tracking.__exit__(type(error), error, error.__traceback__)

    def progress(self) -> list[StreamProgress]:
        return [self.latest[name] for name in self.queries]

    def status(self) -> Any:
        """Every batch's progress so far as a pandas DataFrame (for notebooks)."""
        import pandas as pd

        return pd.DataFrame([p.__dict__ for p in self.history])

    def await_termination(self, timeout: float | None = None) -> bool:
        """Wait for every query to stop (available-now runs stop by themselves); re-raise a query's failure
        as the features error that caused it when there is one."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for name, query in self.queries.items():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                done = query.awaitTermination(None if left is None else left)
            except Exception as exc:
                error = self.errors.get(name, exc)
                self._finish(error)
                raise error from None
            if done is False:
                return False
            if name in self.errors:
                self._finish(self.errors[name])
                raise self.errors[name]
        self._finish(None)
        return True

    def stop(self) -> None:
        for query in self.queries.values():
            query.stop()
        self._finish(None)


def stream(
    repo: Repo,
    groups: list[str] | None = None,
    *,
    spark: SparkSession | None = None,
    trigger: str = "5s",
    available_now: bool = False,
    checkpoint_root: str | None = None,
    reset: bool = False,
    online: bool = True,
    validate: bool = True,
    buckets: int | None = None,
    max_files_per_trigger: int | None = None,
    progress: bool | None = None,
    tracking: bool = True,
    metrics_every: str = "1m",
    retention: str | None = DEFAULT_KEEP,
) -> StreamRun:
    """Start one streaming query per group (all by default) and return without waiting. The run is one MLflow
    run (features.tracking) with the micro-batches' counts as metrics, one point per `metrics_every` of wall
    time (features.rollup); `tracking=False` records nothing. Late events and quarantined data are kept for
    `retention` (None: for ever), swept when the stream starts and hourly (features.retention)."""
    from features.backfill import ready_writer
    from features.engine import stream as engine
    from features.engine.session import get_spark

    if buckets is not None and buckets < 1:
        raise ConfigError(f"--buckets: {buckets} is not a positive number of hash buckets")
    every_s = parse_duration(trigger, "--trigger")
    metrics_s = parse_duration(metrics_every, "--metrics-every")
    keep_s = None if retention is None else parse_duration(retention, "--retention")
    selected = repo.select(groups)
    writers = {g.name: ready_writer(repo, g) for g in selected} if online else {}
    spark = spark or get_spark()
    _check_not_connect(spark)
    engine.configure(spark)
    from features import tracking as mlflow_tracking

    show = sys.stderr.isatty() if progress is None else progress
    run = StreamRun({}, {})
    params = {"trigger": "available-now" if available_now else trigger, "buckets": buckets, "online": online}
    run._tracking = mlflow_tracking.start_run(repo, "stream", selected, params, enabled=tracking)
    run.tracker = run._tracking.__enter__()
    try:
        for group in selected:
            checkpoint = Path(repo.checkpoint_path(group, checkpoint_root))
            labels, partitions = _check_checkpoint(repo, group, checkpoint, buckets, reset, spark)
            events = engine.read_stream(spark, group, repo.source_path(group), max_files_per_trigger)
            projected, projection = engine.project(group, events, labels)
            processor = engine.PaneProcessor(
                projection.plan, group.name, _arrow_types(projection.output_schema), eager=group.online == "eager"
            )
            out = projected.groupBy(engine.BUCKET).transformWithStateInPandas(
                processor, projection.output_schema, "append", "EventTime"
            )
            writer_of = writers.get(group.name)
            schema = projection.record_schema
            sink = _Sink(repo, group, writer_of, validate, run, show, spark, schema, metrics_s, keep_s)
            writer = out.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint / "query"))
            writer = writer.queryName(f"features_{group.name}")
            writer = (
                writer.trigger(availableNow=True)
                if available_now
                else writer.trigger(processingTime=f"{every_s} seconds")
            )
            # Until its first batch reports, a run stands at the watermark its checkpoint's last batch emitted up to.
            run.latest[group.name] = StreamProgress(group.name, watermark=emitted_watermark(checkpoint / "query"))
            with _shuffle_partitions(spark, partitions):
                run.queries[group.name] = writer.start()
            sink.query = run.queries[group.name]
    except BaseException as exc:
        for query in run.queries.values():
            query.stop()
        run._finish(exc)
        raise
    return run


CONNECT_UNSUPPORTED = (
    "the stream cannot run on a Spark Connect session (Databricks serverless or a shared cluster, SPARK_REMOTE): "
    "Spark Connect runs a foreachBatch function in a Python process of its own on the server, and the stream's "
    "micro-batch sink reports each batch to this run (progress, errors, MLflow metrics, the stop between batches), "
    "which that process cannot reach. Run the stream on a classic session instead: a cluster in dedicated (single "
    "user) access mode, `spark-submit jobs/stream.py`, or `features stream` without SPARK_REMOTE. Backfills "
    "(`features backfill --since-last`, e.g. every few minutes) do run on Spark Connect"
)


def _check_not_connect(spark: SparkSession) -> None:
    from features.engine.session import is_connect

    if is_connect(spark):
        raise EnvironmentProblem(CONNECT_UNSUPPORTED)


def _arrow_types(schema: str) -> dict[str, Any]:
    """Each column of a DDL schema and its Arrow type."""
    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import StructType

    return {f.name: to_arrow_type(f.dataType) for f in StructType.fromDDL(schema).fields}


@contextmanager
def _shuffle_partitions(spark: SparkSession, partitions: int) -> Iterator[None]:
    """Start a query with its own shuffle partitions: a streaming query copies the session's settings when it
    starts (and its stateful operator keeps the count in the checkpoint from then on)."""
    before = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    try:
        yield
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)


def _cores(spark: SparkSession) -> int:
    try:
        return int(spark.sparkContext.defaultParallelism)
    except (AttributeError, NotImplementedError):  # Spark Connect has no SparkContext: its shuffle partitions
        return int(spark.conf.get("spark.sql.shuffle.partitions") or 1)


def emitted_watermark(query_checkpoint: Path) -> datetime | None:
    """The watermark the query's last committed micro-batch emitted up to (its offsets' batchWatermarkMs), or None
    for a new checkpoint: every offline row up to it is final."""
    commits = [int(p.name) for p in (query_checkpoint / "commits").glob("[0-9]*") if p.name.isdigit()]
    if not commits:
        return None
    lines = (query_checkpoint / "offsets" / str(max(commits))).read_text().splitlines()
    ms = json.loads(lines[1]).get("batchWatermarkMs") if len(lines) > 1 else None
    return datetime.fromtimestamp(ms / 1000, UTC) if ms else None


def _check_checkpoint(
    repo: Repo, group: FeatureGroup, checkpoint: Path, buckets: int | None, reset: bool, spark: SparkSession
) -> tuple[list[int], int]:
    """The bucket labels the state was built with and the stateful operator's partitions (new ones for a new
    checkpoint). Stops when the saved state was built for another definition; `reset` starts over from the
    source.

    A new checkpoint gets one shuffle partition per core and, by default, one bucket per partition: one task
    and one Python call per core and batch, which costs the least per batch. Both are fixed when a checkpoint
    starts: Spark keeps the partition count in its checkpoint, and the labels are saved with the definition, as
    a key's state lives under its bucket's label."""
    from features.engine import stream as engine
    from features.engine.inputs import bucket_labels

    saved = engine.saved_definition(checkpoint)
    if reset:
        shutil.rmtree(checkpoint, ignore_errors=True)
        for old in Path(repo.offline_path(group)).glob("date=*/stream-b*.parquet"):
            old.unlink()  # the replay writes every change point again
        shutil.rmtree(repo.late_path(group), ignore_errors=True)
        saved = None
    if saved is not None and buckets is None:
        buckets = saved["buckets"]
    if saved is not None and (saved["definition_hash"], saved["buckets"]) != (definition_hash(group), buckets):
        before = {f["name"] for f in saved["definition"]["features"]}
        now = {f.name for f in group.features}
        changes = []
        if now - before:
            changes.append(f"added {', '.join(sorted(now - before))}")
        if before - now:
            changes.append(f"removed {', '.join(sorted(before - now))}")
        if saved["buckets"] != buckets:
            changes.append(f"--buckets {saved['buckets']} -> {buckets}")
        what = "; ".join(changes) or "changed a feature's aggregation, window or filter"
        raise _cannot_continue(repo, group, checkpoint, f"was built for another definition ({what})")
    if saved is not None and saved.get("state_format") != engine.STATE_FORMAT:
        raise _cannot_continue(
            repo,
            group,
            checkpoint,
            "was written by an older version of features, in a layout this version does not read",
        )
    if saved is not None:
        labels, partitions = saved["labels"], saved["partitions"]
    else:
        partitions = _cores(spark)
        labels = bucket_labels(buckets or partitions, partitions)
    current = {
        "definition_hash": definition_hash(group),
        "buckets": len(labels),
        "labels": labels,
        "partitions": partitions,
        "state_format": engine.STATE_FORMAT,
        "definition": describe(group),
    }
    engine.save_definition(checkpoint, current)
    return labels, partitions


def _cannot_continue(repo: Repo, group: FeatureGroup, checkpoint: Path, why: str) -> ConfigError:
    return ConfigError(
        f"{group.name}: the stream's saved state in {checkpoint} {why}, so it cannot continue. Start over with "
        f"`features stream --repo {repo.root} --group {group.name} --reset`, which deletes that state and rebuilds "
        "it by replaying the source"
    )


class _Sink:
    """foreachBatch: validate, write the offline table and the online store, set aside late and bad rows."""

    def __init__(
        self,
        repo: Repo,
        group: FeatureGroup,
        writer: OnlineWriter | None,
        validate: bool,
        run: StreamRun,
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
            if rows_out:
                self._write_offline(rows, batch_id)
            if self.writer is not None and online:
                # Eager values are ahead of the final rows, and newer-or-equal wins: one write takes both.
                write_online(self.writer, batch.where(reduce(operator.or_, online)).select(*self._columns()))
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
        from features.engine import stream as engine

        table = self.repo.offline_path(self.group)
        with table_lock(table):  # a backfill rewriting the table's days finishes first
            engine.write_offline_batch(self._not_backfilled(rows), table, batch_id)

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

    def _not_backfilled(self, rows: DataFrame) -> DataFrame:
        """Leave to the backfill what it wrote: a backfill's partition file holds every change point of the
        stretch it covers, so the stream's rows there (a replay of old files, a restart with --reset, a day
        backfilled while streaming) would only repeat them."""
        from pyspark.sql import functions as F

        from features.engine import stream as engine

        covered = engine.backfilled(self.repo.offline_path(self.group))
        if not covered:
            return rows
        end = F.col(WINDOW_END)
        inside = F.lit(False)
        for lo, hi in covered:
            inside = inside | end.between(lo, hi)
        return rows.where(~inside)

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
        from features.engine import source
        from features.engine import stream as engine

        # The columns of the backfill's quarantined records (features.engine.source.SourceRead.rejected); the batch
        # id is in the folder's name.
        bad = batch.where(F.col(engine.KIND) == engine.BAD).select(
            F.col(engine.REASON).alias(source.REASON),
            F.from_json(F.col(engine.RECORD), self.record_schema).alias("r"),
        )
        bad = bad.select(source.REASON, "r.*")
        if self.group.source.format != "json":
            bad = bad.drop(source.RAW_RECORD)  # only a JSON line has a raw text beside its parsed columns
        folder = quality.quarantine_root(self.repo.root, self.group.name) / "records" / f"stream-b{batch_id}"
        engine.write_json_records(bad, folder, None)

    def _set_aside_unreadable_files(self) -> int:
        """The landed Parquet files set aside whole (the stream's reads skip them): those that do not conform to
        the source's schema (`nonconforming_file: ...`, a column the group reads missing or of a type that does
        not convert without loss) and those Spark cannot read (`unreadable_file: ...`), each set aside once with
        its reason as a record of its own, like the backfill's; the number set aside. Files on a store the
        driver cannot open are skipped unreported."""
        from features import quality
        from features.engine import source
        from features.engine import stream as engine

        if self.group.source.format != "parquet":
            return 0
        path = self.repo.source_path(self.group)
        if self.files is None:
            self.files = source.FileCheck(self.spark, engine.source_schema(self.spark, self.group, path))
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
                [(reason, file)], f"{source.REASON} string, {source.SOURCE_FILE} string"
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


__all__ = ["StreamProgress", "StreamRun", "ValidationFailed", "stream"]
