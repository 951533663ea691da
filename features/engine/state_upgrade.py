"""The Spark side of carrying a stream's state over a change (docs/streaming.md, "Changing a running group"): the
batch job that computes the pane rows of a changed definition's new features from the events the state holds (the
files or Kafka offsets of its committed micro-batches: features.engine.query_log.Position), the state read from
a checkpoint and regrouped into other buckets (a rescale, a savepoint), and the change each bucket applies to its
state the first time it steps under the new definition (PendingUpgrade; the columns carried: features.kernel.migrate).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from features import kernel
from features.engine.inputs import bucket_of, kernel_inputs
from features.engine.kafka import OffsetRange, read_kafka
from features.engine.query_log import Position
from features.engine.schema import CORRUPT, FILE, LANDED, MARK, schema_of, source_columns
from features.engine.source import META, cleaned_columns, read_source, reason_of, uri_spellings
from features.kernel.migrate import Change, Layout, carry
from features.kernel.state import is_pane_chunk
from features.spec import DType, FeatureGroup

if TYPE_CHECKING:
    from pyspark.sql import Observation, SparkSession
    from pyspark.sql.types import StructType

BUCKET, PART, BLOB = "fx_bucket", "fx_part", "fx_blob"
PART_ROWS = 500_000  # pane rows per stored blob of the built panes


@dataclass(frozen=True)
class Built:
    events: int  # events read
    since_us: int | None  # the earliest event time read (None: all)


def committed_file_events(spark: SparkSession, group: FeatureGroup, path: str, position: Position) -> DataFrame:
    """The good events of the files `position` holds in the source folder `path`, as the backfill reads them."""
    read = read_source(spark, group, path)
    marked = read.marked.where(F.col(read.timestamp).isNotNull())
    spellings = sorted({s for f in position.files for s in uri_spellings(f)})
    wanted = spark.createDataFrame([(s,) for s in spellings], "fx_file string")
    joined = marked.join(F.broadcast(wanted), marked[META]["file_path"] == wanted["fx_file"], "left")
    held = F.col("fx_file").isNotNull()
    if position.landed_before_ms is not None:
        held = held | (F.unix_millis(F.col(META)["file_modification_time"]) < position.landed_before_ms)
    return read.good_of(joined.where(held).drop("fx_file"))


@dataclass(frozen=True)
class Gap:
    """Records of a partition that the topic no longer holds (its retention deleted them): from `start` (the
    first offset the state holds) to `first` (the first still there; None: none of the stretch is), whose event
    time is `first_us` (None when unknown)."""

    partition: int
    start: int
    first: int | None
    first_us: int | None


def committed_kafka_events(
    spark: SparkSession, group: FeatureGroup, declared: StructType, offsets: OffsetRange
) -> tuple[DataFrame, Observation]:
    """The good events of `offsets` (a source of schema `declared`), decoded and checked as the stream does; the
    Observation gives, once they are read, each partition's first offset read and its event time (`gaps` reads
    it)."""
    from pyspark.sql import Observation

    events = read_kafka(spark, group, declared, offsets, keep=("partition", "offset"))
    ts = F.col(group.source.timestamp).cast("timestamp")
    observed = []
    for p in sorted(offsets.end):
        in_partition = F.when(F.col("partition") == p, F.col("offset"))
        observed += [
            F.min(in_partition).alias(f"first_{p}"),
            F.min_by(F.unix_micros(ts), in_partition).alias(f"us_{p}"),
        ]
    observation = Observation()
    events = events.observe(observation, *observed)
    marked = events.withColumn(MARK, reason_of(group, events, datetime.now(UTC)))
    columns = [c for c in events.columns if c not in (CORRUPT, LANDED, FILE, "partition", "offset")]
    cleaned = dict(zip(source_columns(events), cleaned_columns(events), strict=True))
    return marked.where(F.col(MARK).isNull()).select(*[cleaned[c] for c in columns]), observation


def gaps(offsets: OffsetRange, observation: Observation, since_us: int | None) -> list[Gap]:
    """The partitions of `offsets` whose first records a read of it (`committed_kafka_events`) did not find, where
    they may hold events stamped at or after `since_us` (None: any event counts): the first record still there is
    stamped after it, or its time is unknown."""
    seen = observation.get
    found = []
    for p, end in sorted(offsets.end.items()):
        start = offsets.start.get(p, 0)
        first, first_us = seen[f"first_{p}"], seen[f"us_{p}"]
        lost = end > start and (first is None or first > start)
        if lost and (since_us is None or first_us is None or first_us > since_us):
            found.append(Gap(p, start, first, first_us))
    return found


def build_panes(
    spark: SparkSession,
    group: FeatureGroup,
    good: DataFrame,
    labels: list[int],
    since_us: int | None,
    upto_us: int | None,
    folder: Path,
) -> Built:
    """The pane rows of every feature of `group` (keys as themselves, not codes), from the good events `good`
    stamped at or after `since_us`, per stream bucket, stored in `folder` as Parquet (bucket, part, blob):
    each blob a pane table as `features.kernel.state` serializes one. Panes that only Lifetime windows ending
    after `upto_us` (the watermark the state emitted up to) read are folded into each key's base row, as the
    stream keeps them."""
    if since_us is not None:
        good = good.where(F.col(group.source.timestamp).cast("timestamp") >= F.timestamp_micros(F.lit(since_us)))
    present = F.lit(True)
    for key in group.join_keys:
        present = present & F.col(key).isNotNull()
    types = schema_of(good.schema)
    plan = kernel.Plan.of(group, types)
    projected = good.where(present).select(bucket_of(group, labels).alias(BUCKET), *kernel_inputs(group, types, plan))
    counted = spark.sparkContext.accumulator(0)

    def compute(table: pa.Table) -> pa.Table:  # no hints: PySpark infers the UDF type from them
        counted.add(table.num_rows)
        panes = kernel.phase1(plan, kernel.events_frame(table.drop_columns([BUCKET])))
        if upto_us is not None and not all(c.bounded for c in plan.calcs):
            panes = kernel.prune(plan, panes, upto_us)
        return _packed(int(table[BUCKET][0].as_py()), panes)

    out = projected.groupBy(BUCKET).applyInArrow(compute, f"{BUCKET} bigint, {PART} int, {BLOB} binary")
    out.write.mode("overwrite").parquet(str(folder))
    return Built(int(counted.value), since_us)


def _packed(bucket: int, panes: pd.DataFrame) -> pa.Table:
    """A bucket's pane table as rows of (bucket, part, blob), PART_ROWS pane rows a blob."""
    blobs = [kernel.to_bytes(panes.iloc[i : i + PART_ROWS]) for i in range(0, max(len(panes), 1), PART_ROWS)]
    n = len(blobs)
    return pa.table(
        {
            BUCKET: pa.array([bucket] * n, pa.int64()),
            PART: pa.array(range(n), pa.int32()),
            BLOB: pa.array(blobs, pa.binary()),
        }
    )


