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

import functools
import os
import re
from collections.abc import Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from features.errors import ConfigError, DefinitionError, SchemaError
from features.spec import DType, FeatureGroup

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import Column, DataFrame, DataFrameReader, Observation, SparkSession
    from pyspark.sql.streaming import DataStreamReader
    from pyspark.sql.types import DataType, StructType

CORRUPT = "_corrupt_record"  # Spark's column for the text of a JSON line that does not match the schema
# Columns of a quarantined record, besides the source's own columns.
REASON = "reason"
SOURCE_FILE = "source_file"
RAW_RECORD = "raw_record"
# Reasons (the `reason` column starts with one of these; wrong_type and missing_key name the columns).
UNPARSEABLE = "unparseable_json"
WRONG_TYPE = "wrong_type"
MISSING_KEY = "missing_key"
MISSING_TIMESTAMP = "missing_timestamp"
FUTURE_TIMESTAMP = "future_timestamp"
INFINITE_VALUE = "infinite_value"
UNREADABLE_FILE = "unreadable_file"
NONCONFORMING_FILE = "nonconforming_file"
FILE_REASONS = (NONCONFORMING_FILE, UNREADABLE_FILE)  # reasons of a file set aside whole, one record per file
READ = "features_read"  # field metadata: the group reads this column, so each file must hold it, of a fitting type
MARK = "fx_reason"  # a record's reason while it is read (the source may have a column named `reason`)
META = "fx_meta"  # Spark's `_metadata` of each record (its file), carried through the union of the two reads
# Spark 4.3's nanosecond timestamps (a preview): with it, a Parquet TIMESTAMP(NANOS) column reads as
# timestamp_ltz(9) / timestamp_ntz(9), and a cast to timestamp truncates it to the microsecond (towards -inf).
NANOS_CONF = "spark.sql.timestampNanosTypes.enabled"

_SPARK_TYPES = {
    DType.INT64: "bigint",
    DType.FLOAT64: "double",
    DType.STRING: "string",
    DType.BOOL: "boolean",
    DType.TIMESTAMP: "timestamp",
}


def dtype_of_spark(data_type: DataType) -> DType | None:
    """The logical type of a Spark column, or None for types features cannot use."""
    from pyspark.sql import types as T

    if isinstance(data_type, T.ByteType | T.ShortType | T.IntegerType | T.LongType):
        return DType.INT64
    if isinstance(data_type, T.FloatType | T.DoubleType | T.DecimalType):
        return DType.FLOAT64
    if isinstance(data_type, T.StringType):
        return DType.STRING
    if isinstance(data_type, T.BooleanType):
        return DType.BOOL
    if isinstance(data_type, T.TimestampType | T.TimestampNTZType):
        return DType.TIMESTAMP
    return None


def schema_of(spark_schema: StructType) -> dict[str, DType]:
    return {f.name: t for f in spark_schema.fields if (t := dtype_of_spark(f.dataType)) is not None}


def spark_schema(columns: Mapping[str, DType], read: Collection[str] = ()) -> StructType:
    """A Spark schema of columns and their logical types, the columns in `read` marked as read (`READ`)."""
    from pyspark.sql import types as T

    schema = T.StructType.fromDDL(", ".join(f"`{c}` {_SPARK_TYPES[t]}" for c, t in columns.items()))
    return T.StructType(
        [T.StructField(f.name, f.dataType, f.nullable, {READ: True} if f.name in read else None) for f in schema]
    )


def group_schema(group: FeatureGroup, columns: Mapping[str, DType]) -> StructType:
    """The Spark schema a group reads its source with: `columns`, those the group reads marked (`READ`)."""
    return spark_schema(columns, read_columns(group, columns))


def declared_spark_schema(group: FeatureGroup) -> StructType | None:
    if group.source.schema is None:
        return None
    return group_schema(group, group.source.schema)


# Text a `where` holds that names no column: quoted strings. Left are the names, plain or in backquotes.
_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
_NAME = re.compile(r"`([^`]+)`|([A-Za-z_][A-Za-z0-9_]*)")


