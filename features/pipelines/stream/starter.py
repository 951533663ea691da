"""A group's query started into a stream's run (features.pipelines.stream.runner): its source resolved, its
checkpoint started from a savepoint or resumed (its state carried over a changed definition or number of buckets:
features.pipelines.stream.upgrade), the query built to its stateful operator with its sink, and a Kafka source's
archive started. At the run's start, and again when a live run takes up a change (features.pipelines.stream.reload).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from features.engine import kafka, stream_source
from features.engine.source_log import Pruning
from features.engine.stream_query import query_settings, stateful_query
from features.pipelines.options import StreamOptions
from features.pipelines.rollup import MetricRollup
from features.pipelines.stream import handoff, savepoint
from features.pipelines.stream.aside import SetAside
from features.pipelines.stream.batch_progress import ListingWatch, StreamProgress, emitted_watermark
from features.pipelines.stream.sink import BatchSink
from features.pipelines.stream.upgrade import Carried, Finish, resume
from features.repo import Repo
from features.spec import FeatureGroup

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

    from features.stores.online import OnlineWriter


class StartedRun(Protocol):
    """What a start fills in of the run (features.pipelines.stream.runner.StreamRun)."""

    queries: dict[str, StreamingQuery]
    archives: dict[str, StreamingQuery]  # per Kafka source archived
    sinks: dict[str, BatchSink]
    latest: dict[str, StreamProgress]
    carried: dict[str, Carried]
    changing: list[Finish]
    rollups: list[MetricRollup]
    tracker: Any


@dataclass
class GroupStarter:
    """Starts a group's query into a run: at the run's start, and again when a live stream takes up a changed
    definition (features.pipelines.stream.reload)."""

    repo: Repo
    run: StartedRun
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
        checkpoint, path = Path(repo.checkpoint_path(group, options.checkpoint_root)), repo.source_path(group)
        source = stream_source.resolve(spark, group, path)
        restored = savepoint.prepare(spark, repo, group, checkpoint, source, from_savepoint, buckets)
        if restored is not None:
            print(restored.line(), file=sys.stderr, flush=True)
            run.carried[group.name] = restored
        resumed = resume(spark, repo, group, checkpoint, source, buckets, reset)
        if resumed.carried is not None:
            print(resumed.carried.line(), file=sys.stderr, flush=True)
            run.carried[group.name] = resumed.carried
        labels = resumed.labels
        events, projection, out = stateful_query(
            spark,
            group,
            source,
            labels,
            layout=resumed.layout,
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
            source,
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
            if not options.available_now:
                sink.listing = ListingWatch(group.name, str(path), options.trigger_seconds)
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
        topic, name = group.source.kafka, group.source.name
        if topic is not None and topic.archive and name not in run.archives:
            archived = checkpoint.parent / f"_archive_{name}"
            run.archives[name] = kafka.start_archive(group, events, source.path, archived, options.spark_trigger)
        return resumed.carried or restored


def _log_metrics(tracker: Any, metrics: dict[str, float], step: int, group: str) -> None:
    tracker.log_metrics(metrics, step=step, group=group)
