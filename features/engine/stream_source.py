"""A group's source read as a stream: its schema, the reads a new checkpoint starts with, and the streaming
DataFrame of its events that the stream's query (features.engine.stream_query) projects for the stateful
operator (features.engine.stream_operator). The batch reads the same files with features.engine.source."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from features.engine.files import null_rows
from features.engine.kafka import read_kafka
from features.engine.schema import CORRUPT, FILE, LANDED, META
from features.engine.source import check_columns, parquet_schema, read_parquet, stream_reads_nanoseconds
from features.engine.source_log import FILE_AGE
from features.errors import ConfigError, DefinitionError
from features.spec import FeatureGroup

if TYPE_CHECKING:
    from pyspark.sql.streaming import DataStreamReader
    from pyspark.sql.types import StructType

BINARY_FILE = "path string, modificationTime timestamp, length bigint, content binary"  # Spark's binaryFile source
# Whether a new checkpoint's stream reads the Parquet files holding a column as Arrow's null type (`read_stream`);
# a checkpoint saved before it could has no such source. bench/stream_nulls.py turns it off for its baseline.
NULLS_READ = True


@dataclass(frozen=True)
class StreamSource:
    """Where a group's stream reads (its landing folder, or a Kafka source's archive folder) and the schema it
    reads with: resolved once as the stream starts, and handed to every part that reads the source."""

    path: str
    schema: StructType


def resolve(spark: SparkSession, group: FeatureGroup, path: str) -> StreamSource:
    """The stream's source at `path`, its schema the declared one, else the one of the Parquet files landed."""
    return StreamSource(path, _schema(spark, group, path))


def _schema(spark: SparkSession, group: FeatureGroup, path: str) -> StructType:
    source = group.source
    if source.schema is None and source.format != "parquet":
        raise DefinitionError(
            f"EventSource({source.name!r}).schema",
            f"a {source.format} stream needs a declared schema",
            'add schema={"column": "type", ...} to the EventSource',
        )
    if source.schema is None and "://" not in path and not any(Path(path).rglob("*.parquet")):
        raise ConfigError(
            f"EventSource({source.name!r}).path: no Parquet files in {path} to take the stream's schema from; "
            'land a first file there, or declare schema={"column": "type", ...} on the EventSource'
        )
    return parquet_schema(spark, group, path)  # a declared schema whatever the source's format, else the files'


def reads_nanoseconds(spark: SparkSession, group: FeatureGroup, source: StreamSource) -> bool:
    """Whether the group's stream reads nanosecond Parquet files (features.engine.source.stream_reads_nanoseconds;
    fixed when the stream starts: its read and its check of landed files must agree)."""
    if group.source.kafka is not None or group.source.format != "parquet":
        return True
    return stream_reads_nanoseconds(spark, source.schema, source.path)


def read_stream(
    spark: SparkSession,
    group: FeatureGroup,
    source: StreamSource,
    max_files: int | None,
    nanoseconds: bool = True,
    nulls: bool = True,
) -> DataFrame:
    """The group's source as a streaming DataFrame with the source's columns (plus `_corrupt_record` for JSON).

    Parquet files are read as the batch reads them (features.engine.source.read_parquet): microsecond and
    nanosecond timestamps both, and a file that cannot be read is skipped instead of failing the stream. With
    `nulls`, the files holding a column as Arrow's null type are read apart, as the batch reads them
    (features.engine.files.null_rows), from a listing of the folder of its own: a source more in the query, so the
    choice is made when a checkpoint starts (`NULLS_READ`) and kept with it."""
    from pyspark.sql import types as T

    if group.source.kafka is not None:
        return read_kafka(spark, group, source.schema)
    path, schema = source.path, source.schema
    if group.source.format == "json":
        with_corrupt = T.StructType([*schema.fields, T.StructField(CORRUPT, T.StringType())])
        reader = _landed_files(spark, max_files).schema(with_corrupt).option("mode", "PERMISSIVE")
        events = reader.json(path).withColumn(META, F.col("_metadata"))
    else:
        reader = _landed_files(spark, max_files)
        events = read_parquet(spark, reader, schema, path, None if nanoseconds else [])
        if nulls:
            # Both sources list the folder alike, each file in the same micro-batch (barring a file that lands
            # between their listings, which the later batch then reads); each file's records come from one.
            listing = _landed_files(spark, max_files).format("binaryFile").schema(BINARY_FILE).load(path)
            apart = null_rows(listing, schema, events.schema[META].dataType)
            events = events.unionByName(apart, allowMissingColumns=True)  # `apart`'s files need no CHECKED_FILE
    check_columns(group, events)
    landed = F.unix_micros(F.col(META)["file_modification_time"])
    return events.withColumn(LANDED, landed).withColumn(FILE, F.col(META)["file_path"]).drop(META)


def _landed_files(spark: SparkSession, max_files: int | None) -> DataStreamReader:
    """A file source's reader of the landing folder, as every source of a stream's query reads it."""
    # maxFileAge is Spark's default, set here because the log's pruning relies on it (features.engine.source_log).
    reader = spark.readStream.option("recursiveFileLookup", "true").option("maxFileAge", FILE_AGE)
    return reader.option("maxFilesPerTrigger", max_files) if max_files else reader
