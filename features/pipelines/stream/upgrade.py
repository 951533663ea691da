"""How a group's stream continues from its checkpoint (`resume`, as its query starts): with the state as saved,
with the state carried over a changed definition (`carry_over`) or number of buckets (`rescale`) instead of a
replay of the source, or over from the source (`--reset`); a change the state cannot take is refused with the fix
(docs/streaming.md, "Changing a running group"). Beneath it: the checkpoint's saved record
(features.engine.stream_definition), the Spark jobs that build and move pane rows (features.engine.state_upgrade)
and the columns a change keeps, builds and drops (features.kernel.migrate).

When `features stream` starts on a checkpoint whose saved definition differs from the group's, the state's columns
are compared by what they hold (features.kernel.migrate): unchanged features keep their pane partials, removed ones
are dropped, and the added or changed ones are built by one batch job over the files (or Kafka offsets) the
stream's committed micro-batches had read, from as far back as their windows need (all of them for a Lifetime or
Session feature).
Each bucket applies the change to its state the first time it steps under the new definition; once a committed
micro-batch has stepped every bucket, the built panes are deleted and the change is done.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from features.engine import stream_source
from features.engine.inputs import bucket_labels
from features.engine.query_log import Position, committed_position, last_commit, state_partitions
from features.engine.schema import schema_of
from features.engine.session import cores
from features.engine.state_upgrade import (
    Gap,
    PendingUpgrade,
    build_panes,
    committed_file_events,
    committed_kafka_events,
    gaps,
    rebucket_state,
)
from features.engine.stream_definition import (
    STATE_FORMAT,
    layout,
    save_definition,
    save_state,
    saved_definition,
    saved_layout,
)
from features.engine.stream_query import can_repartition_state, repartition_state
from features.engine.stream_source import StreamSource
from features.errors import ConfigError
from features.kernel.migrate import Change
from features.kernel.panes import MICROS, lookback_start
from features.repo import Repo
from features.spec import FeatureGroup
from features.spec.fingerprint import definition_hash
from features.stores import offline

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FOLDER = "upgrade"  # beside the query's checkpoint: the built panes of a pending change


@dataclass(frozen=True)
class Carried:
    """What carrying a stream's state over a definition change did."""

    group: str
    kept: list[str]
    built: list[str]
    dropped: list[str]
    events: int
    since: datetime | None  # the earliest event time read for the built features (None: all of it)
    upto: datetime | None  # the watermark the state had emitted up to
    read: str  # what of the source was read: "1,440 files", "4 partitions of <topic>"
    seconds: float
    rescaled: tuple[int, int, int] | None = None  # buckets before, after, and the keys moved
    repartitioned: tuple[int, int] | None = None  # the state's partitions before and after (Spark's repartition)
    restored: tuple[str, int, int, int, int] | None = None  # savepoint, its batch, keys, buckets before and after

    def line(self) -> str:
        if self.restored is not None:
            path, batch, keys, before, after = self.restored
            text = (
                f"{self.group}: started from the savepoint {path} (batch {batch}, {keys:,} keys, --buckets {before} "
                f"-> {after}) in {self.seconds:.1f}s, without a replay: kept {_names(self.kept)}"
            )
            return text + self._built_and_dropped()
        if self.rescaled is not None:
            before, after, keys = self.rescaled
            spread = ""
            if self.repartitioned is not None:
                was, now = self.repartitioned
                spread = f", and Spark's state spread from {was} to {now} partitions (tasks per micro-batch)"
            return (
                f"{self.group}: --buckets {before} -> {after}: the state of {keys:,} keys moved to their new buckets"
                f"{spread} without a replay in {self.seconds:.1f}s"
            )
        text = f"{self.group}: definition changed, state carried over without a replay: kept {_names(self.kept)}"
        return text + self._built_and_dropped()

    def _built_and_dropped(self) -> str:
        text = ""
        if self.built:
            since = "the beginning" if self.since is None else f"{self.since:%Y-%m-%d %H:%M}"
            text += (
                f"; built {_names(self.built)} from {self.events:,} events of {self.read} read so far "
                f"(event time from {since}) in {self.seconds:.1f}s"
            )
        if self.dropped:
            text += f"; dropped {_names(self.dropped)}"
        return text


