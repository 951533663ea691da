"""Reading an EventSource into Spark, with its schema checked against the definitions, and bad records set
aside with the reason each one cannot be used.

A record is bad when it cannot be parsed (JSON that is malformed or not an object), a value does not have the
declared type, a value the group aggregates is infinite, a join key or the timestamp is missing, or the timestamp
is more than the source's `max_future` after the current time. A NaN is a null (docs/semantics.md, Nulls). A file that
cannot be read (not Parquet), or that does not conform to the source's schema (a column the group reads is
missing, or has a type that does not convert to the schema's without loss), is set aside whole as one bad record
with its reason, and every other file is read. The engines only ever see the good records; the bad ones go to a
quarantine folder.

The source's schema is fixed by the definitions, never by the files' order: the declared one, else the one
`features apply` inferred from all the files and recorded in the repo (features.repo.read_schema_record), else
(a source no apply has seen) one inferred from all the files at each read. The columns the group reads are
marked in the Spark schema's field metadata (`READ`), so that every read of it knows what a file must hold.

Parquet files are read with an explicit schema (the declared one, else the one their footers give), twice:
once with microsecond timestamps (Spark's own files, pyarrow's) and once with nanosecond ones (pandas'
`to_parquet` default, which Spark refuses to read as a plain timestamp), each read skipping the files it cannot
read, so every file is read by exactly one of them. Only SQL settings and reader options are used, no JVM
access, so this also works on Spark Connect.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from features.errors import ConfigError, DefinitionError, SchemaError
from features.spec import Feature, FeatureGroup

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, DataFrameReader, Observation, SparkSession
    from pyspark.sql.streaming import DataStreamReader
    from pyspark.sql.types import StructType

from features.engine.files import (
    FileCheck,
    SetAsideFile,
    nanosecond_files,
    null_rows,
    null_typed_files,
    timestamp_unit,
    unreadable_files,
)
from features.engine.schema import (
    CHECKED_FILE,
    CORRUPT,
    FILE,
    FUTURE_TIMESTAMP,
    INFINITE_VALUE,
    MARK,
    META,
    MISSING_KEY,
    MISSING_TIMESTAMP,
    PAST_TIMESTAMP,
    RAW_RECORD,
    REASON,
    SOURCE_FILE,
    UNPARSEABLE,
    WRONG_TYPE,
    ddl_of,
    declared_spark_schema,
    enable_nanosecond_read,
    expected_columns,
    group_schema,
    in_microseconds,
    quiet_spark_errors,
    schema_of,
    source_columns,
    timestamp_columns,
)


@dataclass(frozen=True)
class SourceRead:
    """A source split into the records the engines use and the ones set aside."""

    rejected: DataFrame  # bad records: reason, source_file, raw_record (JSON only), then the source's columns
    now: datetime  # the current time the `max_future` check used
    timestamp: str  # the timestamp column
    marked: DataFrame  # every record with its reason in MARK (null for a good one), before NaNs are made nulls
    good: list[Column]  # the columns of `events` from `marked`
    future_us: int | None  # timestamps after this are bad (`max_future`)
    bad_files: int = 0  # files set aside whole (unreadable or nonconforming), among `rejected`
    set_aside: tuple[SetAsideFile, ...] = ()  # those files, with their reasons and events

    @property
    def events(self) -> DataFrame:
        """The good records: the source's columns."""
        return self.good_of(self.marked)

    def good_of(self, marked: DataFrame) -> DataFrame:
        """The good records among `marked` (a part of `marked`): the source's columns."""
        from pyspark.sql import functions as F

        return marked.where(F.col(MARK).isNull()).select(*self.good).drop(META)

    def _in_range(self, lower_us: int | None, end_us: int) -> Column:
        from pyspark.sql import functions as F

        ts = F.col(self.timestamp).cast("timestamp")
        in_range = ts < F.timestamp_micros(F.lit(end_us))
        if lower_us is not None:
            in_range = in_range & (ts >= F.timestamp_micros(F.lit(lower_us)))
        return in_range

    def rejected_for(self, lower_us: int | None, end_us: int) -> DataFrame:
        """The bad records a read of [lower, end) would have used: those stamped in that range, and those
        without a usable time (no timestamp, unparseable, or beyond `max_future`), which any read may hold."""
        from pyspark.sql import functions as F

        timeless = F.col(self.timestamp).cast("timestamp").isNull() | (F.col(REASON) == F.lit(FUTURE_TIMESTAMP))
        return self.rejected.where(timeless | self._in_range(lower_us, end_us))

    def counted_events(self, lower_us: int | None, end_us: int) -> tuple[DataFrame, Observation]:
        """The good events of [lower, end), read by a plan that also counts (as "rejected", at least) the bad
        records `rejected_for` gives: one pass over the source tells whether there is anything to set aside.
        The Observation is filled by the first job that reads the events (see `observed_count`)."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        ts = F.col(self.timestamp).cast("timestamp")
        # Conditions on the timestamp alone, so that Parquet row groups outside them are still skipped.
        timeless = ts.isNull()
        if self.future_us is not None:
            timeless = timeless | (ts > F.timestamp_micros(F.lit(self.future_us)))
        observation = Observation()
        read = self.marked.where(timeless | self._in_range(lower_us, end_us))
        read = read.observe(observation, F.count_if(F.col(MARK).isNotNull()).alias("rejected"))
        return self.good_of(read), observation


def observed_count(observation: Observation, name: str) -> int | None:
    """A count an Observation made during a job that has run, or None when Spark cannot give it: Spark 4 fails
    an assertion, instead of reporting 0, when the source's statistics let it skip every row group."""
    try:
        return int(observation.get[name])
    except Exception as exc:
        if "assertion failed" not in str(exc):
            raise
        return None


