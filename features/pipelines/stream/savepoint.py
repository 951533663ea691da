"""Savepoints (docs/streaming.md, "Savepoints"): a group's stream state written at a batch boundary as a
self-describing folder, and a stream started from one into a new checkpoint, on another definition, another
number of buckets, another machine or a later version of `features`.

`take` reads the state of the last committed micro-batch (pinned, so that a running stream may go on) and writes
`savepoint.json` and `panes/` beside each other under a temporary name, renamed into place when complete.
`restore` builds the new checkpoint in place (Spark records a checkpoint's own paths in it), under a marker file
until it is complete: a first micro-batch over no events makes Spark's own checkpoint (its operator, state store
and logs), whose source position and watermark are then set to the savepoint's; the pane rows go to the new
buckets, and the stream's buckets take them as their state the first time they step, as after a rescale; features
the savepoint's definition lacked are built from the source over their lookback, as after a definition change
(features.pipelines.stream.upgrade). The Spark side (the pane rows, the source position):
features.engine.savepoint_files.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from features.engine import stream_source
from features.engine.inputs import bucket_labels
from features.engine.kafka import OffsetRange
from features.engine.query_log import Position, committed_position, last_commit
from features.engine.savepoint_files import (
    dump_panes,
    held_files,
    regroup_panes,
    relative_files,
    set_position,
    source_uris,
)
from features.engine.schema import schema_of
from features.engine.session import cores
from features.engine.state_upgrade import PendingUpgrade
from features.engine.stream_definition import STATE_FORMAT, layout, save_state, saved_definition, saved_layout
from features.engine.stream_query import query_settings, stateful_query
from features.engine.stream_source import StreamSource
from features.errors import ConfigError
from features.kernel.migrate import Change, Layout
from features.kernel.panes import MICROS
from features.pipelines.stream.upgrade import FOLDER, Carried, build_added
from features.repo import Repo
from features.spec import FeatureGroup
from features.version import package_version

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

FORMAT = 1  # savepoint.json's "format": this version writes it and reads it and every earlier one
MANIFEST = "savepoint.json"
RESTORING = "features-restoring"  # in a checkpoint a restore is building


def check_restored(checkpoint: Path, group: FeatureGroup) -> None:
    """Refuse a checkpoint a restore began and did not finish."""
    marker = checkpoint / RESTORING
    if marker.exists():
        raise ConfigError(
            f"{group.name}: the checkpoint {checkpoint} was being made from the savepoint {marker.read_text()} "
            "when that stopped; run the same command again: `features stream --group "
            f"{group.name} --from-savepoint {marker.read_text()}` (add the --checkpoint-dir it had, if any)"
        )


@dataclass(frozen=True)
class Taken:
    group: str
    path: Path
    batch: int
    keys: int
    rows: int
    done: str  # the source position: "12 source files done", "offsets of 4 partitions of <topic> done"
    watermark: datetime | None
    seconds: float

    def line(self) -> str:
        upto = "no watermark yet" if self.watermark is None else f"watermark {self.watermark:%Y-%m-%d %H:%M}"
        return (
            f"{self.group}: savepoint of batch {self.batch} ({self.keys:,} keys, {self.rows:,} pane rows, "
            f"{self.done}, {upto}) written to {self.path} in {self.seconds:.1f}s"
        )


def default_path(repo: Repo, group: FeatureGroup) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return repo.root / "data" / "savepoints" / group.name / stamp


def take(
    spark: SparkSession, repo: Repo, group: FeatureGroup, to: str | None = None, checkpoint_root: str | None = None
) -> Taken:
    """Write the group's stream state after its last committed micro-batch to `to` (default: under the repo's
    data/savepoints/<group>/)."""
    began = time.perf_counter()
    checkpoint = Path(repo.checkpoint_path(group, checkpoint_root))
    saved = saved_definition(checkpoint)
    batch = last_commit(checkpoint / "query")[0]
    if saved is None or batch is None:
        raise ConfigError(
            f"{group.name}: no stream state in {checkpoint} to save (no micro-batch has committed there). Run "
            f"`features stream --repo {repo.root} --group {group.name}` first, or pass the --checkpoint-dir it used"
        )
    why = _not_savable(group, saved)
    if why is not None:
        raise ConfigError(f"{group.name}: the stream's state in {checkpoint} {why}")
    target = Path(to).resolve() if to else default_path(repo, group)
    if target.exists() and any(target.iterdir()):
        raise ConfigError(f"--to: {target} already holds files; name a new folder for the savepoint")
    aside = target.with_name(f".{target.name}.writing-{uuid.uuid4().hex[:8]}")
    source = stream_source.resolve(spark, group, repo.source_path(group))
    position = committed_position(checkpoint / "query", batch)
    files = held_files(spark, position, source.path)  # the log's, and those it no longer lists
    key_types = group.output_types(schema_of(source.schema))
    try:
        dumped = dump_panes(
            spark, checkpoint / "query", group, {k: key_types[k] for k in group.join_keys}, batch, aside
        )
        manifest = {
            "format": FORMAT,
            "group": group.name,
            "written_by": package_version(),
            "created": datetime.now(UTC).isoformat(),
            "state_format": saved["state_format"],
            "definition": saved["definition"],
            "definition_hash": saved["definition_hash"],
            "layout": saved_layout(saved).to_json(),
            "buckets": saved["buckets"],
            "batch": batch,
            "watermark_us": position.watermark_us,
            "emitted_upto_us": dumped.emitted_upto_us,
            "newest_us": dumped.newest_us,
            "keys": dumped.keys,
            "rows": dumped.rows,
            "source": _source_position(position, files, source.path),
        }
        (aside / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            target.rmdir()  # empty: checked above
        os.replace(aside, target)
    finally:
        shutil.rmtree(aside, ignore_errors=True)
    watermark = None if position.watermark_us is None else datetime.fromtimestamp(position.watermark_us / MICROS, UTC)
    seconds = time.perf_counter() - began
    offsets = position.offsets
    done = (
        f"{len(files):,} source files done"
        if offsets is None
        else f"offsets of {len(offsets.end)} partitions of {offsets.topic} done"
    )
    return Taken(group.name, target, batch, dumped.keys, dumped.rows, done, watermark, seconds)


def _source_position(position: Position, files: frozenset[str], source: str) -> dict[str, Any]:
    """savepoint.json's "source": the files the state holds (relative to the source folder), and for a Kafka
    source the offsets it holds the records between, per partition."""
    out: dict[str, Any] = {"path": source, "files": relative_files(files, source)}
    if position.offsets is not None:
        offsets = position.offsets
        out["kafka"] = {"topic": offsets.topic, "start": offsets.start, "end": offsets.end}
    return out


def _offsets(manifest: dict[str, Any]) -> OffsetRange | None:
    kafka = manifest["source"].get("kafka")
    if kafka is None:
        return None
    start, end = ({int(p): int(o) for p, o in kafka[k].items()} for k in ("start", "end"))
    return OffsetRange(kafka["topic"], start, end)


def _not_savable(group: FeatureGroup, saved: dict[str, Any]) -> str | None:
    if saved.get("state_format") != STATE_FORMAT:
        return (
            "was written by another version of features, in a layout this version does not read: take the "
            "savepoint with the version that wrote it, and restore it with this one (`features stream "
            "--from-savepoint`)"
        )
    if saved.get("upgrade"):
        return (
            "is still applying a change (no micro-batch with events has run since it was made): let the stream run "
            "until one has, then take the savepoint"
        )
    if list(saved["definition"]["entity"]["join_keys"]) != list(group.join_keys):
        return (
            f"is keyed by {', '.join(saved['definition']['entity']['join_keys'])}, and the group now by "
            f"{', '.join(group.join_keys)}: take savepoints before changing a group's keys"
        )
    return None


def read_manifest(path: str | Path, group: FeatureGroup) -> dict[str, Any]:
    """A savepoint's description, checked against the group it is to start."""
    manifest_path = Path(path) / MANIFEST
    if not manifest_path.is_file():
        raise ConfigError(
            f"--from-savepoint: {path} is not a savepoint (no {MANIFEST} in it); `features savepoint` writes one"
        )
    manifest = json.loads(manifest_path.read_text())
    fmt = manifest.get("format")
    if not isinstance(fmt, int) or fmt > FORMAT:
        raise ConfigError(
            f"--from-savepoint: {path} is in savepoint format {fmt}, written by features {manifest.get('written_by')}; "
            f"this version reads formats up to {FORMAT}: upgrade features to restore it"
        )
    if manifest["group"] != group.name:
        raise ConfigError(
            f"--from-savepoint: {path} holds the state of group {manifest['group']!r}, not of {group.name!r}; "
            f"pass --group {manifest['group']}"
        )
    definition = manifest["definition"]
    why = None
    if list(definition["entity"]["join_keys"]) != list(group.join_keys):
        why = (
            f"keyed by {', '.join(definition['entity']['join_keys'])}, and the group by {', '.join(group.join_keys)}: "
            "every key would be new"
        )
    elif definition["source"]["timestamp"] != group.source.timestamp:
        why = (
            f"timed by {definition['source']['timestamp']!r}, and the group by {group.source.timestamp!r}: every "
            "event time would be new"
        )
    elif (group.source.kafka is None) != ("kafka" not in manifest.get("source", {})):
        why = (
            "of a landing folder, and the group now reads a Kafka topic"
            if group.source.kafka is not None
            else "of a Kafka topic, and the group now reads a landing folder"
        ) + ": its source position means nothing there"
    elif group.source.kafka is not None and manifest["source"]["kafka"]["topic"] != group.source.kafka.topic:
        why = (
            f"of topic {manifest['source']['kafka']['topic']!r}, and the group reads {group.source.kafka.topic!r}: "
            "its offsets mean nothing there"
        )
    if why is not None:
        raise ConfigError(
            f"--from-savepoint: {path} holds a state {why}, so it cannot "
            f"start the group; a replay (`features stream --group {group.name} --reset`) is the least it takes"
        )
    return manifest