def _names(names: list[str]) -> str:
    return ", ".join(names) if names else "nothing"


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
    layout: str  # the id of the layout its state has (features.kernel.migrate.Layout)
    upgrade: PendingUpgrade | None = None  # a definition change its buckets apply as they step
    carried: Carried | None = None  # that change, when this start made it


def resume(
    spark: SparkSession,
    repo: Repo,
    group: FeatureGroup,
    checkpoint: Path,
    source: StreamSource,
    buckets: int | None,
    reset: bool,
) -> Resumed:
    """How the stream continues from its checkpoint (new labels and partitions for a new checkpoint). A changed
    definition or number of buckets carries the state over (`carry_over`, `rescale`); other changes to the saved
    state stop, and `reset` starts over from the source.

    A new checkpoint gets one shuffle partition per core and, by default, one bucket per partition: one task
    and one Python call per core and batch, which costs the least per batch. Both are fixed when a checkpoint
    starts: Spark keeps the partition count in its checkpoint, and the labels are saved with the definition, as
    a key's state lives under its bucket's label."""

    saved = None if reset else saved_definition(checkpoint)
    if saved is not None and buckets is None:
        buckets = saved["buckets"]
    if saved is not None and saved.get("state_format") != STATE_FORMAT:
        raise ConfigError(
            f"{group.name}: the stream's saved state in {checkpoint} was written by another version of features, in "
            "a layout this version does not read, so it cannot continue (to keep it: `features savepoint` with the "
            "version that wrote it, then `features stream --from-savepoint` with this one). Start over with "
            f"`features stream --repo {repo.root} --group {group.name} --reset`, which deletes that state and "
            "rebuilds it by replaying the source"
        )
    upgrade, carried = None, None
    if saved is not None:
        # A checkpoint from before the choice always read nanosecond files (a second source).
        labels, partitions, nanoseconds = saved["labels"], saved["partitions"], saved.get("nanoseconds", True)
        nulls = saved.get("nulls", False)  # a checkpoint from before that read has no source for it
        if saved["buckets"] != buckets:
            target = _rescaled_partitions(spark, checkpoint / "query", int(buckets), partitions)
            labels = bucket_labels(int(buckets), target)
            upgrade, carried = rescale(spark, repo, group, checkpoint, saved, labels, source)
            if carried is not None and state_partitions(checkpoint / "query") != target:
                began = time.perf_counter()
                repartition_state(spark, checkpoint / "query", target)
                moved = time.perf_counter() - began
                carried = replace(carried, seconds=carried.seconds + moved, repartitioned=(partitions, target))
            partitions = target
        elif saved["definition_hash"] != definition_hash(group):
            upgrade, carried = carry_over(spark, repo, group, checkpoint, saved, labels, source)
        elif saved.get("upgrade"):
            upgrade = PendingUpgrade.from_json(saved["upgrade"])
    else:
        partitions = cores(spark)
        labels = bucket_labels(buckets or partitions, partitions)
        nanoseconds = stream_source.reads_nanoseconds(spark, group, source)
        nulls = stream_source.NULLS_READ
    if reset:  # the state goes, and the replay writes every change point and late event again
        shutil.rmtree(checkpoint, ignore_errors=True)
        table = repo.offline_path(group)
        log = offline.StreamLog(table, "", spans=offline.completed_days(table, group.name))
        log.refresh()  # the stream's rows are all but those in the ranges backfills wrote
        offline.remove_stream_rows(spark, table, log.spans)
        shutil.rmtree(repo.late_path(group), ignore_errors=True)
    stream_id = (saved or {}).get("stream_id")
    current = save_state(checkpoint, group, labels, partitions, nanoseconds, upgrade, stream_id, nulls)
    return Resumed(
        labels, partitions, nanoseconds, current["stream_id"], nulls, layout(group, len(labels)).id, upgrade, carried
    )


def _rescaled_partitions(spark: SparkSession, query: Path, buckets: int, partitions: int) -> int:
    """The partitions a rescale to `buckets` runs on: one per bucket up to the session's cores, where Spark can
    repartition the saved state (PySpark 4.2+, and a committed batch to start from); else the checkpoint's own."""
    if last_commit(query)[0] is None or not can_repartition_state(spark):
        return partitions
    return min(buckets, cores(spark))