def read_columns(group: FeatureGroup, columns: Iterable[str]) -> list[str]:
    """The columns of `columns` the group reads: the timestamp, the join keys, the aggregated columns and the
    columns its `where`s name (matched as Spark matches them, ignoring case)."""
    by_name = {c.lower(): c for c in columns}
    wanted = [group.source.timestamp, *group.join_keys]
    wanted += [f.aggregation.column for f in group.features if f.aggregation.column is not None]
    for feat in group.features:
        if feat.where is not None:
            wanted += [quoted or plain for quoted, plain in _NAME.findall(_QUOTED.sub(" ", feat.where))]
    read: list[str] = []
    for name in wanted:
        column = by_name.get(name.lower())
        if column is not None and column not in read:
            read.append(column)
    return read


def expected_columns(schema: StructType | None) -> dict[str, DType]:
    """The columns of a read schema the group reads (marked `READ`), with their logical types."""
    if schema is None:
        return {}
    return {
        f.name: dtype
        for f in schema.fields
        if f.metadata.get(READ) and (dtype := dtype_of_spark(f.dataType)) is not None
    }


@dataclass(frozen=True)
class SetAsideFile:
    """A file set aside whole: its reason (`nonconforming_file: ...` or `unreadable_file: ...`) and how many
    events it holds (from its footer; 0 for a file that is not Parquet)."""

    file: str  # as Spark lists it (a URI)
    reason: str
    events: int

    @property
    def kind(self) -> str:
        return self.reason.split(":", 1)[0]


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
        return self._good(self.marked)

    def _good(self, marked: DataFrame) -> DataFrame:
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
        return self._good(read), observation


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
    checked = FileCheck(spark, schema)
    bad_files = unreadable_files(spark, raw, schema, checked) if group.source.format == "parquet" else []
    if bad_files:
        # Spark reads some files that do not conform (a missing column reads as nulls): none of a file set aside
        # is used. A filter on the file's path alone also spares Spark opening those files.
        spellings = [spelling for _, file in bad_files for spelling in _uri_spellings(file)]
        raw = raw.where(~F.col(META)["file_path"].isin(spellings))
    marked = raw.withColumn(MARK, _reason(group, raw, now))
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


def _uri_spellings(uri: str) -> list[str]:
    """A file's URI as Spark lists it (`file:///p`) and as its records' `_metadata.file_path` gives it
    (`file:/p`), both percent-encoded alike."""
    return [uri, "file:/" + uri.removeprefix("file:///")] if uri.startswith("file:///") else [uri]


def source_columns(raw: DataFrame) -> list[str]:
    """The source's own columns of a read (not Spark's corrupt-record text, nor the file metadata)."""
    return [c for c in raw.columns if c not in (CORRUPT, META)]


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


def _reason(group: FeatureGroup, raw: DataFrame, now: datetime | Column) -> Column:
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

    if CORRUPT in raw.columns:
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
    floats = _float_values(group, raw)
    if floats:
        any_infinite = F.lit(False)
        for c in floats:
            any_infinite = any_infinite | _is_infinite(F.col(c))
        infinite = [F.when(_is_infinite(F.col(c)), F.lit(c)) for c in floats]
        otherwise(any_infinite, named(INFINITE_VALUE, infinite))
    if group.source.max_future_s is not None:
        if isinstance(now, datetime):
            latest = F.timestamp_micros(F.lit(_future_us(group, now)))
        else:
            latest = now + F.make_dt_interval(secs=F.lit(group.source.max_future_s))
        otherwise(ts > latest, F.lit(FUTURE_TIMESTAMP))
    assert reason is not None
    return reason


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
    if source.format == "kafka":
        raise ConfigError(
            f"EventSource({source.name!r}).format: Kafka is a streaming source; backfill from the "
            "folder where the topic is archived (a parquet or json EventSource with the same schema)"
        )
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
        events = read_parquet(spark, spark.read, schema, path)
    check_columns(group, events)
    return events, schema


