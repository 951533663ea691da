"""The schema side of reading a source: the logical types of Spark columns, the Spark schema a group reads its
source with (the columns it reads marked in the field metadata, `READ`), the columns and reasons of quarantined
records, and Spark's errors in one line. Shared by the source reads (features.engine.source) and the file checks
(features.engine.files)."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

from features.spec import DType, FeatureGroup

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType


CORRUPT = "_corrupt_record"  # Spark's column for the text of a JSON line that does not match the schema
# Columns of a quarantined record, besides the source's own columns.
REASON = "reason"
SOURCE_FILE = "source_file"
RAW_RECORD = "raw_record"
# Reasons (the `reason` column starts with one of these; wrong_type and missing_key name the columns).
UNPARSEABLE = "unparseable_json"
UNPARSEABLE_AVRO = "unparseable_avro"  # a Kafka value that does not decode as the topic's Avro schema
WRONG_TYPE = "wrong_type"
MISSING_KEY = "missing_key"
MISSING_TIMESTAMP = "missing_timestamp"
FUTURE_TIMESTAMP = "future_timestamp"
PAST_TIMESTAMP = "past_timestamp"  # before the source's `min_timestamp`
INFINITE_VALUE = "infinite_value"
UNREADABLE_FILE = "unreadable_file"
NONCONFORMING_FILE = "nonconforming_file"
FILE_REASONS = (NONCONFORMING_FILE, UNREADABLE_FILE)  # reasons of a file set aside whole, one record per file
READ = "features_read"  # field metadata: the group reads this column, so each file must hold it, of a fitting type
MARK = "fx_reason"  # a record's reason while it is read (the source may have a column named `reason`)
META = "fx_meta"  # Spark's `_metadata` of each record (its file), carried through the union of the two reads
LANDED = "fx_landed"  # when an event's file landed (Kafka: the record's timestamp), µs
FILE = "fx_file"  # the file an event was read from (Kafka: kafka:<topic>/<partition>/<offset>), kept with a bad record
# The file whose conformity a stream decides for a record (features.engine.files.Conformity): its path for a record of
# Spark's Parquet read, null for the others (those of `null_rows`, which checks its files itself)
CHECKED_FILE = "fx_checked_file"
# Spark 4.3's nanosecond timestamps (a preview): with it, a Parquet TIMESTAMP(NANOS) column reads as
# timestamp_ltz(9) / timestamp_ntz(9), and a cast to timestamp truncates it to the microsecond (towards -inf).
NANOS_CONF = "spark.sql.timestampNanosTypes.enabled"
NANOS_SPARK = (4, 3)  # the first Spark with those types
# Before them: a TIMESTAMP(NANOS) column reads as its raw integer (and so does any INT64 timestamp read as
# bigint, whatever its unit: the file's footer tells which it is).
NANOS_AS_LONG_CONF = "spark.sql.legacy.parquet.nanosAsLong"


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


def source_columns(raw: DataFrame) -> list[str]:
    """The source's own columns of a read (not Spark's corrupt-record text, nor the file metadata)."""
    return [c for c in raw.columns if c not in (CORRUPT, META)]


def read_types(spark: SparkSession, schema: StructType | None) -> list[str]:
    """The schemas (DDL) the reads of `read_parquet` use: microsecond timestamps, then the nanosecond read's."""
    if schema is None:
        return []
    nanos = nanosecond_read(spark) if timestamp_columns(schema) else None
    if nanos is None:
        return [ddl_of(schema)]
    return [ddl_of(schema), ddl_of(schema, nanos=nanos)]


def nanosecond_read(spark: SparkSession) -> str | None:
    """How this session reads a Parquet TIMESTAMP(NANOS) column, as `ddl_of(nanos=...)` names it: "type"
    (Spark's nanosecond type), "long" (its raw integer), or None: not at all (such files are set aside as
    unreadable, with Spark's reason). `enable_nanosecond_read` turns the session's way on."""
    setting = _nanos_setting(spark)
    if spark.conf.get(setting, "false") != "true":
        return None
    return "type" if setting == NANOS_CONF else "long"


def enable_nanosecond_read(spark: SparkSession) -> str | None:
    """Turn on this Spark's way to read nanosecond timestamps (`nanosecond_read`), unless the platform refuses
    the setting (a managed Connect session may)."""
    from pyspark.errors import PySparkException

    setting = _nanos_setting(spark)
    try:
        if spark.conf.get(setting, "false") != "true":
            spark.conf.set(setting, "true")
    except PySparkException:
        return None
    return nanosecond_read(spark)


def _nanos_setting(spark: SparkSession) -> str:
    """The setting by which this session's Spark reads nanosecond timestamps (see `nanosecond_read`)."""
    from features.engine.runtime import parse_version

    return NANOS_CONF if (parse_version(spark.version) or (0, 0)) >= NANOS_SPARK else NANOS_AS_LONG_CONF


def in_microseconds(schema: StructType) -> list[Column]:
    """Every column of `schema`, its timestamps (of any unit) cast to Spark's microsecond timestamp."""
    from pyspark.sql import functions as F

    stamps = set(timestamp_columns(schema))
    return [
        F.col(f"`{f.name}`").cast("timestamp").alias(f.name) if f.name in stamps else F.col(f"`{f.name}`")
        for f in schema.fields
    ]


def timestamp_columns(schema: StructType) -> list[str]:
    from pyspark.sql import types as T

    return [f.name for f in schema.fields if isinstance(f.dataType, T.TimestampType | T.TimestampNTZType)]


def ddl_of(schema: StructType, *, nanos: str | None = None) -> str:
    """`schema` as DDL; with `nanos`, its timestamps as Spark's nanosecond type ("type") or as integers ("long")."""
    stamps = set(timestamp_columns(schema)) if nanos else set()
    stamp_type = "timestamp_ltz(9)" if nanos == "type" else "bigint"
    return ", ".join(
        f"`{f.name}` {stamp_type if f.name in stamps else f.dataType.simpleString()}" for f in schema.fields
    )


# PySpark logs every error that has a query context as it is raised: an 8 KB JSON line with the Java trace
# on stderr, ahead of the one-line message the package gives for the errors it expects.
_QUERY_CONTEXT_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")


@contextmanager
def quiet_spark_errors() -> Iterator[None]:
    """PySpark's own logging of an error off, where the error is expected and reported in one line (on, with
    its trace, at Python's DEBUG level)."""
    from pyspark.logger import PySparkLogger

    from features.engine.session import debugging

    if debugging():
        yield
        return

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


# What a Spark job raises when it was stopped rather than failed: a query being stopped interrupts its thread, and
# a session stopping or a cancel ends its jobs. Such an error says nothing about the data the job read. (Java's
# class names and Spark's own wording, so that a file whose name holds "cancelled" is not taken for one.)
_STOPPED = re.compile(
    r"java\.lang\.InterruptedException|java\.nio\.channels\.ClosedByInterruptException"
    r"|java\.io\.InterruptedIOException|\b(Job|Stage) \d+ cancelled\b|SparkContext (was|has been) shut ?down"
)


def interrupted(exc: BaseException) -> bool:
    """Whether a Spark error means the job was stopped (interrupted, cancelled, the session shut down), not
    that what it read is bad: callers deciding about the data re-raise it."""
    return _STOPPED.search(str(exc)) is not None


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