def carry_over(
    spark: SparkSession,
    repo: Repo,
    group: FeatureGroup,
    checkpoint: Path,
    saved: dict[str, Any],
    labels: list[int],
    source: StreamSource,
) -> tuple[PendingUpgrade | None, Carried | None]:
    """The change the stream's buckets will apply to their state (None when the checkpoint holds no committed
    batch: nothing to carry), with the new features' panes built. Raises where the state cannot be carried."""
    check_carriable(repo, group, checkpoint, saved)
    position = committed_position(checkpoint / "query")
    if position.batch is None:
        return None, None
    change = Change(saved_layout(saved), layout(group, len(labels)))
    folder = checkpoint / FOLDER / change.after.id
    carried = build_added(spark, repo, group, source, change, saved["definition"], position, labels, folder)
    return PendingUpgrade(change, str(folder) if carried.built else None), carried


def build_added(
    spark: SparkSession,
    repo: Repo,
    group: FeatureGroup,
    source: StreamSource,
    change: Change,
    before: dict[str, Any],
    position: Position,
    labels: list[int],
    folder: Path,
) -> Carried:
    """The panes of the features `change` adds (or changes), built from the good events the state holds
    (`position`: its files or Kafka offsets) over their lookback from its watermark into `folder` (nothing when
    none is added); what the change keeps, builds and drops of `before` (the definition the state was built
    for)."""
    began = time.perf_counter()
    built = change.features(change.built)
    kept = [f.name for f in group.features if f.name not in built]
    dropped = sorted({f["name"] for f in before["features"]} - set(kept) - set(built))
    since, events, watermark_us = None, 0, position.watermark_us
    offsets = position.offsets
    if built:
        since = lookback_start([f.window for f in group.features if f.name in built], watermark_us)
        shutil.rmtree(folder, ignore_errors=True)
        if offsets is None:
            good, observation = committed_file_events(spark, group, source.path, position), None
        else:
            good, observation = committed_kafka_events(spark, group, source.schema, offsets)
        events = build_panes(spark, group, good, labels, since, watermark_us, folder).events
        missing = [] if offsets is None or observation is None else gaps(offsets, observation, since)
        if missing:
            shutil.rmtree(folder, ignore_errors=True)
            raise ConfigError(_gap_message(str(repo.root), group.name, offsets.topic, missing, since))
    read = position.file_count() if offsets is None else f"{len(offsets.end)} partitions of {offsets.topic}"
    return Carried(
        group.name,
        kept,
        built,
        dropped,
        events,
        None if since is None else datetime.fromtimestamp(since / MICROS, UTC),
        None if watermark_us is None else datetime.fromtimestamp(watermark_us / MICROS, UTC),
        read,
        time.perf_counter() - began,
    )


def _gap_message(root: str, name: str, topic: str, missing: list[Gap], since: int | None) -> str:
    """Why the features a change adds cannot be built from the topic, and the choices."""
    where = "; ".join(
        f"partition {g.partition}: offsets {g.start} to {'its end' if g.first is None else g.first - 1}"
        for g in missing
    )
    need = (
        "all of the events the state holds (a Lifetime or Session feature)"
        if since is None
        else f"the events from {datetime.fromtimestamp(since / MICROS, UTC):%Y-%m-%d %H:%M} UTC on"
    )
    return (
        f"{name}: the features this change adds need {need}, and topic {topic!r} no longer holds some of "
        f"them (its retention deleted {where}). Either keep the previous definition running and add the feature "
        f"with a window that fits the topic's retention, or start over with `features stream --repo {root} "
        f"--group {name} --reset` (a replay reads only what the topic still holds; `features backfill` over "
        "the source's path, which a KafkaTopic(archive=True) keeps, fills the offline table's history)"
    )