def parquet_schema(spark: SparkSession, group: FeatureGroup, path: str) -> StructType:
    """The schema a Parquet source is read with, the columns the group reads marked (`READ`): the declared
    one, else the one `features apply` recorded, else the files' own (all footers together, skipping files that
    are not Parquet: features.feast_objects.infer_parquet_schema; Spark's own inference for a URI the driver
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
    from features.feast_objects import infer_parquet

    columns = infer_parquet(path, f"EventSource({group.source.name!r})")
    if not columns:
        raise ConfigError(
            f"EventSource({group.source.name!r}).schema: no schema is declared and there are no Parquet files in "
            f"{path} to read it from. Fix: land the event files there, or declare schema={{column: type, ...}}"
        )
    return group_schema(group, columns)


def read_parquet(
    spark: SparkSession, reader: DataFrameReader | DataStreamReader, schema: StructType, path: str
) -> DataFrame:
    """A Parquet folder (batch or stream) read with `schema`: the union of a read with microsecond timestamps
    and one with nanosecond timestamps (cast to microseconds), each skipping the files it cannot read, so each
    file is read by the one that fits it. The records carry their file's metadata as `fx_meta`.

    A stream also leaves out the records of every file that does not conform to the columns `schema` marks as
    read (`nonconformity`), as each file lands: the batch read finds those files before it reads
    (`read_source`), and a stream learns of its files only as it reads them."""
    from pyspark.sql import functions as F

    reader = reader.option("recursiveFileLookup", "true").option("ignoreCorruptFiles", "true")
    micros = reader.schema(schema).parquet(path).withColumn(META, F.col("_metadata"))
    stamps = _timestamps(schema)
    if not stamps or not _nanos_enabled(spark):
        read = micros
    else:
        nanos_ddl = _ddl(schema, nanos=True)
        # The schema of this read has types PySpark cannot parse: columns are cast before anything asks for it.
        nanos = reader.schema(nanos_ddl).parquet(path).select(*_in_microseconds(schema), F.col("_metadata").alias(META))
        read = micros.select(*[F.col(f"`{f.name}`") for f in schema.fields], F.col(META)).unionByName(nanos)
    expected = expected_columns(schema)
    if read.isStreaming and expected:
        read = read.where(_conforms(expected))
    return read


def _conforms(expected: Mapping[str, DType]) -> Column:
    """Whether a record's file conforms to `expected` (`nonconformity`), decided once per file in each Python
    worker, from the file's footer. A file the worker cannot open (a remote store) is left to Spark's reader."""
    import pandas as pd
    from pyspark.sql import functions as F

    wanted = tuple((column, dtype.value) for column, dtype in expected.items())

    def conforms(files: pd.Series) -> pd.Series:
        verdicts = {file: _file_conforms(file, wanted) for file in files.unique()}
        return files.map(verdicts).astype(bool)

    # PySpark reads a pandas UDF's kind from its type hints: here objects, not this module's postponed strings.
    conforms.__annotations__ = {"files": pd.Series, "return": pd.Series}
    return F.pandas_udf(conforms, "boolean")(F.col(META)["file_path"])  # type: ignore[call-overload]


def _file_conforms(uri: str, wanted: tuple[tuple[str, str], ...]) -> bool:
    local = _local_path(uri)
    if local is None:
        return True
    stat = os.stat(local)
    return _conforms_cached(local, stat.st_size, stat.st_mtime_ns, wanted)


@functools.lru_cache(maxsize=4096)
def _conforms_cached(local: str, size: int, mtime_ns: int, wanted: tuple[tuple[str, str], ...]) -> bool:
    """A file's verdict, kept while its size and time stay (the key): files land once and are not rewritten."""
    footer = _arrow_schema(_footer(local))
    return footer is None or nonconformity(footer, {column: DType(t) for column, t in wanted}) is None


def _nanos_enabled(spark: SparkSession) -> bool:
    """Turn on Spark's nanosecond timestamps for this session, if this Spark has them (a setting the platform
    may refuse, e.g. a managed Connect session: then nanosecond files are set aside as unreadable, with why)."""
    from pyspark.errors import PySparkException

    try:
        spark.conf.set(NANOS_CONF, "true")
    except PySparkException:
        return False
    if not type(spark).__module__.startswith("pyspark.sql.connect"):
        # Classic Spark parses a reader's DDL schema with the settings of the session active in the calling
        # thread, and a session started in another thread (as the CLI does) is active only there:
        # createDataFrame makes it the active one in this thread too (PySpark's own doing; no JVM call here).
        spark.createDataFrame([], "x int")
    return True


def unreadable_files(
    spark: SparkSession, raw: DataFrame, schema: StructType | None, check: FileCheck | None = None
) -> list[tuple[str, str]]:
    """(reason, file) for each file of `raw`'s read that does not conform to `schema` or that Spark cannot read
    with it (see `FileCheck`, or `check`); where the driver cannot open the files (a remote URI), those absent
    from a read of every column."""
    files = sorted(raw.inputFiles())
    bad = (check or FileCheck(spark, schema)).unreadable(files)
    return bad if bad is not None else _unreadable_by_scan(spark, raw, schema, files)


