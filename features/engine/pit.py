"""Point-in-time joins in Spark: training sets whose label rows are a Spark DataFrame (`features.training_set`).

For each label row (keys, t) and each requested group, the group's change point with the latest
`window_end <= t` for those keys: the very row Feast's `get_historical_features` picks (Feast 0.67 joins on
equal keys and `window_end <= t`, the equality included, then keeps the latest `window_end` per entity row; the
FeatureViews' ttl is 0, so there is no lower bound). A key without such a row reads as empty windows (0, {} or
null), filled as the pandas path fills them (`features.stores.feature_refs.empty_value`). Null keys match nothing,
in Feast as here.
Two change points of one key never share a `window_end` (the offline table guarantees it), so there are no
ties to break.

Nothing is collected to the driver but one row of statistics (count, time range, rows outside the offline
table's days) and the few dates that hold the look-back rows. The join runs in the label rows' own session
(`rows.sparkSession`), classic or Spark Connect; it uses DataFrame operations only (no SparkContext, RDD or JVM).

How a key is split (so that a key with a million change points never sits in one task): time is cut into
buckets (a UTC day by default, the offline table's partitions), and the as-of lookup runs per (key, bucket):
a label row in bucket b sees the change points of its key in b, plus one carry-in row, the key's latest change
point before b. The carry-in rows come from a summary of one row per (key, bucket) (the bucket's last change
point, a map-side partial aggregation), looked up per key: a key has as many summary rows as buckets, not as
change points. So one task holds at most one key's change points of one bucket (a day has at most
86,400 / every of them per window shape), whatever the key's history. Label rows of one key and bucket go to
one task too; Spark's window operator spills them to disk beyond its buffer, so a key with millions of label
rows in one day is slower, not out of memory.

Reads: the date partitions from the earliest label row's date to the latest's, plus, when the table starts
earlier, the look-back: each label key's latest partition before that (found from the key and date columns
only), so a key whose last change is weeks old (a Lifetime count) keeps its value.

Order: Spark DataFrames have no order of their own; a row id (`monotonically_increasing_id`, increasing with
the input partition and the position in it) is taken as the rows are read, and the result is sorted by it: the
rows come out in the order Spark reads them (for a DataFrame made from pandas or read from files, their order).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql.types import DateType, StringType, TimestampNTZType, TimestampType

from features.engine.inputs import SPARK_TYPES
from features.engine.session import apply_required_conf, is_connect
from features.errors import ConfigError
from features.spec import WINDOW_END, DType
from features.spec.definitions import DATE
from features.stores.feature_refs import ROW_ID, empty_value, offline_dates
from features.stores.offline import read_table

if TYPE_CHECKING:
    from features.repo import Repo
    from features.stores.feature_refs import FeatureRef

DAY = timedelta(days=1)
_INTERNAL = "__features_"
PAYLOAD = f"{_INTERNAL}rows"  # the caller's columns, as one struct carried through the joins
LOOKUP = f"{_INTERNAL}t"  # the row's lookup time (UTC timestamp)
TS = f"{_INTERNAL}ts"  # label rows: the lookup time; change points: their window end
BUCKET = f"{_INTERNAL}bucket"
KIND = f"{_INTERNAL}kind"
CP = f"{_INTERNAL}cp"  # a change point's features, as one struct (null on label rows)
LAST = f"{_INTERNAL}last"
FOUND = f"{_INTERNAL}found"
CHANGE, LABEL = 0, 1  # at equal times a change point sorts first: `window_end <= t` includes it
_INTEGRAL = ("tinyint", "smallint", "int", "bigint")


def _api(spark: SparkSession) -> tuple[Any, Any]:
    """PySpark's functions and Window for the session's kind. PySpark's own `functions` build columns for the
    kind of the process (Spark Connect once `builder.remote` ran); a process may hold both kinds (a test run,
    a notebook that was given a Connect DataFrame), so the session decides."""
    if is_connect(spark):
        from pyspark.sql.connect import functions
        from pyspark.sql.connect.window import Window
    else:
        from pyspark.sql import functions
        from pyspark.sql.window import Window
    return functions, Window


def _q(name: str) -> str:
    """A column name as Spark SQL reads it literally (dots, spaces and backticks included)."""
    return "`" + name.replace("`", "``") + "`"


def _key(i: int) -> str:
    return f"{_INTERNAL}key{i}"


# ---------------------------------------------------------------------------------------------------------
# The rows: lookup times and one row of statistics


def lookup_time(rows: DataFrame, column: str) -> Column:
    """The rows' lookup time as a UTC timestamp: timestamps as they are, naive ones (TIMESTAMP_NTZ) and dates
    as UTC, ISO-8601 strings parsed (null where they are not timestamps)."""
    spark = rows.sparkSession
    apply_required_conf(spark)  # session time zone UTC: naive times and dates are UTC, as in the pandas path
    fn, _ = _api(spark)
    kind = rows.schema[column].dataType
    value = fn.col(_q(column))
    if isinstance(kind, TimestampType):
        return value
    if isinstance(kind, TimestampNTZType | DateType):
        return value.cast("timestamp")
    if isinstance(kind, StringType):
        return fn.try_to_timestamp(value)
    raise ConfigError(
        f"entity_rows.{column}: not timestamps (Spark type {kind.simpleString()}); pass a timestamp, date or "
        "ISO-8601 string column"
    )


@dataclass(frozen=True)
class RowStats:
    """What the driver learns of the label rows, in one aggregation."""

    rows: int
    missing: int  # rows with a null timestamp
    unparsed: int  # strings that are not timestamps
    start: datetime | None  # earliest and latest lookup time (UTC)
    end: datetime | None
    outside: dict[str, tuple[int, int]]  # group -> rows before its first offline day, rows after its last


def row_stats(rows: DataFrame, column: str, spans: dict[str, tuple[datetime, datetime]]) -> RowStats:
    """Counts, time range and, per group, the rows outside `spans` (group -> [first day, day after the last))."""
    fn, _ = _api(rows.sparkSession)
    t, raw = lookup_time(rows, column), fn.col(_q(column))
    one = fn.lit(1)
    aggregates = [
        fn.count(one).alias("rows"),
        fn.count(fn.when(raw.isNull(), one)).alias("missing"),
        fn.count(fn.when(raw.isNotNull() & t.isNull(), one)).alias("unparsed"),
        fn.min(fn.unix_micros(t)).alias("start"),
        fn.max(fn.unix_micros(t)).alias("end"),
    ]
    for i, (first, after) in enumerate(spans.values()):
        aggregates.append(fn.count(fn.when(t < fn.lit(first), one)).alias(f"early{i}"))
        aggregates.append(fn.count(fn.when(t >= fn.lit(after), one)).alias(f"late{i}"))
    row = rows.agg(*aggregates).first()
    if row is None:
        raise AssertionError("an aggregation without grouping returned no row")
    return RowStats(
        rows=int(row["rows"]),
        missing=int(row["missing"]),
        unparsed=int(row["unparsed"]),
        start=_utc(row["start"]),
        end=_utc(row["end"]),
        outside={name: (int(row[f"early{i}"]), int(row[f"late{i}"])) for i, name in enumerate(spans)},
    )


def _utc(micros: int | None) -> datetime | None:
    # From epoch microseconds: a collected timestamp would be a naive time in this process's local zone.
    return None if micros is None else datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=int(micros))


# ---------------------------------------------------------------------------------------------------------
# The join


@dataclass(frozen=True)
class _Group:
    """One requested group: its offline table and the features asked of it, with their output columns."""

    name: str
    keys: list[str]
    table: str
    features: list[FeatureRef]
    full_feature_names: bool

    @property
    def columns(self) -> list[str]:
        return [r.column(self.full_feature_names) for r in self.features]


def join_features(
    rows: DataFrame,
    refs: Sequence[FeatureRef],
    repo: Repo,
    timestamp_column: str,
    *,
    start: datetime,
    end: datetime,
    full_feature_names: bool = False,
    bucket: timedelta = DAY,
    versions: Mapping[str, int] | None = None,
) -> DataFrame:
    """The rows (all their columns, in their order) with each feature's value at the row's time, then the
    features in the order of `refs`. `start`/`end`: the rows' earliest and latest lookup time (`row_stats`).
    `bucket`: the time buckets a key's timeline is cut into (see the module docstring). `versions`: group ->
    the offline table's version to read (the newest for a group not in it)."""
    spark = rows.sparkSession
    fn, _ = _api(spark)
    bucket_us = int(bucket / timedelta(microseconds=1))
    if bucket_us <= 0:
        raise ValueError(f"bucket must be positive, got {bucket}")
    staged = rows.select(
        fn.struct(*[fn.col(_q(c)) for c in rows.columns]).alias(PAYLOAD),
        lookup_time(rows, timestamp_column).alias(LOOKUP),
        fn.monotonically_increasing_id().alias(ROW_ID),
    )
    out = staged
    for group in _groups(refs, repo, full_feature_names):
        out = _join_group(out, staged, group, repo, (start, end), bucket_us, (versions or {}).get(group.name))
    features = [c for g in _groups(refs, repo, full_feature_names) for c in g.columns]
    ordered = out.orderBy(ROW_ID)
    return ordered.select(fn.col(f"{PAYLOAD}.*"), *[fn.col(_q(c)) for c in features])