def quarantine_records(rejected: DataFrame, folder: str | Path) -> dict[str, int]:
    """Write bad records (a `SourceRead.rejected` frame) as Parquet into `folder`, which must not exist yet;
    returns how many there were per reason. Nothing is written when there are none."""
    return quarantine_counts(rejected, folder)[0]


def quarantine_counts(
    rejected: DataFrame, folder: str | Path, timestamp: str | None = None
) -> tuple[dict[str, int], dict[date, int]]:
    """`quarantine_records`, and with `timestamp` (the source's timestamp column) also how many of the records
    are stamped on each UTC day (records without a usable time, and the records of whole files, on none)."""
    from pyspark.sql import functions as F

    day = F.lit(None).cast("bigint")
    if timestamp is not None:
        day = F.floor(F.unix_micros(F.col(timestamp).cast("timestamp")) / F.lit(86_400_000_000))
    rows = rejected.groupBy(F.col(REASON), day.alias("day")).agg(F.count(F.lit(1)).alias("n")).collect()
    counts: dict[str, int] = {}
    days: dict[date, int] = {}
    for row in rows:
        counts[str(row[REASON])] = counts.get(str(row[REASON]), 0) + int(row["n"])
        if row["day"] is not None:
            stamped = date(1970, 1, 1) + timedelta(days=int(row["day"]))
            days[stamped] = days.get(stamped, 0) + int(row["n"])
    if counts:
        rejected.write.parquet(str(folder))
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0]))), dict(sorted(days.items()))


def read_events(spark: SparkSession, group: FeatureGroup, path: str, *, now: datetime | None = None) -> DataFrame:
    """The source's good records as a DataFrame whose columns the group's definitions can use."""
    return read_source(spark, group, path, now=now).events


def read_source(spark: SparkSession, group: FeatureGroup, path: str, *, now: datetime | None = None) -> SourceRead:
    """The source's records, split into good ones and bad ones with their reason (see the module docstring).

    Nothing is read yet: both are lazy DataFrames over the same files (only the files that cannot be read are
    found now, one small job)."""
    from pyspark.sql import functions as F

    raw, schema = _load(spark, group, path)
    columns = source_columns(raw)
    now = (now or datetime.now(UTC)).astimezone(UTC)
    checked = FileCheck(spark, schema, nulls=True)  # read as `_read_parquet_folder` reads
    bad_files = unreadable_files(spark, raw, schema, checked) if group.source.format == "parquet" else []
    if bad_files:
        # Spark reads some files that do not conform (a missing column reads as nulls): none of a file set aside
        # is used. A filter on the file's path alone also spares Spark opening those files.
        spellings = [spelling for _, file in bad_files for spelling in uri_spellings(file)]
        raw = raw.where(~F.col(META)["file_path"].isin(spellings))
    marked = raw.withColumn(MARK, reason_of(group, raw, now))
    good = [*cleaned_columns(raw), F.col(META)]
    extra = [F.col(META)["file_path"].alias(SOURCE_FILE)]
    if CORRUPT in raw.columns:
        extra.append(F.col(CORRUPT).alias(RAW_RECORD))
    rejected = marked.select(F.col(MARK).alias(REASON), *extra, *columns).where(F.col(REASON).isNotNull())
    if bad_files:
        rejected = rejected.unionByName(_file_records(spark, bad_files, rejected.schema))
    set_aside = tuple(SetAsideFile(file, reason, checked.rows.get(file, 0)) for reason, file in bad_files)
    future_us = _future_us(group, now)
    return SourceRead(rejected, now, group.source.timestamp, marked, good, future_us, len(bad_files), set_aside)


