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

import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame, SparkSession

from features.engine import kafka, stream_operator, stream_source
from features.engine.inputs import bucket_labels
from features.engine.query_log import last_commit, state_partitions
from features.engine.session import cores, is_connect, session_soon
from features.engine.source_log import Pruning
from features.engine.state_upgrade import PendingUpgrade
from features.engine.stream_definition import save_definition, saved_definition
from features.engine.stream_query import (
    can_repartition_state,
    query_settings,
    repartition_state,
    stateful_query,
)
from features.engine.watchdog import observing
from features.errors import ConfigError, EnvironmentProblem, ValidationFailed
from features.ml import tracking as mlflow_tracking
from features.pipelines.backfill import ready_writer
from features.pipelines.options import DEFAULT_KEEP, StreamOptions
from features.pipelines.rollup import MetricRollup
from features.pipelines.stream import handoff, reload, savepoint
from features.pipelines.stream.aside import SetAside
from features.pipelines.stream.batch_progress import StreamProgress, emitted_watermark
from features.pipelines.stream.sink import BatchSink
from features.pipelines.stream.upgrade import Carried, Finish, carry_over, layout, rescale, state_record
from features.repo import Repo
from features.spec import FeatureGroup
from features.spec.fingerprint import definition_hash
from features.stores import offline

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

    from features.stores.online import OnlineWriter


