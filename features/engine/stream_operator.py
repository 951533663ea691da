"""The stream's stateful operator: a group's events projected to what the features read, packed per hash
bucket, and both phases run per bucket in `transformWithStateInPandas` (PaneProcessor), which outputs the
change points, eager values, late events, bad records and each bucket's stats (features.engine.stream_rows).

Layout of the query (features.engine.stream_query builds it; features.pipelines.stream.sink takes its output):
    source (file landing folder or Kafka: features.engine.stream_source) -> bad records marked with their reason
    -> projection to what the features read
    -> mapInArrow: each bucket's events of an Arrow batch packed into one row (the records of a file that does not
       conform to the source's schema left out) -> event-time watermark on the newest good event time packed
    -> groupBy(hash bucket of the key) -> transformWithStateInPandas(PaneProcessor)  [RocksDB state]
    -> foreachBatch(sink): validate, then the offline table's commit + online store; late events and bad records
       aside

Why hash buckets: a Python call per entity key and batch costs about half a millisecond; one call per bucket
handles all its keys with vectorized pandas (features.kernel). Why packed: PySpark hands
transformWithStateInPandas its input row by row in Python (itertuples, then a DataFrame of the tuples),
which cost more than the processor itself; a bucket's events arrive instead as a few Arrow IPC blobs,
read back column by column. Each bucket keeps its pane table in
a MapState split into time chunks, so a batch rewrites only the chunks it touched. Every bucket is told each
batch's newest event time (NEWEST), also one whose keys had no event, and emits in that batch up to the watermark
it sets, expiry rows of keys without new events included; Spark would apply that watermark a batch later. (An
event-time timer per bucket is still set: it drops the state of a bucket a rescale left unused.)

Why the watermark's column is dropped once set: Spark drops rows behind the watermark before a stateful operator
when the operator's input carries the watermark column. Here the processor decides lateness itself
(an event is late when its change points were already emitted) and hands late events to the sink, which
writes them to the late-events folder instead of losing them silently.
"""

from __future__ import annotations

import os
import secrets
import shutil
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import BinaryType, LongType, StructField, StructType

from features import kernel as pt
from features.engine.files import Conformity
from features.engine.inputs import bucket_of, ddl, kernel_inputs
from features.engine.schema import CHECKED_FILE, CORRUPT, FILE, LANDED, RAW_RECORD, SOURCE_FILE, schema_of
from features.engine.schema import source_columns as all_source_columns
from features.engine.source import cleaned_columns, reason_of
from features.engine.state_upgrade import PendingUpgrade
from features.engine.stream_rows import BAD, EAGER, KIND, LATE, LATEST, REASON, RECORD, REPLACED, OutputFrames
from features.errors import ConfigError
from features.kernel.state import LAYOUT_CHUNK, VERSIONS_CHUNK, Versions
from features.spec import WINDOW_END, DType, FeatureGroup

BUCKET = "fx_bucket"
PACK = "fx_pack"  # the processor's input: one bucket's events of one Arrow batch, as Arrow IPC stream bytes
# On the processor's input: the newest good event time a task of the batch read (µs), sent to every bucket so that
# each one knows the stream-wide event time of the batch (eager values are taken there, not at a bucket's own).
NEWEST = "fx_newest"
WATERMARKED = "fx_wm"  # NEWEST as a timestamp, the event time of the stream's watermark
RESIDENT_BUCKETS = 4  # buckets whose state a Python worker keeps between batches (_Resident)
COMPACT_SLACK = 1024  # codes of departed keys a bucket's key dictionary may hold beyond twice its live keys
STATE_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def configure(spark: SparkSession) -> None:
    """RocksDB state with changelog checkpointing: transformWithState needs RocksDB, and the changelog makes
    a checkpoint write only what a batch changed. A batch's offline rows span a few dates: writers open for
    each at once spare the write a sort by date."""
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", STATE_PROVIDER)
    spark.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
    spark.conf.set("spark.sql.maxConcurrentOutputFileWriters", "8")


# ---------------------------------------------------------------------------------------------------------
# Plan: what the processor reads and writes


