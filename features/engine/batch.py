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
from features.spec.definitions import LATEST
from features.stores.feature_refs import FeatureColumn, empty_value

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
    rows = _bucket_rows(events.drop_columns([BUCKET]), job)
    return _with_latest(rows, kernel.key_lasts([rows[k] for k in job.plan.keys]))


@dataclass(frozen=True)
class BesideJob:
    """What one kernel call adds when some features are computed beside the table's values of the others."""

    schema: pa.Schema  # keys, END_US and the whole group's features, in output order
    empties: dict[str, pa.Array]  # each feature's empty value (an array of one)


def run_bucket_beside(events: pa.Table, table: pa.Table, *, job: BucketJob, beside: BesideJob) -> pa.Table:
    """One kernel call (cogroup's applyInArrow): a bucket's events -> the computed features' change points, merged
    with the table's rows of the other features (features.kernel.beside), then the LATEST copies."""
    events, table = events.drop_columns([BUCKET]), table.drop_columns([BUCKET])
    rows = _bucket_rows(events, job) if events.num_rows else _no_rows(job)
    keys = list(job.plan.keys)
    merged, newest = kernel.beside(keys, END_US, table, rows, job.lo, beside.empties)
    return _with_latest(merged.select(beside.schema.names).cast(beside.schema), newest)


def _bucket_rows(events: pa.Table, job: BucketJob) -> pa.Table:
    """The kernel's change points of a bucket's events: keys, END_US, features."""
    panes = kernel.phase1_sorted(job.plan, kernel.events_frame(events))
    rows = kernel.emit(job.plan, panes, None, job.hi, clamp_us=job.lo)
    arrays = {name: kernel.to_arrow(rows[name], ARROW_TYPES[t]) for name, t in job.output.items()}
    arrays[END_US] = pa.array(rows[WINDOW_END].to_numpy(), pa.int64())
    return pa.table(arrays)


def _no_rows(job: BucketJob) -> pa.Table:
    return pa.table(
        {**{n: pa.array([], ARROW_TYPES[t]) for n, t in job.output.items()}, END_US: pa.array([], pa.int64())}
    )


def _with_latest(table: pa.Table, newest: np.ndarray) -> pa.Table:
    """`table`, then a copy of its rows `newest` (a mask), the copies flagged `LATEST`."""
    picked = np.flatnonzero(newest)
    flags = np.r_[np.zeros(len(table), dtype=bool), np.ones(len(picked), dtype=bool)]
    return pa.concat_tables([table, table.take(picked)]).append_column(LATEST, pa.array(flags))


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
    group: FeatureGroup,
    events: DataFrame,
    start_us: int,
    end_us: int,
    *,
    observe: bool = False,
    beside: TableRows | None = None,
) -> ChangePoints:
    """The change-point series with window ends in [start, end] (end included, so the last row of each
    key is its value as of `end`), from events before `end`. Each key's first row, at `start`, carries the
    value the range starts with.

    `observe=True`: count the events in the job that computes the rows; `events_read()` then returns that
    count, and must only be called after `rows` was computed (an observation waits for its first job).

    `beside`: `group` is some features of `beside.group`, whose other features' values come from the offline
    table's rows: the result is the whole group's series (features.kernel.beside), in the same kernel calls."""
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
    whole = group if beside is None else beside.group
    whole_types = whole.output_types(types)
    schema = f"{ddl(key_types)}, {END_US} bigint, {ddl({f.name: whole_types[f.name] for f in whole.features})}"
    schema += f", {LATEST} boolean"
    if beside is None:

        def compute(events):  # type: ignore[no-untyped-def]  # no hints: PySpark 4.3 fails to infer from string hints
            return run_bucket(events, job=job)

        computed = projected.groupBy(BUCKET).applyInArrow(compute, schema)
    else:
        merge = _beside_job(whole, key_types, whole_types)
        kept = [f.name for f in whole.features if f.name not in feature_types]
        # The keys as the events have them: a hash bucket depends on the type (an int and a bigint differ).
        same_keys = [F.col(k).cast(events.schema[k].dataType).alias(k) for k in keys]
        table = (
            beside.rows.where(F.col(WINDOW_END) <= F.timestamp_micros(F.lit(end_us)))
            .select(*same_keys, F.unix_micros(F.col(WINDOW_END)).alias(END_US), *kept)
            .select(bucket, *keys, END_US, *kept)
        )

        def compute_beside(events, table):  # type: ignore[no-untyped-def]
            return run_bucket_beside(events, table, job=job, beside=merge)

        computed = projected.groupBy(BUCKET).cogroup(table.groupBy(BUCKET)).applyInArrow(compute_beside, schema)
    computed = computed.select(
        *keys, F.timestamp_micros(F.col(END_US)).alias(WINDOW_END), *[F.col(f.name) for f in whole.features], LATEST
    )
    return ChangePoints(computed.where(~F.col(LATEST)).drop(LATEST), computed, events, observed)


@dataclass(frozen=True)
class TableRows:
    """The offline table's rows of a group, whose features not computed keep their values from there."""

    group: FeatureGroup  # the whole group
    rows: DataFrame  # keys, window_end and the features' columns, from far enough back (read_lower_bound)


def _beside_job(group: FeatureGroup, key_types: dict[str, DType], types: dict[str, DType]) -> BesideJob:
    columns = {**key_types, END_US: DType.INT64, **{f.name: types[f.name] for f in group.features}}
    schema = pa.schema([(name, ARROW_TYPES[t]) for name, t in columns.items()])
    empties = {
        f.name: pa.array(
            [empty_value(FeatureColumn(f.name, types[f.name], f.aggregation.kind.op.empty))], schema.field(f.name).type
        )
        for f in group.features
    }
    return BesideJob(schema, empties)