@dataclass
class StreamRun:
    """The running queries of one `stream()` call, one per group."""

    queries: dict[str, StreamingQuery]
    latest: dict[str, StreamProgress]
    history: list[StreamProgress] = field(default_factory=list)
    errors: dict[str, BaseException] = field(default_factory=dict)
    tracker: Any = None  # the MLflow run (features.ml.tracking) the batches log to
    _tracking: Any = None  # its context manager, ended when the queries end
    rollups: list[MetricRollup] = field(default_factory=list)  # the batches' metrics not logged yet, per group
    archives: dict[str, StreamingQuery] = field(default_factory=dict)  # per Kafka source archived: its query
    carried: dict[str, Carried] = field(default_factory=dict)  # groups whose definition changed
    changing: list[Finish] = field(default_factory=list)  # their pending changes, settled at the end
    sinks: dict[str, BatchSink] = field(default_factory=dict)  # each group's, as its query runs
    watchdog: Any = None  # one that only observes, when no command's runs (its marker shows a stuck run)
    stopping: bool = False
    # Held while a group's query is swapped for one on its new definition: a wait or a stop then sees the new one.
    swapping: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _finishing: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def _finish(self, error: BaseException | None) -> None:
        """End the MLflow run once, after the metrics of the last batches: FINISHED, or FAILED with the error."""
        with self._finishing:  # stop() and a waiting thread may both get here
            tracking, self._tracking = self._tracking, None
            for change in self.changing:  # the last batch, which stepped every bucket, committed after its sink
                change.settle()
            reload.release(self)
            if self.watchdog is not None:
                self.watchdog.stop()
        if tracking is not None:
            for rollup in self.rollups:
                rollup.flush()
            if error is None:
                tracking.__exit__(None, None, None)
            else:
                tracking.__exit__(type(error), error, error.__traceback__)

    def progress(self) -> list[StreamProgress]:
        return [self.latest[name] for name in self.queries]

    def summary(self) -> list[str]:
        """A line per group with this run's totals (each batch's own line is printed as it ends)."""
        out = []
        for name in self.queries:
            batches = [p for p in self.history if p.group == name]
            last = self.latest[name]
            watermark = last.watermark.strftime("%Y-%m-%d %H:%M:%S") if last.watermark else "-"
            text = (
                f"{name}: {len(batches)} batches, {sum(p.events for p in batches):,} events, watermark {watermark}, "
                f"{last.rows_total:,} rows out, late {last.late_total:,}"
            )
            if last.bad_records_total:
                text += f", bad records {last.bad_records_total:,}"
            out.append(text)
        return out

    def status(self) -> Any:
        """Every batch's progress so far as a pandas DataFrame (for notebooks)."""
        import pandas as pd

        return pd.DataFrame([p.__dict__ for p in self.history])

    def await_termination(self, timeout: float | None = None) -> bool:
        """Wait for every query to stop (available-now runs stop by themselves); re-raise a query's failure
        as the features error that caused it when there is one."""
        deadline = None if timeout is None else time.monotonic() + timeout
        waits = [(self.archives, name) for name in self.archives] + [(self.queries, name) for name in self.queries]
        for queries, name in waits:
            while True:
                query = queries[name]
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    done = query.awaitTermination(None if left is None else left)
                except Exception as exc:
                    if self.stopping:  # stopped by `stop()`: whatever the stop cut short is not a failure of the run
                        self._finish(None)
                        return True
                    if self._replaced(queries, name, query):
                        continue
                    error = self.errors.get(name, exc)
                    self._finish(error)
                    raise error from None
                if done is False:
                    return False
                if not self._replaced(queries, name, query):
                    break
            if name in self.errors:
                self._finish(self.errors[name])
                raise self.errors[name]
        self._finish(None)
        return True

    def _replaced(self, queries: dict[str, StreamingQuery], name: str, query: StreamingQuery) -> bool:
        """Whether `query` stopped because its group runs on in a new query (a definition change taken up)."""
        with self.swapping:  # a swap under way ends first
            return queries[name] is not query

    def stop(self) -> None:
        self.stopping = True
        with self.swapping:
            for query in [*self.queries.values(), *self.archives.values()]:
                query.stop()
        self._finish(None)

    def await_or_interrupt(self) -> bool:
        """`await_termination` for a command's main thread, where Ctrl-C stops the run (`stop`) and returns True.

        The wait runs in a thread of its own and Ctrl-C only sets a flag: raised in the main thread, the
        KeyboardInterrupt would land inside a Py4J call, whose handler logs it with a traceback through the root
        logger (and so every Py4J error after it), and PySpark's own Ctrl-C handler would call the JVM from inside
        that call. A second Ctrl-C interrupts as before, for a stop that hangs."""
        if threading.current_thread() is not threading.main_thread():
            self.await_termination()
            return False
        interrupted = threading.Event()
        failure: list[BaseException] = []

        def on_interrupt(signum: int, frame: object) -> None:
            if interrupted.is_set():
                raise KeyboardInterrupt
            interrupted.set()

        def wait() -> None:
            try:
                self.await_termination()
            except BaseException as exc:  # re-raised in the main thread below
                failure.append(exc)

        waiter = threading.Thread(target=wait, name="features-stream-wait", daemon=True)
        previous = signal.signal(signal.SIGINT, on_interrupt)
        try:
            waiter.start()
            while waiter.is_alive() and not interrupted.is_set():
                waiter.join(0.2)
            if interrupted.is_set():
                self.stop()
                waiter.join()
                return True
        finally:
            signal.signal(signal.SIGINT, previous)
        if failure:
            raise failure[0]
        return False


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
    from_savepoint: str | None = None,
) -> StreamRun:
    """Start one streaming query per group (all by default) and return without waiting. The run is one MLflow
    run (features.ml.tracking) with the micro-batches' counts as metrics, one point per `metrics_every` of wall
    time (features.pipelines.rollup); `tracking=False` records nothing. Late events and quarantined data are kept for
    `retention` (None: for ever), swept when the stream starts and hourly (features.pipelines.retention).
    `from_savepoint`: start the one selected group from a savepoint (features.pipelines.stream.savepoint), in a new
    checkpoint."""
    options = StreamOptions(
        trigger=trigger,
        available_now=available_now,
        checkpoint_root=checkpoint_root,
        reset=reset,
        from_savepoint=from_savepoint,
        online=online,
        validate=validate,
        buckets=buckets,
        max_files_per_trigger=max_files_per_trigger,
        progress=progress,
        tracking=tracking,
        metrics_every=metrics_every,
        retention=retention,
    )
    return start_streams(repo, groups, options, spark=spark)


