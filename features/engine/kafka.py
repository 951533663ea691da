"""Kafka sources of the stream (features.engine.stream): a topic read through Spark's connector into the
columns a landing folder's read has, and the archive of what was read.

Spark keeps each micro-batch's offsets in the query's checkpoint, so a restart reads on from the end of the last
committed batch; what is exactly once here is Spark's (docs/streaming.md, Kafka)."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from features.engine.schema import CORRUPT, FILE, LANDED, declared_spark_schema
from features.errors import EnvironmentProblem
from features.spec import FeatureGroup

KAFKA_PACKAGE = "org.apache.spark:spark-sql-kafka-0-10_2.13:{version}"
ARCHIVE_DATE = "date"  # the partition column of a Kafka source's archive
# Larger fetches than the Kafka consumer's defaults (1 MB per partition, 50 MB in all): a micro-batch reads many
# MB per partition, and fewer round trips took 14% off reading 5M records locally. `options=` overrides them.
FETCH = {
    "kafka.max.partition.fetch.bytes": str(16 * 1024 * 1024),
    "kafka.fetch.max.bytes": str(64 * 1024 * 1024),
    "kafka.receive.buffer.bytes": str(4 * 1024 * 1024),
}


def read_kafka(spark: SparkSession, group: FeatureGroup) -> DataFrame:
    """The group's Kafka topic through Spark's connector, with the columns a file read has: each value parsed as
    JSON with the source's schema (a value that does not parse keeps its text, and is set aside as a bad record),
    the event time from the value or the record (`KafkaTopic.event_time`), and in place of a file's name the
    record's `kafka:<topic>/<partition>/<offset>`, which a bad record keeps."""
    from pyspark.sql import types as T

    source = group.source
    topic = source.kafka
    declared = declared_spark_schema(group)
    if topic is None or declared is None:
        raise AssertionError("EventSource checks that a Kafka source has a topic and a declared schema")
    options = {**FETCH, "kafka.bootstrap.servers": topic.bootstrap_servers, "subscribe": topic.topic, **topic.options}
    try:
        raw = spark.readStream.format("kafka").options(**options).load()
    except Exception as exc:
        text = str(exc).lower()
        if "kafka" in text and ("not found" in text or "find data source" in text):
            package = KAFKA_PACKAGE.format(version=spark.version)
            raise EnvironmentProblem(
                f"EventSource({source.name!r}).kafka: Spark's Kafka connector is not on the classpath. Fix: start "
                f"Spark with --packages {package} (or set spark.jars.packages to it); a local session started by "
                "features has it"
            ) from None
        raise
    with_corrupt = T.StructType([*declared.fields, T.StructField(CORRUPT, T.StringType())])
    value = F.col("value").cast("string")
    parsed = F.from_json(value, with_corrupt, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT})
    origin = F.format_string("kafka:%s/%d/%d", F.col("topic"), F.col("partition"), F.col("offset"))
    # Parsed once, in a projection of its own: the fields below read the struct (Spark does not inline an
    # expensive expression into each of its uses).
    records = raw.select(
        parsed.alias("r"), value.alias("fx_value"), F.col("timestamp").alias("fx_time"), origin.alias(FILE)
    )
    # A value that is not a JSON object at all parses to null, not to a corrupt record: its text is kept all the same.
    corrupt = F.when(F.col("r").isNull(), F.coalesce(F.col("fx_value"), F.lit(""))).otherwise(F.col(f"r.{CORRUPT}"))
    columns = [
        F.col("fx_time").alias(f.name)
        if topic.event_time == "record" and f.name == source.timestamp
        else F.col(f"r.`{f.name}`").alias(f.name)
        for f in declared.fields
    ]
    landed = F.unix_micros(F.col("fx_time"))
    return records.select(*columns, corrupt.alias(CORRUPT), landed.alias(LANDED), F.col(FILE))


def archive_rows(group: FeatureGroup, events: DataFrame) -> DataFrame:
    """What the archive of a Kafka source keeps of `read_kafka`'s records: every record whose value parsed, with
    the source's columns as read, and the UTC date of its event time (the archive's partition)."""
    kept = [c for c in events.columns if c not in (CORRUPT, LANDED, FILE)]
    day = F.to_date(F.col(group.source.timestamp).cast("timestamp")).alias(ARCHIVE_DATE)
    return events.where(F.col(CORRUPT).isNull()).select(*kept, day)