class FileCheck:
    """Which Parquet files are set aside whole with a schema: those that do not conform to the columns it marks
    as read (`nonconformity`, from each footer), then those Spark cannot read. Spark decides on one file per
    physical layout: files are grouped by their footers' types of the read columns (a file whose footer does
    not parse is its own group), and one small read of a group's largest file stands for all of them. A layout
    found readable is remembered (the stream checks each new file as it lands)."""

    def __init__(self, spark: SparkSession, schema: StructType | None) -> None:
        from pyspark.sql import types as T

        self.spark, self.schema = spark, schema
        self.expected = expected_columns(schema)
        # Spark checks the columns the group reads (all of the schema's, where none is marked): a read of
        # the source prunes the others, so a file whose other columns do not fit is read all the same.
        self.checked = schema
        if schema is not None and self.expected:
            self.checked = T.StructType([f for f in schema.fields if f.name in self.expected])
        self.columns = [f.name for f in self.checked.fields] if self.checked is not None else []
        self.readable: set[tuple[str, ...]] = set()
        self.rows: dict[str, int] = {}  # file -> rows, from its footer, for each file checked

    def unreadable(self, files: list[str]) -> list[tuple[str, str]] | None:
        """(reason, file) for each file set aside; None if the driver cannot open some of them."""
        local = [_local_path(f) for f in files]
        if not all(local):
            return None
        layouts: dict[object, list[tuple[int, str]]] = {}
        bad = []
        for file, local_path in zip(files, local, strict=True):
            metadata = _footer(local_path)  # type: ignore[arg-type]
            rows = metadata.num_rows if metadata is not None else 0
            self.rows[file] = rows
            footer = _arrow_schema(metadata)
            misfit = nonconformity(footer, self.expected) if footer is not None and self.expected else None
            if misfit is not None:
                bad.append((misfit.reason(local_path), file))  # type: ignore[arg-type]
                continue
            layout = _layout(metadata, self.columns)
            if layout not in self.readable:
                layouts.setdefault(layout or file, []).append((-rows, file))
        for layout, group in layouts.items():
            # The file with the most rows: a file with no rows reads without error, whatever its columns' types.
            (most, first), *_ = sorted(group)
            reason = _why_unreadable(self.spark, self.checked, first)
            if reason is None:
                if most and isinstance(layout, tuple):
                    self.readable.add(layout)
                continue
            for _, file in sorted(group):  # Spark's reason names the file: each one's own
                why = reason if file == first else _why_unreadable(self.spark, self.checked, file)
                if why is not None:
                    bad.append((f"{UNREADABLE_FILE}: {why}", file))
        return bad


@dataclass(frozen=True)
class Misfit:
    """How a file does not conform to the columns a group reads: one column, missing or of a type that does
    not convert to the schema's without loss."""

    column: str
    want: DType
    found: str | None  # the file's Arrow type of the column; None when the file lacks it
    detail: str  # what is wrong, e.g. "column 'amount' missing (found columns: amt, event_ts, user_id)"

    def reason(self, file: str) -> str:
        """The reason of the file's quarantine record: the file, the column, the type found, and the fix."""
        if self.found is None:
            fix = f"write {self.column!r} ({self.want.value}) into the file, or move the file out of the source folder"
        else:
            fix = (
                f"rewrite the file with {self.column!r} as {self.want.value}, or move it out of the source folder "
                f"(if {self.want.value} is not the type you mean, declare schema= on the EventSource)"
            )
        return f"{NONCONFORMING_FILE}: {file}: {self.detail}; fix: {fix}, then backfill its days again with --force"


def nonconformity(footer: pa.Schema, expected: Mapping[str, DType]) -> Misfit | None:
    """How a file's columns do not fit the columns a group reads (`expected`), or None when they do: the first
    such column missing (matched as Spark matches names, ignoring case), else the first whose type does not
    convert to the expected one without loss (features.feast_objects.conversion_problem). Other columns, and
    extra ones, are fine."""
    from features.feast_objects import conversion_problem

    by_name = {name.lower(): name for name in footer.names}
    for column, want in expected.items():
        name = by_name.get(column.lower())
        if name is None:
            found = sorted(footer.names)
            listed = ", ".join(found[:12]) + (f" and {len(found) - 12} more" if len(found) > 12 else "")
            return Misfit(column, want, None, f"column {column!r} missing (found columns: {listed or 'none'})")
        found_type = footer.field(name).type
        problem = conversion_problem(found_type, want)
        if problem is not None:
            detail = f"column {column!r} is {found_type} where the source schema has {want.value} ({problem})"
            return Misfit(column, want, str(found_type), detail)
    return None