def start_streams(
    repo: Repo, groups: list[str] | None, options: StreamOptions, *, spark: SparkSession | None = None
) -> StreamRun:
    """`stream`, its options as one value (features.pipelines.options)."""
    selected = repo.select(groups)
    if options.from_savepoint is not None and (len(selected) != 1 or options.reset):
        raise ConfigError(
            "--from-savepoint: a savepoint starts one group in a new checkpoint: name it with --group, without --reset"
        )
    for group in selected:  # two processes writing one checkpoint would corrupt it
        handoff.check_free(repo, group.name, Path(repo.checkpoint_path(group, options.checkpoint_root)))
    writers = {g.name: ready_writer(repo, g) for g in selected} if options.online else {}
    session = session_soon(spark, long_running=not options.available_now)  # the JVM starts while the MLflow run is made
    run = StreamRun({}, {})
    trigger = "available-now" if options.available_now else options.trigger
    params = {"trigger": trigger, "buckets": options.buckets, "online": options.online}
    run._tracking = mlflow_tracking.start_run(
        repo, "stream", selected, params, enabled=options.tracking, background=True
    )
    run.tracker = run._tracking.__enter__()
    starter = GroupStarter(repo, run, options)
    try:
        starter.spark = session()
        _check_not_connect(starter.spark)
        stream_operator.configure(starter.spark)
        for group in selected:
            writer, savepoint_path = writers.get(group.name), options.from_savepoint
            starter.start(group, writer, buckets=options.buckets, reset=options.reset, from_savepoint=savepoint_path)
    except BaseException as exc:
        for query in [*run.queries.values(), *run.archives.values()]:
            query.stop()
        run._finish(exc)
        raise
    # Keeps the run's mark on its checkpoints; a live run takes up `features apply` and `--buckets` handed to it.
    run.watchdog = observing("stream")
    reload.watch(run, starter, live=not options.available_now)
    return run


@dataclass
class GroupStarter:
    """Starts a group's query into a run: at the run's start, and again when a live stream takes up a changed
    definition (features.pipelines.stream.reload)."""

    repo: Repo
    run: StreamRun
    options: StreamOptions
    spark: Any = None  # the session, once started

    def start(
        self,
        group: FeatureGroup,
        writer: OnlineWriter | None,
        *,
        buckets: int | None = None,
        reset: bool = False,
        from_savepoint: str | None = None,
    ) -> Carried | None:
        """Continue `group` from its checkpoint (carrying its state over a changed definition or a new `buckets`),
        or start it from a savepoint, or over from the source (`reset`), and put its query in the run. Returns what
        was carried over, if anything was."""
        spark, repo, run, options = self.spark, self.repo, self.run, self.options
        checkpoint = Path(repo.checkpoint_path(group, options.checkpoint_root))
        path = repo.source_path(group)
        restored = None
        if from_savepoint is not None:
            restored = savepoint.restore(spark, repo, group, checkpoint, from_savepoint, buckets)
            print(restored.line(), file=sys.stderr, flush=True)
            run.carried[group.name] = restored
        savepoint.check_restored(checkpoint, group)
        resumed = _check_checkpoint(repo, group, checkpoint, buckets, reset, spark)
        if resumed.carried is not None:
            print(resumed.carried.line(), file=sys.stderr, flush=True)
            run.carried[group.name] = resumed.carried
        labels = resumed.labels
        events, projection, out = stateful_query(
            spark,
            group,
            path,
            labels,
            layout=layout(group, len(labels)).id,
            upgrade=resumed.upgrade,
            nanoseconds=resumed.nanoseconds,
            nulls=resumed.nulls,
            max_files_per_trigger=options.max_files_per_trigger,
        )
        rollup = MetricRollup(partial(_log_metrics, run.tracker), options.metrics_seconds)
        run.rollups.append(rollup)
        aside = SetAside(
            repo,
            group,
            spark,
            projection.record_schema,
            rollup,
            options.keep_seconds,
            resumed.nanoseconds,
            resumed.nulls,
        )
        sink = BatchSink(repo, group, writer, options.validate, run, options.shows_progress, spark, aside, rollup)
        sink.stream_id = resumed.stream_id
        sink.checkpoint = checkpoint
        if group.source.kafka is None:
            sink.source_log = Pruning(checkpoint / "query")
        if resumed.upgrade is not None:
            sink.finish_upgrade = Finish(checkpoint, len(labels))
            run.changing.append(sink.finish_upgrade)
        query = out.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint / "query"))
        query = query.queryName(f"features_{group.name}").trigger(**options.spark_trigger)
        if group.name not in run.latest:
            # Until its first batch reports, a run stands at the watermark its checkpoint's last batch emitted up to.
            run.latest[group.name] = StreamProgress(group.name, watermark=emitted_watermark(checkpoint / "query"))
        run.tracker.ready()  # a tracking store that cannot start stops the stream before its first batch
        with query_settings(spark, resumed.partitions):
            run.queries[group.name] = sink.query = query.start()
        run.sinks[group.name] = sink
        handoff.hold(checkpoint, live=not options.available_now)
        source = group.source
        if source.kafka is not None and source.kafka.archive and source.name not in run.archives:
            archived = checkpoint.parent / f"_archive_{source.name}"
            run.archives[source.name] = _archive(group, events, path, archived, options.spark_trigger)
        return resumed.carried or restored


