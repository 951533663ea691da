"""Reading an EventSource into Spark, with its schema checked against the definitions."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from features.errors import ConfigError, DefinitionError, SchemaError
from features.spec import DType, FeatureGroup

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType

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


def read_events(spark: SparkSession, group: FeatureGroup, path: str) -> DataFrame:
    """The source's events as a DataFrame whose columns the group's definitions can use."""
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
    declared = declared_spark_schema(group)
    reader = spark.read.option("recursiveFileLookup", "true")
    if source.format == "json":
        if declared is None:
            raise DefinitionError(
                f"EventSource({source.name!r}).schema",
                "JSON sources need a declared schema",
                'add schema={"column": "type", ...} to the EventSource',
            )
        events = reader.schema(declared).option("mode", "PERMISSIVE").json(path)
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