def _groups(refs: Sequence[FeatureRef], repo: Repo, full_feature_names: bool) -> list[_Group]:
    groups: dict[str, _Group] = {}
    for ref in refs:
        name = ref.group.name
        if name not in groups:
            groups[name] = _Group(name, list(ref.group.join_keys), repo.offline_path(name), [], full_feature_names)
        groups[name].features.append(ref)
    return list(groups.values())


def _join_group(
    labels: DataFrame,
    staged: DataFrame,
    group: _Group,
    repo: Repo,
    span: tuple[datetime, datetime],
    bucket_us: int,
    version: int | None,
) -> DataFrame:
    """`labels` with the group's features added: the as-of lookup per (key, bucket)."""
    spark = labels.sparkSession
    fn, win = _api(spark)
    table = read_table(spark, group.table, version)
    if table is None:
        raise ConfigError(f"features: group {group.name!r} has no offline rows in {group.table}; backfill it first")
    keys = [_key(i) for i in range(len(group.keys))]
    key_values = _label_keys(staged, table, group)
    first_day, last_day = span[0].astimezone(UTC).date(), span[1].astimezone(UTC).date()
    changes = _change_points(table, group, bucket_us)
    in_range = (fn.col(DATE) >= fn.lit(first_day)) & (fn.col(DATE) <= fn.lit(last_day))
    older = [d for d in offline_dates(repo, group.name, version) if d < first_day]
    look_back = _look_back_dates(table, key_values, group, first_day) if older else []
    read = in_range | fn.col(DATE).isin(*look_back) if look_back else in_range
    points = changes.where(read)
    buckets = key_values.select(*keys, _bucket(fn.col(LOOKUP), bucket_us, fn).alias(BUCKET))
    carried = labels.columns
    label_side = labels.select(
        "*",
        *[key.alias(name) for key, name in zip(_label_key_columns(labels, table, group), keys, strict=True)],
        fn.col(LOOKUP).alias(TS),
        _bucket(fn.col(LOOKUP), bucket_us, fn).alias(BUCKET),
        fn.lit(LABEL).alias(KIND),
    )
    union = label_side.unionByName(
        points.where(in_range).select(*keys, TS, BUCKET, KIND, CP), allowMissingColumns=True
    ).unionByName(_carry_in(points, buckets, keys), allowMissingColumns=True)
    window = win.partitionBy(*keys, BUCKET).orderBy(TS, KIND).rowsBetween(win.unboundedPreceding, win.currentRow)
    found = union.select(*carried, KIND, fn.last(CP, ignorenulls=True).over(window).alias(FOUND))
    value = fn.col(FOUND)
    features = [_filled(value.getField(r.column(group.full_feature_names)), r, group, fn) for r in group.features]
    return found.where(fn.col(KIND) == LABEL).select(*carried, *features)