def file_days(file: str, timestamp: str) -> dict[date, int] | None:
    """How many of a Parquet file's events are stamped on each UTC day, from its timestamp column (a naive
    time taken as UTC); None when the driver cannot open the file or it has no such timestamp column."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    local = _local_path(file)
    footer = _arrow_schema(_footer(local)) if local is not None else None
    if footer is None:
        return None
    name = {n.lower(): n for n in footer.names}.get(timestamp.lower())
    if name is None or not pa.types.is_timestamp(footer.field(name).type):
        return None
    stamps = pq.read_table(local, columns=[name]).column(name).drop_null()
    per_day = {"s": 86_400, "ms": 86_400_000, "us": 86_400_000_000, "ns": 86_400_000_000_000}[stamps.type.unit]
    days, counts = np.unique(np.floor_divide(stamps.cast(pa.int64()).to_numpy(), per_day), return_counts=True)
    epoch = date(1970, 1, 1)
    return {epoch + timedelta(days=int(d)): int(n) for d, n in zip(days, counts, strict=True)}


def _local_path(uri: str) -> str | None:
    """The driver's path of a `file:` URI (as Spark lists files) that the driver sees, else None (a remote
    store, or a Spark Connect server's own disk)."""
    from urllib.parse import unquote, urlparse

    parsed = urlparse(uri)
    path = unquote(parsed.path)
    return path if parsed.scheme in ("file", "") and Path(path).is_file() else None


def _footer(file: str) -> pq.FileMetaData | None:
    """A Parquet file's footer, or None if pyarrow cannot read one (a file that is not Parquet)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(file).metadata
    except (pa.ArrowException, OSError):
        return None


def _arrow_schema(metadata: pq.FileMetaData | None) -> pa.Schema | None:
    """A footer's columns as Arrow types (pandas' and pyarrow's own types where the file keeps them)."""
    import pyarrow as pa

    if metadata is None:
        return None
    try:
        return metadata.schema.to_arrow_schema()
    except (pa.ArrowException, OSError):
        return None


def _layout(metadata: pq.FileMetaData | None, columns: list[str]) -> tuple[str, ...] | None:
    """The physical and logical types of `columns` in a Parquet file's footer (None without a footer)."""
    if metadata is None:
        return None
    footer, wanted = metadata.schema, set(columns)
    return tuple(
        f"{c.path}:{c.physical_type}:{c.logical_type}:{c.max_definition_level}"
        for c in (footer.column(i) for i in range(len(footer)))
        if c.path.split(".")[0] in wanted
    )


def _unreadable_by_scan(
    spark: SparkSession, raw: DataFrame, schema: StructType | None, files: list[str]
) -> list[tuple[str, str]]:
    """`unreadable_files` where the driver cannot open the files: those absent from the records of a read of
    every column (a file whose column has the wrong type fails only when that column is read), except the
    ones that read without error (files with no rows)."""
    from pyspark.sql import functions as F

    every_column = F.hash(*[F.col(f"`{c}`") for c in source_columns(raw)])
    per_file = raw.groupBy(F.col(META)["file_path"].alias("path")).agg(F.max(every_column).alias("h"))
    seen = {row["path"] for row in per_file.collect()}
    bad = []
    for file in (f for f in files if f not in seen):
        reason = _why_unreadable(spark, schema, file)
        if reason is not None:
            bad.append((f"{UNREADABLE_FILE}: {reason}", file))
    return bad


def _why_unreadable(spark: SparkSession, schema: StructType | None, file: str) -> str | None:
    """Why Spark cannot read one Parquet file with `schema` (None if it can, e.g. a file with no rows)."""
    reasons = []
    every = _in_microseconds(schema) if schema is not None else []  # PySpark cannot parse the nanosecond type
    for ddl in _read_types(spark, schema):
        try:
            with quiet_spark_errors():
                spark.read.schema(ddl).parquet(file).select(*every).limit(1).collect()
            return None
        except Exception as exc:  # the reason is kept: classic PySpark raises py4j's error, no PySparkException
            reasons.append(spark_reason(exc))
    return reasons[0]