@dataclass(frozen=True)
class Projection:
    plan: pt.Plan
    columns: list[Column]  # the processor's input, besides the bucket
    output_schema: str
    feature_types: dict[str, DType]
    record_schema: str  # a bad record's columns (DDL), as the backfill's quarantine files have them


def project(
    group: FeatureGroup, events: DataFrame, labels: list[int], conformity: Conformity | None = None
) -> tuple[DataFrame, Projection]:
    """The processor's input: bucket (`labels[hash of the keys % len(labels)]`), keys, `fx_ts` (µs), one
    truth column per `where`, the cast value columns, and for bad records their reason and JSON, packed per bucket
    (`_pack`, which leaves out the records of files `conformity` refuses); with the watermark on the newest source
    timestamp of the good records packed."""
    types = schema_of(events.schema)
    output = group.output_types(types)
    plan = pt.Plan.of(group, types)
    source = group.source
    reason = reason_of(group, events, F.current_timestamp())
    source_columns = [c for c in events.columns if c not in (CORRUPT, LANDED, FILE, CHECKED_FILE)]
    # A bad record as the backfill sets it aside (features.engine.source: reason, source_file, raw_record, the
    # source's columns as read), carried as JSON to the sink, which writes it with `record_schema`.
    raw = F.to_json(
        F.struct(
            F.col(FILE).alias(SOURCE_FILE),
            (F.col(CORRUPT) if CORRUPT in events.columns else F.lit(None).cast("string")).alias(RAW_RECORD),
            *[F.col(c) for c in source_columns],
        )
    )
    # NaN is null (docs/semantics.md, Nulls), as in the batch read; the raw record keeps what arrived.
    cleaned = dict(zip(all_source_columns(events), cleaned_columns(events), strict=True))
    checked = [F.col(CHECKED_FILE)] if conformity is not None else []
    marked = events.select(
        *[cleaned[c] for c in source_columns],
        F.col(LANDED),
        reason.alias(REASON),
        F.when(reason.isNotNull(), raw).alias(RECORD),
        *checked,
    )
    keys = list(group.join_keys)
    cols = kernel_inputs(group, types, plan)
    cols += [F.col(REASON), F.col(RECORD), F.col(LANDED)]
    bucket = bucket_of(group, labels).alias(BUCKET)
    packed = marked.select(bucket, *cols, *checked).mapInArrow(
        partial(_pack, labels, conformity), f"{BUCKET} bigint, {PACK} binary, {NEWEST} bigint"
    )
    # The watermark after the pack, which alone knows which files conform: a refused file's events must not move
    # it. Bad records never do either (a timestamp years ahead would make everything late).
    newest = F.timestamp_micros(F.col(NEWEST)).alias(WATERMARKED)
    projected = packed.select("*", newest).withWatermark(WATERMARKED, f"{source.watermark_s} seconds")
    projected = projected.drop(WATERMARKED)
    key_types = ddl({k: output[k] for k in keys})
    feature_types = {f.name: output[f.name] for f in group.features}
    features = ddl(feature_types)
    schema = (
        f"{KIND} string, {key_types}, {WINDOW_END} bigint, {features}, {LATEST} boolean, {REPLACED} boolean, "
        f"{REASON} string, {RECORD} string"
    )
    source_fields = [f for f in events.schema.fields if f.name in source_columns]
    records = ", ".join(
        [f"`{SOURCE_FILE}` string", f"`{RAW_RECORD}` string"]
        + [f"`{f.name}` {f.dataType.simpleString()}" for f in source_fields]
    )
    return projected, Projection(plan, cols, schema, feature_types, records)


# ---------------------------------------------------------------------------------------------------------
# Processor