def _bucket(ts: Column, bucket_us: int, fn: Any) -> Column:
    """floor(t / bucket), in exact integer arithmetic (epoch-aligned, UTC)."""
    micros = fn.unix_micros(ts)
    return ((micros - fn.pmod(micros, fn.lit(bucket_us))) / fn.lit(bucket_us)).cast("long")


def _change_points(table: DataFrame, group: _Group, bucket_us: int) -> DataFrame:
    """The offline table as change points: internal key columns, TS, BUCKET, KIND and the features in CP
    (named as the output columns), with the `date` partition column for pruning."""
    fn, _ = _api(table.sparkSession)
    needed = [*group.keys, WINDOW_END, *(r.feature.name for r in group.features)]
    missing = [c for c in needed if c not in table.columns]
    if missing:
        raise ConfigError(
            f"features: the offline table of group {group.name!r} has no column {', '.join(map(repr, missing))}; "
            f"re-run `features backfill` for {group.name} after changing its definition"
        )
    point = fn.struct(*[fn.col(_q(r.feature.name)).alias(r.column(group.full_feature_names)) for r in group.features])
    return table.select(
        *[fn.col(_q(k)).alias(_key(i)) for i, k in enumerate(group.keys)],
        fn.col(WINDOW_END).alias(TS),
        _bucket(fn.col(WINDOW_END), bucket_us, fn).alias(BUCKET),
        fn.lit(CHANGE).alias(KIND),
        point.alias(CP),
        fn.col(DATE),
    )