def _read_types(spark: SparkSession, schema: StructType | None) -> list[str]:
    """The schemas (DDL) the two reads of `read_parquet` use."""
    if schema is None:
        return []
    if not _timestamps(schema) or spark.conf.get(NANOS_CONF, "false") != "true":
        return [_ddl(schema, nanos=False)]
    return [_ddl(schema, nanos=False), _ddl(schema, nanos=True)]


def _in_microseconds(schema: StructType) -> list[Column]:
    """Every column of `schema`, its timestamps (of any unit) cast to Spark's microsecond timestamp."""
    from pyspark.sql import functions as F

    stamps = set(_timestamps(schema))
    return [
        F.col(f"`{f.name}`").cast("timestamp").alias(f.name) if f.name in stamps else F.col(f"`{f.name}`")
        for f in schema.fields
    ]


def _timestamps(schema: StructType) -> list[str]:
    from pyspark.sql import types as T

    return [f.name for f in schema.fields if isinstance(f.dataType, T.TimestampType | T.TimestampNTZType)]


def _ddl(schema: StructType, *, nanos: bool) -> str:
    """`schema` as DDL; with `nanos`, its timestamps as Spark's nanosecond type."""
    stamps = set(_timestamps(schema)) if nanos else set()
    return ", ".join(
        f"`{f.name}` {'timestamp_ltz(9)' if f.name in stamps else f.dataType.simpleString()}" for f in schema.fields
    )


def check_columns(group: FeatureGroup, events: DataFrame) -> None:
    """Raise a SchemaError naming the field if the group reads a column the data lacks, or a bad `where`."""
    from pyspark.errors import PySparkException
    from pyspark.sql import functions as F

    group.check_schema(schema_of(events.schema))
    for feat in group.features:
        if feat.where is None:
            continue
        try:
            with quiet_spark_errors():
                data_type = events.select(F.expr(feat.where).alias("w")).schema["w"].dataType
        except PySparkException as exc:
            reason = str(exc).strip().splitlines()[0]
            raise SchemaError(
                f"Feature({feat.name!r}).where",
                f"Spark cannot use {feat.where!r}: {reason}",
                "write a Spark SQL condition over the source's columns, e.g. \"status = 'FAILED'\"",
            ) from None
        if data_type.typeName() != "boolean":
            raise SchemaError(
                f"Feature({feat.name!r}).where",
                f"{feat.where!r} is a {data_type.simpleString()}, not a condition",
                'write an expression that is true or false, e.g. "amount > 100"',
            )


# PySpark logs every error that has a query context as it is raised: an 8 KB JSON line with the Java trace
# on stderr, ahead of the one-line message the package gives for the errors it expects.
_QUERY_CONTEXT_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")


@contextmanager
def quiet_spark_errors() -> Iterator[None]:
    """PySpark's own logging of an error off, where the error is expected and reported in one line."""
    from pyspark.logger import PySparkLogger

    # PySparkLogger's own getLogger: a plain logging.getLogger would create these loggers as plain Loggers,
    # which reject the keyword arguments PySpark passes them later (errorClass=...), turning every later
    # Spark error with a query context into a TypeError.
    loggers = [PySparkLogger.getLogger(name) for name in _QUERY_CONTEXT_LOGGERS]
    before = [logger.disabled for logger in loggers]
    for logger in loggers:
        logger.disabled = True
    try:
        yield
    finally:
        for logger, disabled in zip(loggers, before, strict=True):
            logger.disabled = disabled


def spark_reason(exc: BaseException) -> str:
    """Spark's reason for an error in one line: the innermost `Caused by:` of a Java trace (the real reason
    a file failed, e.g. "... is not a Parquet file"), else the first line of the message."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    causes = [line.removeprefix("Caused by: ") for line in lines if line.startswith("Caused by: ")]
    text = causes[-1] if causes else next((line for line in lines if not line.startswith("An error occurred")), "")
    head, _, rest = text.partition(": ")
    if rest and " " not in head and "." in head:
        text = rest  # the Java exception's class name
    return text[:300] or type(exc).__name__