class PaneProcessor(StatefulProcessor):
    """One hash bucket of keys: its key dictionary, its pane table (keyed by key code) in chunks, the watermark
    it emitted up to, one timer."""

    def __init__(
        self,
        plan: pt.Plan,
        group_name: str,
        output: dict[str, Any],
        *,
        delay_us: int,
        eager: bool = True,
        layout: str = "",
        upgrade: PendingUpgrade | None = None,
        labels: tuple[int, ...] = (),
    ) -> None:
        self.plan = plan
        self.delay_us = delay_us  # the source's watermark delay
        self.layout = layout  # the current definition's Layout.id
        self.upgrade = upgrade  # a definition change some buckets may not have applied yet
        self.labels = frozenset(labels)  # the buckets in use (a rescale leaves state under others: dropped)
        self.eager = eager
        self.coded = replace(plan, keys=(pt.KEY,))  # what the pane table functions see
        self.chunk_us = pt.chunk_length(plan)  # the pane time each stored chunk of the table holds
        self.group_name = group_name
        self.frames = OutputFrames(output)  # `output`: column -> Arrow type, in the order of the output schema

    def init(self, handle: StatefulProcessorHandle) -> None:
        # Types, not DDL strings: PySpark sends each string to the JVM to be parsed (a map's twice), a call to the
        # state server each, at every bucket's step. The same schemas: a DDL field is nullable.
        self.handle = handle
        self.meta = handle.getValueState("meta", _longs("emitted_upto", "newest", "token"))
        self.chunks = handle.getMapState("chunks", _longs("chunk"), _BLOB)
        self.keys = handle.getMapState("keys", _longs("first_code"), _BLOB)

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:  # noqa: N802, N803
        table, stream_newest = _unpack(rows)
        if table is None:  # no event of this bucket: only the batch's event time, to bring its eager values up to it
            yield from self._advance(key[0], None, timerValues, 0, None, stream_newest)
            return
        n, landed = len(table), pc.min(table[LANDED]).as_py()
        if table[REASON].null_count < n:
            bad = pc.is_valid(table[REASON])
            side = table.filter(bad).select([REASON, RECORD]).to_pandas()
            yield self.frames.side(BAD, side[REASON].to_numpy(), side[RECORD].to_numpy())
            table = table.filter(pc.invert(bad))
        events = pt.events_frame(table.drop_columns([REASON, RECORD, LANDED]))
        yield from self._advance(key[0], events, timerValues, n, landed, stream_newest)

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:  # noqa: N802, N803
        if self.labels and key[0] not in self.labels:  # a bucket a rescale emptied: its keys live elsewhere now
            self.meta.clear()
            self.chunks.clear()
            self.keys.clear()
            return
        upto = timerValues.getCurrentWatermarkInMs() * 1000
        meta = self.meta.get()  # None when there is none (one call to the state server, not two)
        if meta is not None and meta[0] is not None and meta[0] >= upto:
            return  # this batch's input already brought the bucket up to the watermark
        yield from self._advance(key[0], None, timerValues, 0, None)

    def _advance(
        self,
        bucket: int,
        events: pd.DataFrame | None,
        timer_values: Any,
        n: int,
        landed: int | None,
        stream_newest: int | None = None,
    ) -> Iterator[pd.DataFrame]:
        """One micro-batch of a bucket: its state loaded, stepped on with the events, stored."""
        state = self._load(bucket)
        stepped = self._step(state, events, timer_values.getCurrentWatermarkInMs() * 1000, stream_newest)
        yield from stepped.output
        yield self._store(bucket, state, stepped, n, landed)

    def _load(self, bucket: int) -> _Loaded:
        """The bucket's state: the worker's copy when it is the one the store holds, else read from the store
        (and carried over a definition change, or refiled from chunks of another length)."""
        meta = self.meta.get()
        resident = _RESIDENT.pop((self.group_name, bucket), None)  # taken: put back only once the step is stored
        if resident is not None and meta is not None and resident.layout == self.layout:
            if resident.token == meta[2]:
                return _Loaded(resident.held, resident.keys, resident.sizes, meta, self.layout, resident.versions)
            caught_up = self._caught_up(resident, meta)
            if caught_up is not None:
                return caught_up
        blobs = self._stored_chunks()
        marker = blobs.pop(LAYOUT_CHUNK, None)
        versions = blobs.pop(VERSIONS_CHUNK, None)
        known = Versions.from_bytes(versions) if versions is not None else Versions("", 0, {})
        layout = self.layout
        if marker is not None or self.upgrade is not None:
            layout = marker.decode() if marker is not None else self.upgrade.unmarked(meta is not None)  # type: ignore[union-attr]
        stored, keys = {c: len(b) for c, b in blobs.items()}, self._dictionary()
        misfiled: set[int] = set()
        if layout == self.layout:
            tables = [pt.from_bytes(self.coded, blob) for blob in blobs.values()]
            misfiled = self._misfiled(blobs, tables)
        else:
            if self.upgrade is None or layout != self.upgrade.change.before.id:
                raise ConfigError(
                    f"{self.group_name}: bucket {bucket}'s saved state was built for a definition this stream "
                    "no longer knows how to carry over (two changes applied before the first had reached every "
                    "bucket). Start over with `features stream --reset`"
                )
            table, keys, moved = self.upgrade.apply(self.coded, self.plan.keys, bucket, blobs, keys, self.keys)
            tables, meta = [table], moved or meta
        held = pt.Held.of(self.coded, self.chunk_us, tables)
        known = Versions(layout, known.keys, {c: known.chunks.get(c, 0) for c in stored})
        # every stored state names its layout, from its first step on
        return _Loaded(held, keys, stored, meta, layout, known, marker != self.layout.encode(), misfiled)

    def _stored_chunks(self) -> dict[int, bytes]:
        """Every chunk of the bucket, read one at a time: Spark's state server answers a map's iterator with as many
        entries as fit its record count (not its bytes) in one message, built and copied in the driver's heap, and
        a bucket's whole state in one message ran a 4 GB driver out of memory (500k events a batch, 10k keys)."""
        names = [int(k[0]) for k in self.chunks.keys()]  # noqa: SIM118 (Spark's MapState, not a dict)
        return {name: self.chunks.getValue((name,))[0] for name in names}

    def _caught_up(self, resident: _Resident, meta: tuple[int | None, int | None, int]) -> _Loaded | None:
        """The worker's copy of a bucket that another worker (or a step Spark discarded) moved on since: the chunks
        and key dictionary whose versions differ from the store's read again, the rest kept. None when the store
        keeps no versions of this layout (a state written before versions were kept, or being carried over)."""
        entry = self.chunks.getValue((VERSIONS_CHUNK,))
        if entry is None:
            return None
        now = Versions.from_bytes(entry[0])
        if now.layout != self.layout:
            return None
        had = resident.versions.chunks
        gone = {c: None for c in resident.held.chunks if c not in now.chunks}
        blobs = {c: self.chunks.getValue((c,))[0] for c, v in now.chunks.items() if had.get(c) != v}
        resident.held.refreshed({**gone, **{c: pt.from_bytes(self.coded, b) for c, b in blobs.items()}})
        sizes = {c: len(blobs[c]) if c in blobs else resident.sizes[c] for c in now.chunks}
        keys = resident.keys if now.keys == resident.versions.keys else self._dictionary()
        return _Loaded(resident.held, keys, sizes, meta, self.layout, now)

    def _step(self, state: _Loaded, events: pd.DataFrame | None, upto: int, stream_newest: int | None) -> _Stepped:
        """The events (None: none, only the batch's event time) merged into the state, and what that emits: the
        change points up to the watermark, eager values, late events."""
        plan, keys, meta = self.coded, state.keys, state.meta
        after = None if meta is None else meta[0]
        new_keys = False
        if events is None:
            coded = pd.DataFrame({pt.KEY: np.zeros(0, np.int64), pt.TS: np.zeros(0, np.int64)})
        else:
            codes, fresh = keys.encode(events)
            coded = events.drop(columns=list(self.plan.keys)).assign(**{pt.KEY: codes})
            if len(fresh):
                self.keys.updateValue((len(keys) - len(fresh),), (pt.to_bytes(fresh),))
                new_keys = True
        if after is not None and upto <= after:
            upto = after  # the watermark never moves back; nothing new to emit
        ts = coded[pt.TS].to_numpy(dtype=np.int64)
        # The newest event time of the stream (every bucket's, see NEWEST) before and after this batch.
        seen = None if meta is None else meta[1]
        times = [t for t in (seen, stream_newest, int(ts.max()) if len(ts) else None) if t is not None]
        newest = max(times) if times else None
        if newest is not None:
            # The watermark Spark sets for the next batch from this one's events (ms, as Spark counts): every
            # bucket learns the batch's newest event time (NEWEST), so each emits up to it now, a batch sooner,
            # and no batch without events has to follow to emit (stream_query turns those off).
            upto = max(upto, (newest // 1000 * 1000) - self.delay_us)
        # Eager: values at the newest window end that has closed in event time (every event before it counts, as
        # far as received), when it is ahead of what the change points reach, for the touched keys and for every
        # key whose value changed since the previous eager end (its pane closed, or a pane left a window).
        eager_at = eager_after = None
        if self.eager and newest is not None:
            latest = plan.closed_end(newest)
            previous = upto if seen is None else max(upto, plan.closed_end(seen))
            if latest > upto and (len(ts) or previous < latest):
                eager_at, eager_after = latest, previous
        step = pt.advance(state.held, coded, after, upto, self.chunk_us, eager_at, eager_after)
        output = []  # decoded before a compaction renumbers the keys
        if len(step.rows):
            eager_keys = None if step.eager is None else step.eager[pt.KEY].to_numpy(dtype=np.int64)
            output.append(self.frames.rows(step.rows, keys, superseded=eager_keys))
        if step.eager is not None and len(step.eager):
            output.append(self.frames.rows(step.eager, keys, EAGER))
        if len(step.late):
            decoded = keys.decode(step.late[pt.KEY].to_numpy())
            late = pd.DataFrame({**{k: v.to_pandas() for k, v in decoded.items()}, pt.TS: step.late[pt.TS].to_numpy()})
            record = late.to_json(orient="records", lines=True).splitlines()
            output.append(
                self.frames.side(LATE, np.full(len(late), "late", dtype=object), np.array(record, dtype=object))
            )
        return _Stepped(step, upto, newest, output, new_keys)

    def _store(self, bucket: int, state: _Loaded, stepped: _Stepped, n: int, landed: int | None) -> pd.DataFrame:
        """Write what the step changed (the chunks whose rows changed, all of them after a definition change or
        a compaction of the keys), keep the state in the worker, set the timer; the bucket's stat row."""
        held, stored = state.held, state.stored
        touched = state.misfiled | set(stepped.step.changed)
        if state.layout != self.layout:  # carried over a definition change: every chunk is rewritten
            touched.update(stored)
        if state.mark:
            self.chunks.updateValue((LAYOUT_CHUNK,), (self.layout.encode(),))
        compacted = self._compact(held, state.keys, stored, touched)
        token = secrets.randbits(63)
        written = {c for c in held.chunks if c not in stored or c in touched}
        sizes = self._write_chunks(held, stored, written)
        renamed = stepped.new_keys or compacted or state.layout != self.layout
        versions = Versions(
            self.layout,
            token if renamed else state.versions.keys,
            {c: token if c in written else state.versions.chunks.get(c, 0) for c in held.chunks},
        )
        self.chunks.updateValue((VERSIONS_CHUNK,), (versions.to_bytes(),))
        self.meta.update((stepped.upto, stepped.newest, token))
        _keep_resident((self.group_name, bucket), _Resident(token, self.layout, held, sizes, state.keys, versions))
        if stepped.step.next_change is not None:
            self.handle.registerTimer(stepped.step.next_change // 1000)
        return self.frames.stat(bucket, held.rows, sum(sizes.values()), stepped.upto, n, landed)

    def _misfiled(self, blobs: dict[int, bytes], tables: list[pd.DataFrame]) -> set[int]:
        """The stored chunks holding panes of other chunks: written with another chunk length (by an earlier
        version of features, one hour each, or for an earlier definition). Rewritten at this step's store, each
        with its own panes."""
        return {
            chunk
            for chunk, table in zip(blobs, tables, strict=True)
            if len(table) and (pt.chunk_of(table, self.chunk_us) != chunk).any()
        }

    def _dictionary(self) -> pt.KeyDictionary:
        segments = sorted((int(k[0]), v[0]) for k, v in self.keys.iterator())
        frames = [pt.read_frame(blob) for _, blob in segments]
        frame = pd.concat(frames, ignore_index=True) if len(frames) > 1 else (frames[0] if frames else None)
        return pt.KeyDictionary(self.plan.keys, frame)

    def _compact(self, held: pt.Held, keys: pt.KeyDictionary, stored: dict[int, int], touched: set[int]) -> bool:
        """Drop the codes of keys no pane holds any more once they make up most of the dictionary (keys come
        and go): renumber the rest, and rewrite the dictionary and every chunk. Whether it did."""
        if len(keys) <= 2 * held.most_keys() + COMPACT_SLACK:  # no chunk-by-chunk count needed
            return False
        live = held.key_codes()
        if len(keys) <= 2 * len(live) + COMPACT_SLACK:
            return False
        held.renumbered(keys.compact(live))
        for (first,), _ in list(self.keys.iterator()):
            self.keys.removeKey((first,))
        if len(keys):
            self.keys.updateValue((0,), (pt.to_bytes(keys.frame),))
        touched.update(stored)
        return True

    def _write_chunks(self, held: pt.Held, stored: dict[int, int], written: set[int]) -> dict[int, int]:
        """Write the chunks `written` (new, or their rows changed); remove the ones pruned. `stored`: the stored
        chunks' sizes; returns them after the write."""
        sizes = {}
        for chunk, s in held.chunks.items():
            if chunk in written:
                blob = pt.to_bytes(s.table)
                self.chunks.updateValue((chunk,), (blob,))
                sizes[chunk] = len(blob)
            else:
                sizes[chunk] = stored[chunk]
        for chunk in stored:
            if chunk not in held.chunks:
                self.chunks.removeKey((chunk,))
        return sizes

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class _Resident:
    """A bucket's state as its last step left it, kept in the Python worker that ran the step: the next batch
    of the bucket that lands on this worker (Spark reuses its Python workers) skips reading and decoding the
    chunks and the key dictionary, and reads the summaries the steps before merged. `token` is the one the step
    saved in the bucket's meta state: a batch whose state store holds another (a failed or replayed batch, a step
    on another worker) reads the store."""

    token: int
    layout: str  # the definition's Layout.id the table has
    held: pt.Held
    sizes: dict[int, int]  # serialized bytes of each stored chunk
    keys: pt.KeyDictionary
    versions: Versions  # the step that wrote each chunk and the key dictionary, as stored with the chunks

    @property
    def table(self) -> pd.DataFrame:
        """Every pane row held (for a look at the state; a step reads the chunks)."""
        return self.held.frame()


@dataclass(frozen=True)
class _Loaded:
    """A bucket's state at the start of a step (`PaneProcessor._load`)."""

    held: pt.Held
    keys: pt.KeyDictionary
    stored: dict[int, int]  # the stored chunks' serialized sizes
    meta: tuple[int | None, int | None, int] | None  # (emitted up to, newest event time, token) as stored
    layout: str  # the definition the stored state was built for
    versions: Versions  # as stored (layout: this definition's)
    mark: bool = False  # the stored state does not name this definition yet
    misfiled: set[int] = field(default_factory=set)  # stored chunks holding other chunks' panes


@dataclass(frozen=True)
class _Stepped:
    """What a step did (`PaneProcessor._step`): the kernel's step, the watermark it emitted up to, the newest event
    time seen, and its output rows."""

    step: pt.Step
    upto: int
    newest: int | None
    output: list[pd.DataFrame]
    new_keys: bool  # codes were added to the key dictionary


_RESIDENT: OrderedDict[tuple[str, int], _Resident] = OrderedDict()  # (group, bucket), least recently stored first


_BLOB = StructType([StructField("blob", BinaryType())])


def _longs(*names: str) -> StructType:
    return StructType([StructField(name, LongType()) for name in names])


def _keep_resident(bucket: tuple[str, int], state: _Resident) -> None:
    _RESIDENT[bucket] = state
    while len(_RESIDENT) > RESIDENT_BUCKETS:
        _RESIDENT.popitem(last=False)


def _pack(every_label: list[int], conformity: Conformity | None, batches: Iterator[Any]) -> Iterator[Any]:
    """mapInArrow: each Arrow batch of projected events (bucket first; with `conformity`, the file to check last)
    as one row per bucket, its events as Arrow IPC bytes, without the records of files `conformity` refuses; then
    one row for every bucket, events or not, with the newest good event time the task read (NEWEST), so that a
    bucket whose keys had no event still learns how far the stream's event time got."""
    newest = None
    for batch in batches:
        if conformity is not None:
            kept = conformity.kept(batch.column(batch.num_columns - 1))
            batch = batch.select(range(batch.num_columns - 1))
            if kept is not None:
                batch = batch.filter(kept)
        if batch.num_rows == 0:
            continue
        good = pc.filter(batch.column(pt.TS), pc.is_null(batch.column(REASON)))
        if len(good):
            top = pc.max(good).as_py()
            newest = top if newest is None else max(newest, top)
        buckets = batch.column(0).to_numpy()
        order = np.argsort(buckets, kind="stable")
        events = batch.select(range(1, batch.num_columns)).take(pa.array(order))
        labels, starts = np.unique(buckets[order], return_index=True)
        ends = np.r_[starts[1:], len(order)]
        blobs = [_ipc(events.slice(s, e - s)) for s, e in zip(starts.tolist(), ends.tolist(), strict=True)]
        yield _packed(labels, pa.array(blobs, pa.binary()), pa.nulls(len(labels), pa.int64()))
    if newest is not None:
        n = len(every_label)
        yield _packed(every_label, pa.nulls(n, pa.binary()), pa.array([newest] * n, pa.int64()))


def _packed(labels: Any, blobs: pa.Array, newest: pa.Array) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array(labels, pa.int64()), blobs, newest], [BUCKET, PACK, NEWEST])


def _ipc(batch: Any) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _unpack(frames: Iterator[pd.DataFrame]) -> tuple[Any, int | None]:
    """The events of one bucket's packed rows as one Arrow table (None when there are none), and the newest
    event time of the batch's tasks (None when no task said)."""
    tables, newest = [], None
    for frame in frames:
        tables += [pa.ipc.open_stream(blob).read_all() for blob in frame[PACK].dropna().tolist()]
        if NEWEST in frame.columns and frame[NEWEST].notna().any():
            top = int(frame[NEWEST].max())
            newest = top if newest is None else max(newest, top)
    return (pa.concat_tables(tables) if tables else None), newest


# ---------------------------------------------------------------------------------------------------------
# Sink helpers (run on the driver, once per micro-batch)


def write_json_records(frame: DataFrame, folder: Path, schema: str | None) -> None:
    """Late events or bad records of one batch into `folder` (replaced whole on a replay)."""
    staging = _staging(folder)
    if schema is not None:
        frame = frame.select(F.from_json(F.col(RECORD), schema).alias("r")).select("r.*")
    frame.coalesce(1).write.parquet(str(staging))
    _replace_folder(staging, folder)


def write_table_records(table: pa.Table, folder: Path) -> None:
    """A few records written from the driver, as `write_json_records` writes them (one file, replaced whole)."""
    import pyarrow.parquet as pq

    staging = _staging(folder)
    staging.mkdir(parents=True)
    pq.write_table(table, staging / "part-00000.parquet")
    _replace_folder(staging, folder)


def _staging(folder: Path) -> Path:
    """A hidden folder beside `folder` to write in before it replaces it (readers skip hidden names)."""
    return folder.parent / f".{folder.name}-{uuid.uuid4().hex[:8]}"


def _replace_folder(staging: Path, folder: Path) -> None:
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(staging, folder)


def late_schema(group: FeatureGroup, key_types: dict[str, DType]) -> str:
    keys = ddl({k: key_types[k] for k in group.join_keys})
    return f"{keys}, `{pt.TS}` bigint"
