"""The Spark batch engine: events -> change-point series, in two phases (docs/internals.md, Two phases).

Spark reads the range's events, projects what the features read (features.engine.inputs) and shuffles them
once, by a hash bucket of the key. Each bucket then goes to one kernel call (features.kernel, through
`applyInArrow`): phase 1 reduces its events to one row of partials per (key, pane), phase 2 computes every
feature of the group at every window end where some value may change, in one pass over the sorted panes. The
stream runs the very same kernel on its state, so the two engines cannot drift apart; no window is ever
expanded into its panes (Spark's `window()`), and no Spark window function or second shuffle is needed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F

from features import kernel
from features.engine.inputs import bucket_labels, bucket_of, ddl, kernel_inputs
from features.engine.schema import schema_of
from features.engine.source import observed_count
from features.kernel.panes import MICROS, lookback_us
from features.spec import WINDOW_END, DType, FeatureGroup
from features.stores.offline import LATEST

BUCKET = "fx_bucket"
END_US = "fx_end"  # the window end in µs, as the kernel returns it

ARROW_TYPES = {
    DType.INT64: pa.int64(),
    DType.FLOAT64: pa.float64(),
    DType.STRING: pa.string(),
    DType.BOOL: pa.bool_(),
    DType.INT64_LIST: pa.list_(pa.int64()),
    DType.FLOAT64_LIST: pa.list_(pa.float64()),
    DType.STRING_LIST: pa.list_(pa.string()),
    DType.BOOL_LIST: pa.list_(pa.bool_()),
    DType.COUNT_MAP: pa.map_(pa.string(), pa.int64()),
    DType.TIMESTAMP: pa.timestamp("us", tz="UTC"),
}


def read_lower_bound(group: FeatureGroup, start_us: int) -> int | None:
    """The earliest event time a range starting at `start_us` needs: one longest window, plus one pane
    whose exit falls exactly on `start`. None when a Lifetime window needs all history."""
    lookback = lookback_us(group)
    if lookback is None:
        return None
    return start_us - lookback - max(f.window.every_s for f in group.features) * MICROS


@dataclass(frozen=True)
class BucketJob:
    """What one kernel call computes: the group's plan, the range of window ends, and the output columns."""

    plan: kernel.Plan
    lo: int
    hi: int
    output: dict[str, DType]  # keys and features, in output order


def run_bucket(events: pa.Table, *, job: BucketJob) -> pa.Table:
    """One kernel call (applyInArrow): a bucket's events -> its keys' change points, then a copy of each key's
    newest row flagged `LATEST` (the online store's row: the kernel knows it, where Spark would aggregate)."""
    panes = kernel.phase1_sorted(job.plan, kernel.events_frame(events.drop_columns([BUCKET])))
    rows = kernel.emit(job.plan, panes, None, job.hi, clamp_us=job.lo)
    arrays = {name: kernel.to_arrow(rows[name], ARROW_TYPES[t]) for name, t in job.output.items()}
    arrays[END_US] = pa.array(rows[WINDOW_END].to_numpy(), pa.int64())
    table = pa.table(arrays)
    newest = np.flatnonzero(kernel.key_lasts([rows[k].array for k in job.plan.keys]))
    flags = np.r_[np.zeros(len(table), dtype=bool), np.ones(len(newest), dtype=bool)]
    return pa.concat_tables([table, table.take(newest)]).append_column(LATEST, pa.array(flags))


def _buckets(events: DataFrame) -> int:
    """How many kernel calls: one per shuffle partition (a fixed count, because adaptive execution would merge
    small partitions into fewer, unequal tasks: 3 on 2 cores, a tail)."""
    configured = events.sparkSession.conf.get("spark.sql.shuffle.partitions") or ""
    return max(1, int(configured)) if configured.isdigit() else 8


@dataclass(frozen=True)
class ChangePoints:
    rows: DataFrame  # keys, window_end, one column per feature
    with_latest: DataFrame  # `rows`, then a copy of each key's newest row with `LATEST` true (false on the others)
    events: DataFrame  # the events read
    observed: Observation | None = None  # counts the events while `rows` is computed

    def events_read(self) -> int:
        """How many events the computation read. Once `rows` was computed (written), the count observed
        during that job, else a separate job that only scans timestamps."""
        counted = None if self.observed is None else observed_count(self.observed, "events")
        return self.events.count() if counted is None else counted


def change_points(
    group: FeatureGroup, events: DataFrame, start_us: int, end_us: int, *, observe: bool = False
) -> ChangePoints:
    """The change-point series with window ends in [start, end] (end included, so the last row of each
    key is its value as of `end`), from events before `end`. Each key's first row, at `start`, carries the
    value the range starts with.

    `observe=True`: count the events in the job that computes the rows; `events_read()` then returns that
    count, and must only be called after `rows` was computed (an observation waits for its first job)."""
    keys = list(group.join_keys)
    lower = read_lower_bound(group, start_us)
    ts = F.col(group.source.timestamp)
    in_range = ts < F.timestamp_micros(F.lit(end_us))
    if lower is not None:
        in_range = in_range & (ts >= F.timestamp_micros(F.lit(lower)))
    types = schema_of(events.schema)
    plan = kernel.Plan.of(group, types)
    events = events.where(in_range)
    observed = Observation() if observe else None
    read = events if observed is None else events.observe(observed, F.count(F.lit(1)).alias("events"))
    present = ts.isNotNull()
    for key in keys:
        present = present & F.col(key).isNotNull()
    buckets = _buckets(events)
    bucket = bucket_of(group, bucket_labels(buckets, buckets)).alias(BUCKET)
    projected = read.where(present).select(bucket, *kernel_inputs(group, types, plan))
    outputs = group.output_types(types)
    key_types = {k: outputs[k] for k in keys}
    feature_types = {f.name: outputs[f.name] for f in group.features}
    job = BucketJob(plan, start_us, end_us, {**key_types, **feature_types})
    schema = f"{ddl(key_types)}, {END_US} bigint, {ddl(feature_types)}, {LATEST} boolean"

    def compute(events):  # type: ignore[no-untyped-def]  # no hints: PySpark 4.3 fails to infer from string hints
        return run_bucket(events, job=job)

    computed = (
        projected.groupBy(BUCKET)
        .applyInArrow(compute, schema)
        .select(
            *keys, F.timestamp_micros(F.col(END_US)).alias(WINDOW_END), *[F.col(f.name) for f in group.features], LATEST
        )
    )
    return ChangePoints(computed.where(~F.col(LATEST)).drop(LATEST), computed, events, observed)