def uri_spellings(uri: str) -> list[str]:
    """A file's URI as Spark lists it (`file:///p`) and as its records' `_metadata.file_path` gives it
    (`file:/p`), both percent-encoded alike."""
    return [uri, "file:/" + uri.removeprefix("file:///")] if uri.startswith("file:///") else [uri]


def cleaned_columns(raw: DataFrame) -> list[Column]:
    """The source's columns with every floating-point NaN made a null (docs/semantics.md, Nulls: a NaN in a value
    column is a null, so it is ignored like one by every aggregation and engine)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    floats = {f.name for f in raw.schema.fields if isinstance(f.dataType, T.FloatType | T.DoubleType)}
    return [
        F.nanvl(F.col(c), F.lit(None).cast(raw.schema[c].dataType)).alias(c) if c in floats else F.col(c)
        for c in source_columns(raw)
    ]


def _file_records(spark: SparkSession, bad_files: list[tuple[str, str]], schema: StructType) -> DataFrame:
    """One rejected record per file that cannot be read: its reason and path, every other column null."""
    from pyspark.sql import functions as F

    files = spark.createDataFrame(bad_files, f"{REASON} string, {SOURCE_FILE} string")
    return files.select(
        *[
            F.col(f.name) if f.name in (REASON, SOURCE_FILE) else F.lit(None).cast(f.dataType).alias(f.name)
            for f in schema.fields
        ]
    )


def reason_of(group: FeatureGroup, raw: DataFrame, now: datetime | Column) -> Column:
    """Why a record cannot be used, or null for a good record. The first reason that applies wins.

    `now` is the current time of the `max_future` check: a fixed time for a batch read, and for a stream the
    column `current_timestamp()`, which Structured Streaming evaluates once per micro-batch (its batch time,
    kept in the checkpoint's offset log, so a replayed batch decides as its first attempt did). A time fixed
    when a stream starts would mark every event as from the future once the stream ran longer than
    `max_future`."""
    from pyspark.sql import functions as F

    source = group.source
    ts = F.col(source.timestamp).cast("timestamp")
    reason = None

    def otherwise(condition: Column, value: Column) -> None:
        nonlocal reason
        reason = F.when(condition, value) if reason is None else reason.when(condition, value)

    def named(prefix: str, columns: list[Column]) -> Column:
        return F.concat(F.lit(f"{prefix}: "), F.concat_ws(", ", *columns))

    floats, latest = _float_values(group, raw), _latest_usable(group, now)
    kafka = source.kafka
    if CORRUPT in raw.columns and FILE in raw.columns and kafka is not None and kafka.schema is not None:
        from features.engine.kafka import undecoded_reason

        # Avro values read from the topic (features.engine.kafka): what one that did not decode keeps is its bytes.
        otherwise(F.col(CORRUPT).isNotNull(), undecoded_reason(kafka, F.col(CORRUPT)))
    elif CORRUPT in raw.columns:
        corrupt = F.col(CORRUPT).isNotNull()
        # The fields of a corrupt line as text: a column whose text is there but whose value is not has a value
        # of the wrong type. Lines that are not a JSON object give no fields at all.
        fields = F.from_json(F.when(corrupt, F.col(CORRUPT)), "map<string,string>")
        declared = [c for c in raw.columns if c != CORRUPT]
        wrong = [F.when(fields[c].isNotNull() & F.col(c).isNull(), F.lit(c)) for c in declared]
        otherwise(corrupt & fields.isNotNull() & F.greatest(*[w.isNotNull() for w in wrong]), named(WRONG_TYPE, wrong))
        otherwise(corrupt, F.lit(UNPARSEABLE))
    missing = [F.when(F.col(k).isNull(), F.lit(k)) for k in group.join_keys]
    any_missing = F.lit(False)
    for k in group.join_keys:
        any_missing = any_missing | F.col(k).isNull()
    otherwise(any_missing, named(MISSING_KEY, missing))
    otherwise(ts.isNull(), F.lit(MISSING_TIMESTAMP))
    if floats:
        any_infinite = F.lit(False)
        for c in floats:
            any_infinite = any_infinite | _is_infinite(F.col(c))
        infinite = [F.when(_is_infinite(F.col(c)), F.lit(c)) for c in floats]
        otherwise(any_infinite, named(INFINITE_VALUE, infinite))
    if latest is not None:
        otherwise(ts > latest, F.lit(FUTURE_TIMESTAMP))
    if group.source.min_timestamp_us is not None:
        otherwise(ts < F.timestamp_micros(F.lit(group.source.min_timestamp_us)), F.lit(PAST_TIMESTAMP))
    assert reason is not None
    return reason


def _latest_usable(group: FeatureGroup, now: datetime | Column) -> Column | None:
    """The latest usable event time under the source's `max_future` (None without one), from `now` as
    `reason_of` takes it."""
    from pyspark.sql import functions as F

    if group.source.max_future_s is None:
        return None
    if isinstance(now, datetime):
        return F.timestamp_micros(F.lit(_future_us(group, now)))
    # In microseconds, as `_future_us` adds it: a day-time interval added to a timestamp is added in the session's
    # time zone (a day of 23 or 25 hours across a DST change), a zone conversion for every record.
    return F.timestamp_micros(F.unix_micros(now) + F.lit(group.source.max_future_s * 1_000_000))


def _future_us(group: FeatureGroup, now: datetime) -> int | None:
    """The latest usable timestamp (µs) under the source's `max_future`, or None without one."""
    if group.source.max_future_s is None:
        return None
    latest = now + timedelta(seconds=group.source.max_future_s)
    return int(latest.timestamp()) * 1_000_000 + latest.microsecond


def _float_values(group: FeatureGroup, raw: DataFrame) -> list[str]:
    """The floating-point columns the group aggregates: a record with an infinite value there is quarantined."""
    from pyspark.sql import types as T

    floats = {f.name for f in raw.schema.fields if isinstance(f.dataType, T.FloatType | T.DoubleType)}
    read = [f.aggregation.column for f in group.features if f.aggregation.column is not None]
    return sorted(floats.intersection(read))


def _is_infinite(column: Column) -> Column:
    from pyspark.sql import functions as F

    return column.isin(F.lit(float("inf")), F.lit(float("-inf")))


def _load(spark: SparkSession, group: FeatureGroup, path: str) -> tuple[DataFrame, StructType | None]:
    """Every record of the source with its file's metadata (`fx_meta`), with `_corrupt_record` for JSON, and
    the schema it was read with (Parquet); the group's columns checked."""
    source = group.source
    if "://" not in path and not Path(path).exists():
        raise ConfigError(
            f"EventSource({source.name!r}).path: {path} does not exist; land event files there "
            "(the demo generates them: `features demo`) or point path= at your data"
        )
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    declared = declared_spark_schema(group)
    schema = None
    if source.format == "json":
        if declared is None:
            raise DefinitionError(
                f"EventSource({source.name!r}).schema",
                "JSON sources need a declared schema",
                'add schema={"column": "type", ...} to the EventSource',
            )
        with_corrupt = T.StructType([*declared.fields, T.StructField(CORRUPT, T.StringType())])
        reader = spark.read.option("recursiveFileLookup", "true").schema(with_corrupt).option("mode", "PERMISSIVE")
        events = reader.json(path).withColumn(META, F.col("_metadata"))
    else:
        schema = parquet_schema(spark, group, path)
        events = _read_parquet_folder(spark, schema, path)
    check_columns(group, events)
    return events, schema


def _read_parquet_folder(spark: SparkSession, schema: StructType, path: str) -> DataFrame:
    """A batch read of a Parquet folder with `schema` (`read_parquet`). The driver lists the folder: only its
    nanosecond files get the second read, and the files holding a column as Arrow's null type (pandas' type of a
    column of None alone) are read apart, as a stream reads them (features.engine.files.null_rows). None of either
    on a remote store, where such a file is then set aside as unreadable."""
    from pyspark.sql import functions as F

    nanos = nanosecond_files(path, timestamp_columns(schema)) or []
    apart = null_typed_files(path, schema)
    events = read_parquet(spark, spark.read, schema, path, nanos)
    if not apart:
        return events
    spellings = [spelling for file in apart for spelling in uri_spellings(file)]
    events = events.where(~F.col(META)["file_path"].isin(spellings))
    listing = spark.read.format("binaryFile").load(apart)
    return events.unionByName(null_rows(listing, schema, events.schema[META].dataType))


def parquet_schema(spark: SparkSession, group: FeatureGroup, path: str) -> StructType:
    """The schema a Parquet source is read with, the columns the group reads marked (`READ`): the declared
    one, else the one `features apply` recorded, else the files' own (all footers together, skipping files that
    are not Parquet: features.parquet_schema.infer_parquet_schema; Spark's own inference for a URI the driver
    cannot list)."""
    from features.repo import recorded_schema

    declared = declared_spark_schema(group)
    if declared is not None:
        return declared
    recorded = recorded_schema(group.source, path)
    if recorded is not None:
        return group_schema(group, recorded)
    if "://" in path or path.startswith("dbfs:"):
        return spark.read.option("recursiveFileLookup", "true").parquet(path).schema
    from features.parquet_schema import infer_parquet

    columns = infer_parquet(path, f"EventSource({group.source.name!r})")
    if not columns:
        raise ConfigError(
            f"EventSource({group.source.name!r}).schema: no schema is declared and there are no Parquet files in "
            f"{path} to read it from. Fix: land the event files there, or declare schema={{column: type, ...}}"
        )
    return group_schema(group, columns)


def read_parquet(
    spark: SparkSession,
    reader: DataFrameReader | DataStreamReader,
    schema: StructType,
    path: str,
    nanosecond_files: Sequence[str] | None = None,
) -> DataFrame:
    """A Parquet folder (batch or stream) read with `schema`: the union of a read with microsecond timestamps
    and one of the files with nanosecond timestamps (cast to microseconds), each skipping the files it cannot
    read. The records carry their file's metadata as `fx_meta`.

    Spark 4.3 reads nanoseconds as a type of its own: both reads cover the folder, and each file fails in the
    one that does not fit it. Before it, a nanosecond column reads as its raw integer, and so would a microsecond
    one: the second read then covers `nanosecond_files` only (a batch, whose files the driver has listed), or,
    when None (a stream, which learns of its files as they land), the whole folder, each record converted by the
    unit of its file's footer and kept only for nanosecond files (each file read twice: `stream_reads_nanoseconds`
    says when a stream needs it).

    A stream also leaves out the records of every file that does not conform to the columns `schema` marks as
    read (`nonconformity`), as each file lands: the batch read finds those files before it reads
    (`read_source`), and a stream learns of its files only as it reads them: its records carry their file as
    `CHECKED_FILE`, for the stream's pack to check (features.engine.files.Conformity).
    """
    from pyspark.sql import functions as F

    reader = reader.option("recursiveFileLookup", "true").option("ignoreCorruptFiles", "true")
    micros = reader.schema(schema).parquet(path).withColumn(META, F.col("_metadata"))
    nanos = enable_nanosecond_read(spark) if timestamp_columns(schema) else None
    if nanos == "long" and nanosecond_files is not None and not nanosecond_files:
        nanos = None  # no file needs the second read
    if nanos is None:
        read = micros
    else:
        # The schema of this read may have types PySpark cannot parse: columns are cast before anything asks.
        typed = reader.schema(ddl_of(schema, nanos=nanos))
        whole = nanos == "type" or nanosecond_files is None
        other = typed.parquet(path) if whole else typed.parquet(*nanosecond_files)  # type: ignore[call-arg, misc]
        other = other.withColumn(META, F.col("_metadata"))
        if nanos == "type":
            other = other.select(*in_microseconds(schema), F.col(META))
        else:
            other = _from_nanosecond_files(other, schema, every_file=nanosecond_files is None)
        read = micros.select(*[F.col(f"`{f.name}`") for f in schema.fields], F.col(META)).unionByName(other)
    if read.isStreaming and expected_columns(schema):
        read = read.withColumn(CHECKED_FILE, F.col(META)["file_path"])
    return read


def stream_reads_nanoseconds(spark: SparkSession, schema: StructType, path: str) -> bool:
    """Whether a stream of the folder reads nanosecond files, on a Spark that reads them as integers (each file
    read twice): when the folder holds one as the stream starts, or nothing yet (pandas writes nanoseconds). A
    folder of microsecond files alone is read once; a nanosecond file landing there later is set aside with the
    reason and the fix (features.engine.files.NANOS_LATE)."""
    stamps = timestamp_columns(schema)
    if not stamps or enable_nanosecond_read(spark) != "long":
        return True
    found = nanosecond_files(path, stamps)
    if found is None:
        return False  # a store the driver cannot list: neither can the workers open footers there
    return bool(found) or not any(Path(path).rglob("*.parquet"))


def _from_nanosecond_files(as_long: DataFrame, schema: StructType, every_file: bool) -> DataFrame:
    """The records of files with a nanosecond timestamp, from a read of every timestamp as its raw integer, each
    converted by the unit its file's footer gives and truncated to the microsecond (towards -inf). `every_file`:
    the read covers other files too (their microseconds read as integers as well, their records come from the
    microsecond read): only the records of files with a nanosecond timestamp are kept."""
    from pyspark.sql import functions as F

    stamps = set(timestamp_columns(schema))
    units = {name: timestamp_unit(name) for name in stamps}
    columns = [
        _to_micros(F.col(f"`{f.name}`"), units[f.name]).alias(f.name) if f.name in stamps else F.col(f"`{f.name}`")
        for f in schema.fields
    ]
    if every_file:
        nanosecond_file = F.lit(False)
        for unit in units.values():
            nanosecond_file = nanosecond_file | F.coalesce(unit == F.lit("ns"), F.lit(False))
        as_long = as_long.where(nanosecond_file)
    return as_long.select(*columns, F.col(META))


def _to_micros(raw: Column, unit: Column) -> Column:
    from pyspark.sql import functions as F

    micros = (
        F.when(unit == "ns", F.call_function("div", raw - F.pmod(raw, F.lit(1000)), F.lit(1000)))
        .when(unit == "us", raw)
        .when(unit == "ms", raw * F.lit(1000))
        .when(unit == "s", raw * F.lit(1_000_000))
    )
    return F.timestamp_micros(micros.cast("bigint"))


def check_columns(group: FeatureGroup, events: DataFrame) -> None:
    """Raise a SchemaError naming the field if the group reads a column the data lacks, or a bad `where`."""
    from pyspark.sql import functions as F

    group.check_schema(schema_of(events.schema))
    for feat in group.features:
        if feat.where is None:
            continue
        with _refused_where(
            feat, "use", "write a Spark SQL condition over the source's columns, e.g. \"status = 'FAILED'\""
        ):
            data_type = events.select(F.expr(feat.where).alias("w")).schema["w"].dataType
        if data_type.typeName() != "boolean":
            raise SchemaError(
                f"Feature({feat.name!r}).where",
                f"{feat.where!r} is a {data_type.simpleString()}, not a condition",
                'write an expression that is true or false, e.g. "amount > 100"',
            )


def check_where_values(group: FeatureGroup, events: DataFrame) -> None:
    """Evaluate each `where` on one row of plain values of the source's types: a condition that fails on any
    row whatever its values (a literal Spark cannot cast, `amount = 'x'` on a double column under ANSI casts)
    raises here, naming the feature, instead of failing every backfill and stream batch later."""
    from pyspark.sql import functions as F

    probe = events.sparkSession.createDataFrame([_plain_row(events.schema)], events.schema)
    fix = 'compare each column with a value of its type, e.g. "amount > 100" or "status = \'FAILED\'"'
    for feat in group.features:
        if feat.where is not None:
            with _refused_where(feat, "evaluate", fix):
                probe.where(F.expr(feat.where)).collect()


@contextmanager
def _refused_where(feat: Feature, verb: str, fix: str) -> Iterator[None]:
    """Spark's refusal of a feature's `where` as a SchemaError naming the feature, its first line the reason."""
    from pyspark.errors import PySparkException

    try:
        with quiet_spark_errors():
            yield
    except PySparkException as exc:
        reason = str(exc).strip().splitlines()[0]
        raise SchemaError(
            f"Feature({feat.name!r}).where", f"Spark cannot {verb} {feat.where!r}: {reason}", fix
        ) from None


def _plain_row(schema: StructType) -> tuple[object, ...]:
    """One non-null value of each column's type (non-null, since Spark skips the rest of a comparison with a
    null; 1, not 0, so that a division by the column is no false alarm)."""
    from decimal import Decimal

    plain = {
        "string": "",
        "boolean": False,
        "timestamp": datetime(2000, 1, 1, tzinfo=UTC),
        "timestamp_ntz": datetime(2000, 1, 1),
        "date": date(2000, 1, 1),
        "binary": b"",
        "decimal": Decimal(1),
        "array": [],
        "map": {},
    }
    values = []
    for field in schema.fields:
        name = field.dataType.typeName()
        if name in ("float", "double"):
            values.append(1.0)
        else:
            values.append(plain.get(name, None if name in ("struct", "null", "variant") else 1))
    return tuple(values)
