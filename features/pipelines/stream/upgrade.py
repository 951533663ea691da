"""A running group's definition changed: its stream carries the state over instead of replaying the source
(docs/streaming.md, "Changing a running group").

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
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from features.engine import stream_operator, stream_source
from features.engine.query_log import Position, committed_position, last_commit
from features.engine.schema import schema_of
from features.engine.state_upgrade import (
    Gap,
    PendingUpgrade,
    build_panes,
    committed_file_events,
    committed_kafka_events,
    gaps,
    rebucket_state,
)
from features.engine.stream_definition import save_definition, saved_definition
from features.errors import ConfigError
from features.kernel.migrate import Change, Layout, layout_of
from features.kernel.panes import MICROS, lookback_start
from features.pipelines.stream.handoff import replay_needed
from features.repo import Repo
from features.spec import FeatureGroup
from features.spec.fingerprint import definition_hash, describe

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


def layout(group: FeatureGroup, buckets: int) -> Layout:
    return layout_of(describe(group), buckets)


def saved_layout(saved: dict[str, Any]) -> Layout:
    """The layout of a checkpoint's state (checkpoints from before layouts were saved: from their definition)."""
    return Layout.from_json(saved["layout"]) if "layout" in saved else layout_of(saved["definition"])


def state_record(
    group: FeatureGroup,
    labels: list[int],
    partitions: int,
    nanoseconds: bool,
    upgrade: PendingUpgrade | None,
    stream_id: str | None = None,
    nulls: bool = True,
) -> dict[str, Any]:
    """What a checkpoint saves beside Spark's files (`features-definition.json`): the definition and layout its
    state holds, its buckets, and a change its buckets have yet to apply."""
    return {
        "definition_hash": definition_hash(group),
        "buckets": len(labels),
        "labels": labels,
        "partitions": partitions,
        "nanoseconds": nanoseconds,
        "nulls": nulls,  # whether it reads files holding a column as Arrow's null type (stream_source.read_stream)
        "state_format": stream_operator.STATE_FORMAT,
        "definition": describe(group),
        "layout": layout(group, len(labels)).to_json(),
        "upgrade": None if upgrade is None else upgrade.to_json(),
        # Recorded in its offline commits, so that a restart finds its last batch; a new checkpoint, a new id.
        "stream_id": stream_id or uuid.uuid4().hex,
    }


def carry_over(
    spark: SparkSession,
    repo: Repo,
    group: FeatureGroup,
    checkpoint: Path,
    saved: dict[str, Any],
    labels: list[int],
) -> tuple[PendingUpgrade | None, Carried | None]:
    """The change the stream's buckets will apply to their state (None when the checkpoint holds no committed
    batch: nothing to carry), with the new features' panes built. Raises where the state cannot be carried."""
    check_carriable(repo, group, checkpoint, saved)
    position = committed_position(checkpoint / "query")
    if position.batch is None:
        return None, None
    change = Change(saved_layout(saved), layout(group, len(labels)))
    folder = checkpoint / FOLDER / change.after.id
    carried = build_added(spark, repo, group, change, saved["definition"], position, labels, folder)
    return PendingUpgrade(change, str(folder) if carried.built else None), carried


def build_added(
    spark: SparkSession,
    repo: Repo,
    group: FeatureGroup,
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
            good, observation = committed_file_events(spark, group, repo.source_path(group), position), None
        else:
            good, observation = committed_kafka_events(spark, group, offsets)
        events = build_panes(spark, group, good, labels, since, watermark_us, folder).events
        missing = [] if offsets is None or observation is None else gaps(offsets, observation, since)
        if missing:
            shutil.rmtree(folder, ignore_errors=True)
            raise ConfigError(_gap_message(repo, group, offsets.topic, missing, since))
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


def _gap_message(repo: Repo, group: FeatureGroup, topic: str, missing: list[Gap], since: int | None) -> str:
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
        f"{group.name}: the features this change adds need {need}, and topic {topic!r} no longer holds some of "
        f"them (its retention deleted {where}). Either keep the previous definition running and add the feature "
        f"with a window that fits the topic's retention, or start over with `features stream --repo {repo.root} "
        f"--group {group.name} --reset` (a replay reads only what the topic still holds; `features backfill` over "
        "the source's path, which a KafkaTopic(archive=True) keeps, fills the offline table's history)"
    )


def rescale(
    spark: SparkSession,
    repo: Repo,
    group: FeatureGroup,
    checkpoint: Path,
    saved: dict[str, Any],
    labels: list[int],
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
    key_types = group.output_types(schema_of(stream_source.source_schema(spark, group, repo.source_path(group))))
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