def prepare(
    spark: SparkSession,
    repo: Repo,
    group: FeatureGroup,
    checkpoint: Path,
    source: StreamSource,
    path: str | None,
    buckets: int | None,
) -> Carried | None:
    """Start `checkpoint` from the savepoint at `path` (None: no savepoint asked for, and a checkpoint a restore
    began and did not finish is refused)."""
    if path is None:
        check_restored(checkpoint, group)
        return None
    return restore(spark, repo, group, checkpoint, source, path, buckets)


def restore(
    spark: SparkSession,
    repo: Repo,
    group: FeatureGroup,
    checkpoint: Path,
    source: StreamSource,
    path: str,
    buckets: int | None,
) -> Carried:
    """Make `checkpoint` (which must hold no state) a checkpoint that continues from the savepoint at `path`."""
    began = time.perf_counter()
    manifest = read_manifest(path, group)
    marker = checkpoint / RESTORING
    query = checkpoint / "query"
    # A marked checkpoint is a restore that did not finish: started again.
    if not marker.exists() and (saved_definition(checkpoint) is not None or last_commit(query)[0] is not None):
        raise ConfigError(
            f"--from-savepoint: {group.name}'s checkpoint {checkpoint} already holds stream state; a savepoint "
            "starts a new checkpoint: delete that folder (after taking a savepoint of it, if you want it), or "
            "pass another --checkpoint-dir"
        )
    partitions = cores(spark)
    labels = bucket_labels(buckets or int(manifest["buckets"]), partitions)
    # Under a marker that a start refuses and a restore starts again from.
    shutil.rmtree(checkpoint, ignore_errors=True)  # no state: at most what a failed start or restore left
    checkpoint.mkdir(parents=True)
    marker.write_text(str(path))
    after, nanoseconds = _seed(spark, group, checkpoint, source, labels, partitions)
    change = Change(Layout.from_json(manifest["layout"]), after)
    watermark = manifest["watermark_us"]
    files = source_uris(manifest["source"]["files"], source.path)
    set_position(query, files, watermark, _offsets(manifest))
    state = checkpoint / FOLDER / f"{after.id}-state"
    regroup_panes(spark, group, Path(path), labels, state)
    folder = checkpoint / FOLDER / after.id
    position = Position(int(manifest["batch"]), watermark, frozenset(files), _offsets(manifest))
    carried = build_added(spark, repo, group, source, change, manifest["definition"], position, labels, folder)
    upgrade = PendingUpgrade(
        change,
        str(folder) if carried.built else None,
        str(state),
        manifest["emitted_upto_us"],
        manifest["newest_us"],
    )
    save_state(checkpoint, group, labels, partitions, nanoseconds, upgrade)
    marker.unlink()
    restored = (str(path), int(manifest["batch"]), int(manifest["keys"]), int(manifest["buckets"]), len(labels))
    return replace(carried, seconds=time.perf_counter() - began, restored=restored)


