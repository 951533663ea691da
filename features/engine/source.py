"""Reading an EventSource into Spark, with its schema checked against the definitions, and bad records set
aside with the reason each one cannot be used.

A record is bad when it cannot be parsed (JSON that is malformed or not an object), a value does not have the
declared type, a join key or the timestamp is missing, or the timestamp is more than the source's `max_future`
after the current time. The engines only ever see the good records; the bad ones go to a quarantine folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from features.errors import ConfigError, DefinitionError, SchemaError
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
WRONG_TYPE = "wrong_type"
MISSING_KEY = "missing_key"
MISSING_TIMESTAMP = "missing_timestamp"
FUTURE_TIMESTAMP = "future_timestamp"

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


def declared_spark_schema(group: FeatureGroup) -> StructType | None:
    from pyspark.sql import types as T

    if group.source.schema is None:
        return None
    return T.StructType.fromDDL(", ".join(f"`{c}` {_SPARK_TYPES[t]}" for c, t in group.source.schema.items()))


@dataclass(frozen=True)
class SourceRead:
    """A source split into the records the engines use and the ones set aside."""

    events: DataFrame  # good records: the source's columns
    rejected: DataFrame  # bad records: reason, source_file, raw_record (JSON only), then the source's columns
    now: datetime  # the current time the `max_future` check used
    timestamp: str  # the timestamp column

    def rejected_for(self, lower_us: int | None, end_us: int) -> DataFrame:
        """The bad records a read of [lower, end) would have used: those stamped in that range, and those
        without a usable time (no timestamp, unparseable, or beyond `max_future`), which any read may hold."""
        from pyspark.sql import functions as F

        ts = F.col(self.timestamp).cast("timestamp")
        in_range = ts < F.timestamp_micros(F.lit(end_us))
        if lower_us is not None:
            in_range = in_range & (ts >= F.timestamp_micros(F.lit(lower_us)))
        timeless = ts.isNull() | (F.col(REASON) == F.lit(FUTURE_TIMESTAMP))
        return self.rejected.where(timeless | in_range)


def quarantine_records(rejected: DataFrame, folder: str | Path) -> dict[str, int]:
    """Write bad records (a `SourceRead.rejected` frame) as Parquet into `folder`, which must not exist yet;
    returns how many there were per reason. Nothing is written when there are none."""
    from pyspark.sql import functions as F

    counts = {
        str(row[REASON]): int(row["n"]) for row in rejected.groupBy(REASON).agg(F.count(F.lit(1)).alias("n")).collect()
    }
    if counts:
        rejected.write.parquet(str(folder))
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def read_events(spark: SparkSession, group: FeatureGroup, path: str, *, now: datetime | None = None) -> DataFrame:
    """The source's good records as a DataFrame whose columns the group's definitions can use."""
    return read_source(spark, group, path, now=now).events


def read_source(spark: SparkSession, group: FeatureGroup, path: str, *, now: datetime | None = None) -> SourceRead:
    """The source's records, split into good ones and bad ones with their reason (see the module docstring).

    Nothing is read yet: both are lazy DataFrames over the same files."""
    from pyspark.sql import functions as F

    raw = _load(spark, group, path)
    columns = [c for c in raw.columns if c != CORRUPT]
    now = (now or datetime.now(UTC)).astimezone(UTC)
    reason = _reason(group, raw, now)
    events = raw.where(reason.isNull()).select(*columns)
    extra = [F.col("_metadata.file_path").alias(SOURCE_FILE)]
    if CORRUPT in raw.columns:
        extra.append(F.col(CORRUPT).alias(RAW_RECORD))
    rejected = raw.select(reason.alias(REASON), *extra, *columns).where(F.col(REASON).isNotNull())
    return SourceRead(events, rejected, now, group.source.timestamp)


def _reason(group: FeatureGroup, raw: DataFrame, now: datetime) -> Column:
    """Why a record cannot be used, or null for a good record. The first reason that applies wins."""
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
    if source.max_future_s is not None:
        latest = now + timedelta(seconds=source.max_future_s)
        latest_us = int(latest.timestamp()) * 1_000_000 + latest.microsecond
        otherwise(ts > F.timestamp_micros(F.lit(latest_us)), F.lit(FUTURE_TIMESTAMP))
    assert reason is not None
    return reason


def _load(spark: SparkSession, group: FeatureGroup, path: str) -> DataFrame:
    """Every record of the source, with `_corrupt_record` for JSON; the group's columns checked."""
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
    from pyspark.sql import types as T

    declared = declared_spark_schema(group)
    reader = spark.read.option("recursiveFileLookup", "true")
    if source.format == "json":
        if declared is None:
            raise DefinitionError(
                f"EventSource({source.name!r}).schema",
                "JSON sources need a declared schema",
                'add schema={"column": "type", ...} to the EventSource',
            )
        with_corrupt = T.StructType([*declared.fields, T.StructField(CORRUPT, T.StringType())])
        events = reader.schema(with_corrupt).option("mode", "PERMISSIVE").json(path)
    else:
        events = reader.parquet(path)
    check_columns(group, events)
    return events


def check_columns(group: FeatureGroup, events: DataFrame) -> None:
    """Raise a SchemaError naming the field if the group reads a column the data lacks, or a bad `where`."""
    from pyspark.errors import PySparkException
    from pyspark.sql import functions as F

    group.check_schema(schema_of(events.schema))
    for feat in group.features:
        if feat.where is None:
            continue
        try:
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