CONNECT_UNSUPPORTED = (
    "the stream cannot run on a Spark Connect session (Databricks serverless or a shared cluster, SPARK_REMOTE): "
    "Spark Connect runs a foreachBatch function in a Python process of its own on the server, and the stream's "
    "micro-batch sink reports each batch to this run (progress, errors, MLflow metrics, the stop between batches), "
    "which that process cannot reach. Run the stream on a classic session instead: a cluster in dedicated (single "
    "user) access mode, `spark-submit jobs/stream.py`, or `features stream` without SPARK_REMOTE. Backfills "
    "(`features backfill --since-last`, e.g. every few minutes) do run on Spark Connect"
)


def _log_metrics(tracker: Any, metrics: dict[str, float], step: int, group: str) -> None:
    tracker.log_metrics(metrics, step=step, group=group)


def _archive(
    group: FeatureGroup, events: DataFrame, path: str, checkpoint: Path, trigger: dict[str, Any]
) -> StreamingQuery:
    """Start the query that writes every record read from a Kafka source into its folder, as Parquet partitioned
    by event date, for backfills. Spark's file sink writes each micro-batch's files exactly once: its log
    (`_spark_metadata` in the folder) lists the files of committed batches, and Spark's readers of the folder,
    the backfill's among them, read only those."""

    rows = kafka.archive_rows(group, events)
    writer = rows.writeStream.format("parquet").partitionBy(kafka.ARCHIVE_DATE).outputMode("append")
    writer = writer.option("checkpointLocation", str(checkpoint)).queryName(f"features_archive_{group.source.name}")
    return writer.trigger(**trigger).start(path)


def _check_not_connect(spark: SparkSession) -> None:

    if is_connect(spark):
        raise EnvironmentProblem(CONNECT_UNSUPPORTED)


@dataclass(frozen=True)
class Resumed:
    """What a stream continues from its checkpoint with."""

    labels: list[int]  # the bucket labels the state was built with
    partitions: int  # the stateful operator's partitions
    # Whether the stream reads nanosecond Parquet files (features.engine.stream_source.reads_nanoseconds: decided
    # when the checkpoint starts, as that decides how many sources its query has, which Spark keeps).
    nanoseconds: bool
    stream_id: str
    # Whether it reads files holding a column as Arrow's null type (features.engine.stream_source.read_stream: a
    # source more, so also decided when the checkpoint starts).
    nulls: bool
    upgrade: PendingUpgrade | None = None  # a definition change its buckets apply as they step
    carried: Carried | None = None  # that change, when this start made it


