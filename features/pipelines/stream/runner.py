"""`features stream`: run feature groups as Spark Structured Streaming queries that keep the offline table and
the online store fresh. `stream` starts one query per group (features.pipelines.stream.starter) and returns the
run, which waits for its queries, stops them, and ends its MLflow run once.

    run = stream(Repo.load("feature_repo"), available_now=True)   # process what has landed, then stop
    run.await_termination()
    run.progress()            # one StreamProgress per group: rates, watermark, state, rows, late events

Per micro-batch (features.pipelines.stream.sink), in this order: the change points are validated
(features.quality; a failing batch is quarantined by default and nothing of it is written), appended to the
offline table in one commit that records the stream and the batch id, and each key's newest value is written to
the online store with the event-time guard. A batch replayed after a crash finds its commit and appends nothing
again, and cannot move an online value back in time, so both stores end up as if each batch ran once. Late
events go to `Repo.late_path(group)/batch=<id>`, bad source records to the group's quarantine folder, both with
the batch id (features.pipelines.stream.aside).
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql import SparkSession

from features.engine import stream_operator
from features.engine.session import is_connect, session_soon
from features.engine.watchdog import observing
from features.errors import ConfigError, EnvironmentProblem, ValidationFailed
from features.ml import tracking as mlflow_tracking
from features.pipelines.backfill import ready_writer
from features.pipelines.options import DEFAULT_KEEP, StreamOptions
from features.pipelines.rollup import MetricRollup
from features.pipelines.stream import handoff, reload
from features.pipelines.stream.batch_progress import StreamProgress
from features.pipelines.stream.sink import BatchSink
from features.pipelines.stream.starter import GroupStarter
from features.pipelines.stream.upgrade import Carried, Finish
from features.repo import Repo

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery


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

    def _finish(self, error: BaseException | None) -> BaseException | None:
        """End the MLflow run once, after the metrics of the last batches and the offline tables' compaction rounds
        under way: FINISHED, or FAILED with the error (the run's, else a round's, which is returned)."""
        with self._finishing:  # stop() and a waiting thread may both get here
            tracking, self._tracking = self._tracking, None
            for change in self.changing:  # the last batch, which stepped every bucket, committed after its sink
                change.settle()
            for sink in self.sinks.values():
                try:
                    sink.end_rounds()
                except Exception as exc:
                    if error is None:
                        error = exc
                    else:  # the run's own error is what it failed with; this one is told with it
                        error.add_note(f"{sink.group.name}: its offline table's compaction round failed too: {exc}")
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
        return error

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
                        return self._finished_well()
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
        return self._finished_well()

    def _finished_well(self) -> bool:
        """`_finish` of a run that did not fail: True, or a compaction round's error raised."""
        failed = self._finish(None)
        if failed is not None:
            raise failed
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
        self._finished_well()

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


CONNECT_UNSUPPORTED = (
    "the stream cannot run on a Spark Connect session (Databricks serverless or a shared cluster, SPARK_REMOTE): "
    "Spark Connect runs a foreachBatch function in a Python process of its own on the server, and the stream's "
    "micro-batch sink reports each batch to this run (progress, errors, MLflow metrics, the stop between batches), "
    "which that process cannot reach. Run the stream on a classic session instead: a cluster in dedicated (single "
    "user) access mode, `spark-submit jobs/stream.py`, or `features stream` without SPARK_REMOTE. Backfills "
    "(`features backfill --since-last`, e.g. every few minutes) do run on Spark Connect"
)


def _check_not_connect(spark: SparkSession) -> None:

    if is_connect(spark):
        raise EnvironmentProblem(CONNECT_UNSUPPORTED)


__all__ = ["StreamProgress", "StreamRun", "ValidationFailed", "stream"]