def _label_key_columns(labels: DataFrame, table: DataFrame, group: _Group) -> list[Column]:
    """The group's join keys of the label rows (inside the carried struct), typed like the table's keys."""
    fn, _ = _api(labels.sparkSession)
    payload = labels.schema[PAYLOAD].dataType
    columns = []
    for key in group.keys:
        want = table.schema[key].dataType.simpleString()
        got = payload[key].dataType.simpleString()  # type: ignore[index]
        value = fn.col(PAYLOAD).getField(key)
        if got != want:
            if not (got in _INTEGRAL and want in _INTEGRAL):
                raise ConfigError(
                    f"entity_rows.{key}: type {got}, but the offline table of group {group.name!r} keys it by "
                    f"{want}; cast the column to {want}"
                )
            value = value.cast(want)
        columns.append(value)
    return columns


def _label_keys(staged: DataFrame, table: DataFrame, group: _Group) -> DataFrame:
    """The label rows' keys of this group (internal names) and lookup times, from the rows as read."""
    keys = _label_key_columns(staged, table, group)
    return staged.select(*[k.alias(_key(i)) for i, k in enumerate(keys)], LOOKUP)


def _look_back_dates(table: DataFrame, key_values: DataFrame, group: _Group, first_day: date) -> list[date]:
    """The partitions before `first_day` holding some label key's latest change point before it: read from the
    key and date columns only, then those partitions join in full."""
    fn, _ = _api(table.sparkSession)
    older = table.where(fn.col(DATE) < fn.lit(first_day))
    keys = [_key(i) for i in range(len(group.keys))]
    latest = older.groupBy(*[fn.col(_q(k)).alias(_key(i)) for i, k in enumerate(group.keys)]).agg(
        fn.max(DATE).alias(DATE)
    )
    wanted = latest.join(key_values.select(*keys).distinct(), on=keys, how="left_semi")
    return sorted(row[DATE] for row in wanted.select(DATE).distinct().collect())


def _carry_in(points: DataFrame, buckets: DataFrame, keys: list[str]) -> DataFrame:
    """Per (key, bucket) of the label rows, the key's latest change point before the bucket, as a change-point
    row of that bucket. From one summary row per (key, bucket) (its last change point), looked up per key."""
    fn, win = _api(points.sparkSession)
    summary = points.groupBy(*keys, BUCKET).agg(fn.max_by(fn.struct(TS, CP), TS).alias(LAST))
    # At an equal bucket the label bucket sorts first: only summaries of earlier buckets precede it.
    wanted = buckets.distinct().withColumn(KIND, fn.lit(0))
    window = win.partitionBy(*keys).orderBy(BUCKET, KIND).rowsBetween(win.unboundedPreceding, win.currentRow)
    both = wanted.unionByName(summary.withColumn(KIND, fn.lit(1)), allowMissingColumns=True)
    previous = both.select(*keys, BUCKET, KIND, fn.last(LAST, ignorenulls=True).over(window).alias(LAST))
    return previous.where((fn.col(KIND) == 0) & fn.col(LAST).isNotNull()).select(
        *keys,
        fn.col(LAST).getField(TS).alias(TS),
        BUCKET,
        fn.lit(CHANGE).alias(KIND),
        fn.col(LAST).getField(CP).alias(CP),
    )


def _filled(value: Column, ref: FeatureRef, group: _Group, fn: Any) -> Column:
    """A feature's value with the empty-window fill of the pandas path (`features.stores.feature_refs.empty_value`)."""
    column = ref.as_column(group.full_feature_names)
    empty = empty_value(column)
    if empty is None:
        return value.alias(column.name)
    if isinstance(empty, dict):  # an empty map, of the column's own type (a literal {} has no key and value types)
        return fn.coalesce(value, fn.create_map().cast(SPARK_TYPES[column.dtype])).alias(column.name)
    if isinstance(empty, list):  # distinct_values: an empty array of the column's own type, as for a map
        return fn.coalesce(value, fn.array().cast(SPARK_TYPES[column.dtype])).alias(column.name)
    typed = "bigint" if column.dtype is DType.INT64 else "double"
    return fn.coalesce(value, fn.lit(empty)).cast(typed).alias(column.name)