def _check_checkpoint(
    repo: Repo, group: FeatureGroup, checkpoint: Path, buckets: int | None, reset: bool, spark: SparkSession
) -> Resumed:
    """How the stream continues from its checkpoint (new labels and partitions for a new checkpoint). A changed
    definition carries the state over (features.pipelines.stream.upgrade); other changes to the saved state stop,
    and `reset` starts over from the source.

    A new checkpoint gets one shuffle partition per core and, by default, one bucket per partition: one task
    and one Python call per core and batch, which costs the least per batch. Both are fixed when a checkpoint
    starts: Spark keeps the partition count in its checkpoint, and the labels are saved with the definition, as
    a key's state lives under its bucket's label."""

    saved = saved_definition(checkpoint)
    if reset:
        shutil.rmtree(checkpoint, ignore_errors=True)
        _remove_stream_rows(spark, repo, group)  # the replay writes every change point again
        shutil.rmtree(repo.late_path(group), ignore_errors=True)
        saved = None
    if saved is not None and buckets is None:
        buckets = saved["buckets"]
    if saved is not None and saved.get("state_format") != stream_operator.STATE_FORMAT:
        raise _cannot_continue(
            repo,
            group,
            checkpoint,
            "was written by another version of features, in a layout this version does not read (to keep it: "
            "`features savepoint` with the version that wrote it, then `features stream --from-savepoint` with this "
            "one)",
        )
    upgrade, carried = None, None
    if saved is not None:
        # A checkpoint from before the choice always read nanosecond files (a second source).
        labels, partitions, nanoseconds = saved["labels"], saved["partitions"], saved.get("nanoseconds", True)
        nulls = saved.get("nulls", False)  # a checkpoint from before that read has no source for it
        if saved["buckets"] != buckets:
            target = _rescaled_partitions(spark, checkpoint / "query", int(buckets), partitions)
            labels = bucket_labels(int(buckets), target)
            upgrade, carried = rescale(spark, repo, group, checkpoint, saved, labels)
            if carried is not None and state_partitions(checkpoint / "query") != target:
                began = time.perf_counter()
                repartition_state(spark, checkpoint / "query", target)
                moved = time.perf_counter() - began
                carried = replace(carried, seconds=carried.seconds + moved, repartitioned=(partitions, target))
            partitions = target
        elif saved["definition_hash"] != definition_hash(group):
            upgrade, carried = carry_over(spark, repo, group, checkpoint, saved, labels)
        elif saved.get("upgrade"):
            upgrade = PendingUpgrade.from_json(saved["upgrade"])
    else:
        partitions = cores(spark)
        labels = bucket_labels(buckets or partitions, partitions)
        nanoseconds = stream_source.reads_nanoseconds(spark, group, repo.source_path(group))
        nulls = stream_source.NULLS_READ
    current = state_record(group, labels, partitions, nanoseconds, upgrade, (saved or {}).get("stream_id"), nulls)
    save_definition(checkpoint, current)
    return Resumed(labels, partitions, nanoseconds, current["stream_id"], nulls, upgrade, carried)


def _rescaled_partitions(spark: SparkSession, query: Path, buckets: int, partitions: int) -> int:
    """The partitions a rescale to `buckets` runs on: one per bucket up to the session's cores, where Spark can
    repartition the saved state (PySpark 4.2+, and a committed batch to start from); else the checkpoint's own."""
    if last_commit(query)[0] is None or not can_repartition_state(spark):
        return partitions
    return min(buckets, cores(spark))


def _remove_stream_rows(spark: SparkSession, repo: Repo, group: FeatureGroup) -> None:
    """Take the stream's rows out of the offline table: all rows but those in the ranges backfills wrote."""

    table = repo.offline_path(group)
    log = offline.StreamLog(table, "", spans=offline.completed_days(table, group.name))
    log.refresh()
    offline.remove_stream_rows(spark, table, log.spans)


def _cannot_continue(repo: Repo, group: FeatureGroup, checkpoint: Path, why: str) -> ConfigError:
    return ConfigError(
        f"{group.name}: the stream's saved state in {checkpoint} {why}, so it cannot continue. Start over with "
        f"`features stream --repo {repo.root} --group {group.name} --reset`, which deletes that state and rebuilds "
        "it by replaying the source"
    )


__all__ = ["StreamProgress", "StreamRun", "ValidationFailed", "stream"]