def rescale(
    spark: SparkSession,
    repo: Repo,
    group: FeatureGroup,
    checkpoint: Path,
    saved: dict[str, Any],
    labels: list[int],
    source: StreamSource,
) -> tuple[PendingUpgrade | None, Carried | None]:
    """The keys' state moved from the saved buckets to `labels` (read from the checkpoint with Spark's state data
    source, regrouped, applied by each bucket as it first steps): no event is read again."""
    why = None
    if saved["definition_hash"] != definition_hash(group):
        why = "was built for another definition too: change the definition and the number of buckets one at a time"
    elif saved.get("upgrade"):
        why = "is still applying a previous change (no micro-batch with events has run since)"
    if why is not None:
        raise ConfigError(
            f"{group.name}: --buckets {saved['buckets']} -> {len(labels)}: the stream's saved state in {checkpoint} "
            f"{why}. Or start over with `features stream --repo {repo.root} --group {group.name} --reset`"
        )
    if last_commit(checkpoint / "query")[0] is None:  # no committed batch: no state to move
        return None, None
    began = time.perf_counter()
    before, after = saved_layout(saved), layout(group, len(labels))
    folder = checkpoint / FOLDER / after.id
    shutil.rmtree(folder, ignore_errors=True)
    key_types = group.output_types(schema_of(source.schema))
    moved = rebucket_state(
        spark, checkpoint / "query", group, {k: key_types[k] for k in group.join_keys}, labels, folder
    )
    upgrade = PendingUpgrade(Change(before, after), None, str(folder), moved.emitted_upto_us, moved.newest_us)
    names = [f.name for f in group.features]
    seconds = time.perf_counter() - began
    carried = Carried(
        group.name, names, [], [], 0, None, None, "", seconds, rescaled=(saved["buckets"], len(labels), moved.keys)
    )
    return upgrade, carried


def replay_needed(group: FeatureGroup, saved: dict[str, Any]) -> str | None:
    """Why a stream whose checkpoint saved definition `saved` (the checkpoint's features-definition.json) cannot
    carry its state over to `group` and must replay the source (None: it can). Asked by the stream as it starts
    and by `features apply` and `plan`, which refuse such a change while a stream runs the group."""
    before = saved["definition"]
    if list(before["entity"]["join_keys"]) != list(group.join_keys):
        return (
            f"keys its state by {', '.join(before['entity']['join_keys'])}, and the group is now keyed by "
            f"{', '.join(group.join_keys)}: every key is new, so a replay of the source is the least it takes"
        )
    if before["source"]["timestamp"] != group.source.timestamp:
        return "was built on another timestamp column: every event's time changed, so the source must be replayed"
    return None


def check_carriable(repo: Repo, group: FeatureGroup, checkpoint: Path, saved: dict[str, Any]) -> None:
    why = replay_needed(group, saved)
    if why is None and saved.get("upgrade"):
        why = (
            "is still applying the previous definition change (no micro-batch with events has run since): run the "
            "stream on the previous definition until one has, then apply the new one"
        )
    if why is not None:
        raise ConfigError(
            f"{group.name}: the stream's saved state in {checkpoint} {why}. Start over with `features stream --repo "
            f"{repo.root} --group {group.name} --reset`, which deletes that state and rebuilds it from the source"
        )


@dataclass
class Finish:
    """Ends a pending change once every bucket has applied it: once a micro-batch that stepped every bucket has
    committed (found at a later batch, or when the run ends), its built panes go and the saved definition forgets
    it."""

    checkpoint: Path
    buckets: int
    stepped_in: int | None = None
    done: bool = False

    def observe(self, batch_id: int, stepped: int) -> None:
        if self.stepped_in is None and stepped >= self.buckets:
            self.stepped_in = batch_id
        self.settle()

    def settle(self) -> None:
        """Finish the change if the batch that stepped every bucket is in Spark's commit log."""
        if self.done or self.stepped_in is None:
            return
        if not (self.checkpoint / "query" / "commits" / str(self.stepped_in)).exists():
            return
        saved = saved_definition(self.checkpoint)
        if saved is not None and saved.get("upgrade"):
            folders = [saved["upgrade"].get(k) for k in ("folder", "state")]
            saved["upgrade"] = None
            save_definition(self.checkpoint, saved)
            for folder in filter(None, folders):
                shutil.rmtree(folder, ignore_errors=True)
        self.done = True