def _seed(
    spark: SparkSession,
    group: FeatureGroup,
    checkpoint: Path,
    source: StreamSource,
    labels: list[int],
    partitions: int,
) -> tuple[Layout, bool]:
    """Run the group's stream for one micro-batch over an empty file: Spark writes the checkpoint of the very
    query `features stream` runs (its sources' logs, offsets, commit, and the operator's state store and schema),
    with a state in which no bucket has stepped. A Kafka source's query is seeded over the same empty file (a
    topic cannot be read for no records); `set_position` then makes its logs a Kafka source's. Returns what the
    query was made with: the layout of its state and whether it reads nanosecond files."""
    after = layout(group, len(labels))
    nanoseconds = stream_source.reads_nanoseconds(spark, group, source)
    if group.source.kafka is not None:
        group = replace(group, source=group.source.landing_folder())
    empty = checkpoint / "seed"
    if group.source.format == "json":
        empty.mkdir(parents=True)
        (empty / "seed.json").write_text("")
    else:
        spark.createDataFrame([], source.schema).coalesce(1).write.parquet(str(empty))
    seeded = replace(source, path=str(empty))
    _, _, out = stateful_query(
        spark,
        group,
        seeded,
        labels,
        layout=after.id,
        upgrade=None,
        nanoseconds=nanoseconds,
        nulls=True,
    )
    # The batch must run its plan for the state stores to commit: Spark's no-op sink runs it and keeps nothing.
    writer = out.writeStream.foreachBatch(_run_plan).trigger(availableNow=True)
    with query_settings(spark, partitions):
        query = writer.option("checkpointLocation", str(checkpoint / "query")).start()
    query.awaitTermination()
    shutil.rmtree(empty)
    return after, nanoseconds


def _run_plan(frame: DataFrame, batch_id: int) -> None:
    frame.write.format("noop").mode("overwrite").save()