@dataclass(frozen=True)
class PendingUpgrade:
    """A definition change the stream's buckets apply to their state as each first steps under it: the change,
    the folder of the built panes of its new columns (None when nothing is built: only dropped or renamed
    columns), and for a rescale or a restored savepoint the folder of the pane rows that replace every bucket's
    state (`state`, of the change's previous layout), which were emitted up to `emitted_upto_us` and had seen
    events up to `newest_us`. Both folders hold rows per bucket, keys as themselves."""

    change: Change
    folder: str | None
    state: str | None = None
    emitted_upto_us: int | None = None
    newest_us: int | None = None

    @property
    def replace_state(self) -> bool:
        return self.state is not None

    def built(self, bucket: int, keys: tuple[str, ...], columns: list[str], folder: str | None = None) -> pd.DataFrame:
        """The bucket's built pane rows (keys as themselves), or no rows; from `folder` instead when given."""
        folder = self.folder if folder is None else folder
        frames = []
        if folder is not None and Path(folder).exists():
            table = pq.read_table(folder, filters=[(BUCKET, "=", bucket)], columns=[PART, BLOB])
            for blob in table.sort_by(PART)[BLOB].to_pylist():
                frames.append(kernel.read_frame(blob))
        if frames:
            return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
        return pd.DataFrame({c: np.zeros(0, dtype=np.int64) for c in [*keys, kernel.PANE, *columns]}).astype(
            dict.fromkeys(keys, object)
        )

    def unmarked(self, has_state: bool) -> str:
        """The layout of a bucket's state that names none: written before this change (the previous layout); a
        bucket without state is on the current one, unless its state is replaced."""
        return self.change.before.id if has_state or self.replace_state else self.change.after.id

    def apply(
        self,
        coded: kernel.Plan,
        keys_of: tuple[str, ...],
        bucket: int,
        blobs: dict[int, bytes],
        keys: kernel.KeyDictionary,
        key_state: Any,
    ) -> tuple[pd.DataFrame, kernel.KeyDictionary, tuple[int | None, int | None, int] | None]:
        """A bucket's stored state (of the previous layout: `blobs` and `keys`; `key_state`, its stored key
        dictionary) brought to the current one (features.kernel.migrate), or first replaced by the rows of the
        keys a rescale or a savepoint put in it. Returns its pane table (keys as codes), its key dictionary, and
        after a replacement the watermark and newest event time it stands at."""

        def coded_rows(rows: pd.DataFrame) -> pd.DataFrame:
            codes, fresh = keys.encode(rows[list(keys_of)])
            if len(fresh):
                key_state.updateValue((len(keys) - len(fresh),), (kernel.to_bytes(fresh),))
            return rows.drop(columns=list(keys_of)).assign(**{kernel.KEY: codes})

        old = None
        if self.state is not None:
            key_state.clear()
            keys = kernel.KeyDictionary(keys_of)
            before = [c for c, _ in self.change.before.columns]
            old = coded_rows(self.built(bucket, keys_of, before, self.state))
        elif blobs:
            frames = [kernel.read_frame(blob) for blob in blobs.values()]
            old = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
        change = self.change
        if old is not None and not change.built and not change.dropped and change.kept == _same(change.after):
            table = old[kernel.pane_columns(coded)]  # nothing to carry: only the keys moved
        else:
            built = coded_rows(self.built(bucket, keys_of, [c for c, _ in change.after.columns]))
            table = carry(coded, change, old, built)
        moved = (self.emitted_upto_us, self.newest_us, 0) if self.replace_state else None
        return table, keys, moved

    def to_json(self) -> dict[str, Any]:
        return {
            "before": self.change.before.to_json(),
            "after": self.change.after.to_json(),
            "folder": self.folder,
            "state": self.state,
            "emitted_upto_us": self.emitted_upto_us,
            "newest_us": self.newest_us,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PendingUpgrade:
        before, after = Layout.from_json(data["before"]), Layout.from_json(data["after"])
        folder, state = data["folder"], data.get("state")
        if data.get("replace_state") and "state" not in data:  # saved before savepoints: the folder was the state
            folder, state = None, folder
        return cls(Change(before, after), folder, state, data.get("emitted_upto_us"), data.get("newest_us"))


def _same(layout: Layout) -> dict[str, str]:
    return {column: column for column, _ in layout.columns}


@dataclass(frozen=True)
class Rebucketed:
    keys: int  # keys whose state moved
    emitted_upto_us: int | None  # the watermark the buckets had emitted up to (the least of them)
    newest_us: int | None  # the newest event time they had seen


def rebucket_state(
    spark: SparkSession,
    query_checkpoint: Path,
    group: FeatureGroup,
    key_types: dict[str, DType],
    labels: list[int],
    folder: Path,
    batch: int | None = None,
) -> Rebucketed:
    """Every key's pane rows in a stream's state (read with Spark's state data source, after committed batch
    `batch`, by default the last), regrouped by the bucket that `labels` give the key, stored in `folder` as the
    built panes are (keys as themselves). Nothing of the source is read."""
    from features.engine.inputs import ddl

    spark.streams.active  # noqa: B018  # the state reader needs the session's state store coordinator, made with this
    path = str(query_checkpoint)
    read = spark.read.format("statestore")
    if batch is not None:
        read = read.option("batchId", batch)
    chunks = _map_state(read, path, "chunks", "chunk", "fx_chunk")
    segments = _map_state(read, path, "keys", "first_code", "fx_first")
    meta = (
        read.option("stateVarName", "meta")
        .load(path)
        .agg(F.min("value.emitted_upto").alias("upto"), F.max("value.newest").alias("newest"))
        .first()
    )
    dictionary = segments.groupBy(BUCKET).applyInPandas(
        _decoded_keys, f"{BUCKET} bigint, fx_code bigint, {ddl(key_types)}"
    )
    mapped = dictionary.withColumn("fx_new", bucket_of(group, labels))
    packed = mapped.groupBy(BUCKET).applyInPandas(_packed_keys, f"{BUCKET} bigint, {BLOB} binary")
    out = (
        chunks.groupBy(BUCKET)
        .cogroup(packed.groupBy(BUCKET))
        .applyInPandas(_regrouped, f"{BUCKET} bigint, {PART} int, {BLOB} binary")
    )
    out.write.mode("overwrite").parquet(str(folder))
    return Rebucketed(dictionary.count(), meta["upto"] if meta else None, meta["newest"] if meta else None)


def _map_state(read: Any, path: str, name: str, key: str, alias: str) -> DataFrame:
    """One map state variable of the checkpoint: each bucket's entries as (bucket, `alias`, blob)."""
    entries = read.option("stateVarName", name).load(path)
    return entries.select(
        F.col("key.fx_bucket").alias(BUCKET),
        F.col(f"user_map_key.{key}").alias(alias),
        F.col("user_map_value.blob").alias(BLOB),
    )


def _decoded_keys(frame: pd.DataFrame) -> pd.DataFrame:
    """One old bucket's key dictionary as rows: its bucket, each key's code, the key."""
    parts = [kernel.read_frame(b) for _, b in sorted(zip(frame["fx_first"], frame[BLOB], strict=True))]
    keys = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    out = keys.copy()
    out.insert(0, "fx_code", np.arange(len(keys), dtype=np.int64))
    out.insert(0, BUCKET, np.full(len(keys), int(frame[BUCKET].iloc[0]), dtype=np.int64))
    return out


def _packed_keys(frame: pd.DataFrame) -> pd.DataFrame:
    """One old bucket's key dictionary with each key's new bucket, as one blob."""
    bucket = int(frame[BUCKET].iloc[0])
    table = frame.drop(columns=[BUCKET]).sort_values("fx_code", ignore_index=True)
    return pd.DataFrame({BUCKET: [bucket], BLOB: [kernel.to_bytes(table)]})


def _regrouped(chunks: pd.DataFrame, packed: pd.DataFrame) -> pd.DataFrame:
    """One old bucket's pane rows, keys decoded, split by the keys' new buckets."""
    if chunks.empty or packed.empty:
        return pd.DataFrame({BUCKET: np.zeros(0, np.int64), PART: np.zeros(0, np.int32), BLOB: np.zeros(0, object)})
    old = int(chunks[BUCKET].iloc[0])
    stored = zip(chunks["fx_chunk"], chunks[BLOB], strict=True)
    frames = [kernel.read_frame(b) for c, b in stored if is_pane_chunk(c)]
    table = pd.concat(frames, ignore_index=True)
    keys = kernel.read_frame(packed[BLOB].iloc[0])
    codes = table.pop(kernel.KEY).to_numpy(dtype=np.int64)
    key_columns = [c for c in keys.columns if c not in ("fx_code", "fx_new")]
    for i, column in enumerate(key_columns):
        table.insert(i, column, keys[column].to_numpy()[codes])
    new = keys["fx_new"].to_numpy(dtype=np.int64)[codes]
    rows = {BUCKET: [], PART: [], BLOB: []}
    for bucket in np.unique(new):
        part = table[new == bucket].reset_index(drop=True)
        for i in range(0, len(part), PART_ROWS):
            rows[BUCKET].append(int(bucket))
            rows[PART].append(old * 1000 + i // PART_ROWS)
            rows[BLOB].append(kernel.to_bytes(part.iloc[i : i + PART_ROWS]))
    return pd.DataFrame(rows)
