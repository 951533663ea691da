"""Kafka sources of the stream (features.engine.stream_source): a topic read through Spark's connector into the
columns a landing folder's read has, and the archive of what was read.

Spark keeps each micro-batch's offsets in the query's checkpoint, so a restart reads on from the end of the last
committed batch; what is exactly once here is Spark's (docs/streaming.md, Kafka)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from features.engine.schema import CORRUPT, FILE, LANDED, UNPARSEABLE_AVRO
from features.engine.session import cores
from features.errors import EnvironmentProblem
from features.spec import FeatureGroup, KafkaTopic
from features.spec.avro import null_indexes
from features.spec.definitions import AVRO_FORMATS

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery
    from pyspark.sql.types import StructType

KAFKA_PACKAGE = "org.apache.spark:spark-sql-kafka-0-10_2.13:{version}"
AVRO_PACKAGE = "org.apache.spark:spark-avro_2.13:{version}"
CONFLUENT_HEADER = 5  # Confluent's wire format: magic byte 0, then the schema id (4 bytes), then the Avro body
UNDECODED = f"{UNPARSEABLE_AVRO}: the value does not decode as an Avro record of KafkaTopic.schema"
ARCHIVE_DATE = "date"  # the partition column of a Kafka source's archive
# Larger fetches than the Kafka consumer's defaults (1 MB per partition, 50 MB in all): a micro-batch reads many
# MB per partition, and fewer round trips took 14% off reading 5M records locally. `options=` overrides them.
FETCH = {
    "kafka.max.partition.fetch.bytes": str(16 * 1024 * 1024),
    "kafka.fetch.max.bytes": str(64 * 1024 * 1024),
    "kafka.receive.buffer.bytes": str(4 * 1024 * 1024),
}
# Not raised: `kafka.max.poll.records` (500). At 10,000 a 500k-record batch read 1.2x faster, but a live stream at
# 10,000 events a second then took 2.5 s a batch instead of 1 s (bench/freshness.py --rate 10000: p99 12.6 s
# against 4.5 s).


EARLIEST = -2  # in Spark's Kafka offsets options: a partition's earliest offset


@dataclass(frozen=True)
class OffsetRange:
    """A stretch of a topic: per partition, the first offset in it and the offset after its last (a partition
    missing from `start` is read from its earliest record)."""

    topic: str
    start: dict[int, int]
    end: dict[int, int]

    def options(self) -> dict[str, str]:
        """A batch read of exactly this stretch. Records that retention has deleted are skipped instead of failing
        the read (`failOnDataLoss`): whoever reads it checks what is missing."""
        start = {p: self.start.get(p, EARLIEST) for p in self.end}
        return {
            "startingOffsets": offsets_json(self.topic, start),
            "endingOffsets": offsets_json(self.topic, self.end),
            "failOnDataLoss": "false",
        }


def offsets_json(topic: str, offsets: dict[int, int]) -> str:
    """Partition offsets as Spark's Kafka connector spells them, in its options and its checkpoint logs:
    {"topic":{"0":12,...}}."""
    return json.dumps({topic: {str(p): o for p, o in sorted(offsets.items())}}, separators=(",", ":"))


def read_kafka(
    spark: SparkSession,
    group: FeatureGroup,
    declared: StructType,
    offsets: OffsetRange | None = None,
    keep: tuple[str, ...] = (),
) -> DataFrame:
    """The group's Kafka topic through Spark's connector, with the columns a file read has: each value decoded
    with the source's schema (JSON, or Avro by `KafkaTopic.schema`; a value that does not decode keeps its text,
    or an Avro value its bytes in base64, and is set aside as a bad record), the event time from the value or the
    record (`KafkaTopic.event_time`), and in place of a file's name the record's
    `kafka:<topic>/<partition>/<offset>`, which a bad record keeps.

    A stream, or with `offsets` a batch read of that stretch; `declared`: the source's declared schema, which
    EventSource requires of a Kafka source; `keep`: columns of Spark's Kafka rows to keep too (`partition`,
    `offset`, ...)."""
    source = group.source
    topic = source.kafka
    if topic is None:
        raise AssertionError("read_kafka reads a Kafka source")
    options = {**FETCH, "kafka.bootstrap.servers": topic.bootstrap_servers, "subscribe": topic.topic, **topic.options}
    reader = spark.readStream if offsets is None else spark.read
    if offsets is not None:
        streaming_only = ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay")
        options = {k: v for k, v in options.items() if k not in streaming_only} | offsets.options()
    try:
        raw = reader.format("kafka").options(**options).load()
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
    if "minPartitions" not in options and spark.conf.get("spark.master", "").startswith("local"):
        # One task per topic partition is Spark's default; on fewer cores than partitions, each task's fixed cost
        # (its consumer, its Python worker's Arrow stream) is paid per partition for nothing. Tasks that read
        # several partitions each read, decoded and packed 500,000 JSON records in 2.2 s instead of 2.5 s (8
        # partitions, 2 cores, medians of alternated warm reads).
        # Local sessions only, whose cores are fixed: a cluster may add executors after the query's plan is made.
        raw = raw.coalesce(cores(spark))
    # Built for every record (a bad one is only known later): concat, not format_string, whose Java Formatter made
    # the read and decode 1.2x slower (1.92 against 1.58 s for 500,000 JSON records, median of 3 warm reads).
    origin = F.concat(
        F.lit("kafka:"),
        F.col("topic"),
        F.lit("/"),
        F.col("partition").cast("string"),
        F.lit("/"),
        F.col("offset").cast("string"),
    )
    decoded, corrupt = _avro(topic) if topic.value_format in AVRO_FORMATS else _json(declared, raw)
    # Decoded once, in a projection of its own: the fields below read the struct (Spark does not inline an
    # expensive expression into each of its uses).
    try:
        records = raw.select(
            decoded.alias("r"), "value", F.col("timestamp").alias("fx_time"), origin.alias(FILE), *keep
        )
    except Exception as exc:
        if "AVRO_NOT_LOADED" not in str(exc):
            raise
        raise EnvironmentProblem(
            f"EventSource({source.name!r}).kafka: Spark's Avro reader (from_avro) is not on the classpath. Fix: "
            f"start Spark with --packages {AVRO_PACKAGE.format(version=spark.version)} (or add it to "
            "spark.jars.packages); a local session started by features has it"
        ) from None
    columns = [
        F.col("fx_time").alias(f.name)
        if topic.event_time == "record" and f.name == source.timestamp
        else F.col(f"r.`{f.name}`").cast(f.dataType).alias(f.name)  # an Avro int or float is widened
        for f in declared.fields
    ]
    landed = F.unix_micros(F.col("fx_time"))
    return records.select(*columns, corrupt.alias(CORRUPT), landed.alias(LANDED), F.col(FILE), *keep)


def _json(declared: StructType, raw: DataFrame) -> tuple[Column, Column]:
    """Each value parsed as a JSON object, and the text of one that does not parse (else null)."""
    from pyspark.sql import types as T

    with_corrupt = T.StructType([*declared.fields, T.StructField(CORRUPT, T.StringType())])
    text = F.col("value").cast("string")
    parsed = F.from_json(text, with_corrupt, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT})
    # A value that is not a JSON object at all parses to null, not to a corrupt record: its text is kept all the same.
    corrupt = F.when(F.col("r").isNull(), F.coalesce(text, F.lit(""))).otherwise(F.col(f"r.{CORRUPT}"))
    return parsed, corrupt


def _avro(topic: KafkaTopic) -> tuple[Column, Column]:
    """Each value decoded as an Avro record of `KafkaTopic.schema` (after Confluent's header, whose magic byte must
    be 0, for "confluent-avro"), and the bytes (base64) of one that does not decode (else null)."""
    from pyspark.sql.avro.functions import from_avro

    assert topic.schema is not None
    value = F.col("value")
    if topic.value_format == "confluent-avro":
        body = F.expr(f"substring(value, {CONFLUENT_HEADER + 1})")
        framed = (F.length(value) >= CONFLUENT_HEADER) & (F.hex(F.substring(value, 1, 1)) == "00")
    else:
        body, framed = value, F.lit(True)
    # PERMISSIVE: a value that does not decode gives a record of nulls instead of failing the stream. A null input
    # (a bad header, a tombstone) gives null.
    decoded = from_avro(F.when(framed, body), topic.schema, {"mode": "PERMISSIVE"})
    fields = topic.avro_fields
    failed = F.col("r").isNull()
    every_null = F.lit(True)
    for name in fields:
        every_null = every_null & F.col(f"r.`{name}`").isNull()
    indexes = null_indexes(fields)
    if indexes is not None:
        # That record of nulls is also what a record whose every field is null decodes to: the one encoding it has
        # (each union's index of "null", a zigzag varint) tells the two apart.
        nulls = bytearray(2 * i for i in indexes)
        every_null = every_null & ~(framed & (body == F.lit(nulls)))
    failed = failed | every_null
    corrupt = F.when(failed, F.base64(F.coalesce(F.col("value"), F.lit(bytearray()))))
    return decoded, corrupt


def undecoded_reason(topic: KafkaTopic, kept: Column) -> Column:
    """Why an Avro value did not decode, from the base64 of its bytes that `read_kafka` keeps (`UNPARSEABLE_AVRO`
    and the detail)."""
    value = F.unbase64(kept)
    reason = F.when(F.length(value) == 0, F.lit(f"{UNPARSEABLE_AVRO}: the record has no value"))
    if topic.value_format == "confluent-avro":
        magic = F.hex(F.substring(value, 1, 1))
        schema_id = F.conv(F.hex(F.substring(value, 2, 4)), 16, 10)
        short = f"{UNPARSEABLE_AVRO}: shorter than Confluent's {CONFLUENT_HEADER}-byte header (magic byte, schema id)"
        reason = reason.when(F.length(value) < CONFLUENT_HEADER, F.lit(short)).when(
            magic != "00",
            F.concat(F.lit(f"{UNPARSEABLE_AVRO}: magic byte 0x"), magic, F.lit(", not Confluent's 0x00")),
        )
        detail = F.concat(F.lit(f"{UNDECODED} (the writer's schema id: "), schema_id, F.lit(")"))
        return reason.otherwise(detail)
    return reason.otherwise(F.lit(UNDECODED))


def archive_rows(group: FeatureGroup, events: DataFrame) -> DataFrame:
    """What the archive of a Kafka source keeps of `read_kafka`'s records: every record whose value parsed, with
    the source's columns as read, and the UTC date of its event time (the archive's partition)."""
    kept = [c for c in events.columns if c not in (CORRUPT, LANDED, FILE)]
    day = F.to_date(F.col(group.source.timestamp).cast("timestamp")).alias(ARCHIVE_DATE)
    return events.where(F.col(CORRUPT).isNull()).select(*kept, day)


def start_archive(
    group: FeatureGroup, events: DataFrame, path: str, checkpoint: Path, trigger: dict[str, Any]
) -> StreamingQuery:
    """Start the query that writes every record read from a Kafka source (`events`, `read_kafka`'s) into its
    folder `path`, as Parquet partitioned by event date, for backfills. Spark's file sink writes each micro-batch's
    files exactly once: its log (`_spark_metadata` in the folder) lists the files of committed batches, and
    Spark's readers of the folder, the backfill's among them, read only those."""
    rows = archive_rows(group, events)
    writer = rows.writeStream.format("parquet").partitionBy(ARCHIVE_DATE).outputMode("append")
    writer = writer.option("checkpointLocation", str(checkpoint)).queryName(f"features_archive_{group.source.name}")
    return writer.trigger(**trigger).start(path)
