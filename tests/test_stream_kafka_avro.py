"""Avro values from a real Kafka broker (tests/kafka_broker.py): records encoded by fastavro, plain or in
Confluent's wire format, stream to the batch engine's change points over the same events, and a value that does
not decode (cut short, empty, a wrong magic byte, a header too short) is set aside with its topic, partition,
offset, bytes and reason while the stream goes on."""

from __future__ import annotations

import base64
import json

import pandas as pd
import pytest
from kafka_broker import BOOTSTRAP, avro_values, confluent_header, produce, round_robin
from test_batch_reference import EVENTS
from test_stream import arrival_order, assert_batch_engine_rows, offline_rows
from test_stream_kafka import kafka_groups

from features import FeatureGroup, KafkaTopic
from features.engine.schema import MISSING_KEY, UNPARSEABLE_AVRO
from features.pipelines.stream import StreamRun, stream
from features.quality import quarantine_root
from features.repo import Repo

pytestmark = pytest.mark.spark

PARTITIONS = 4


def avro_schema(time_type: str) -> str:
    """The events as an Avro record: nullable fields, the merchant an Avro int (widened to the declared int64),
    the time a long of `time_type`, and a field the source does not declare (ignored)."""
    fields = [
        {"name": "user_id", "type": ["null", "string"]},
        {"name": "card_id", "type": ["null", "string"]},
        {"name": "merchant_id", "type": "int"},
        {"name": "amount", "type": ["null", "double"]},
        {"name": "qty", "type": ["long", "null"]},
        {"name": "status", "type": ["null", "string"]},
        {"name": "ok", "type": "boolean"},
        {"name": "event_ts", "type": {"type": "long", "logicalType": time_type}},
        {"name": "channel", "type": "string", "default": "web"},
    ]
    return json.dumps({"type": "record", "name": "Transaction", "namespace": "test", "fields": fields})


def avro_group(topic: str, value_format: str, schema: str) -> FeatureGroup:
    return kafka_groups(topic, value_format=value_format, schema=schema)[0]


def stream_with_bad(
    feast_repo_factory, tmp_path, topic: str, values: list[bytes], bad: list[bytes], value_format: str, schema: str
) -> tuple[FeatureGroup, Repo, StreamRun, list[str]]:
    """`bad` produced amid `values` (round robin over the partitions), streamed available-now; the group, repo,
    finished run, and where each bad record is (`kafka:<topic>/<partition>/<offset>`)."""
    middle = len(values) // 2
    offsets = produce(topic, round_robin(values[:middle] + bad + values[middle:], PARTITIONS))
    group = avro_group(topic, value_format, schema)
    feast_repo_factory(tmp_path, [group])
    repo = Repo.load(tmp_path)
    run = stream(repo, available_now=True, progress=False, tracking=False)
    run.await_termination()
    return group, repo, run, [f"kafka:{topic}/{p}/{o}" for p, o in offsets[middle : middle + len(bad)]]


def test_a_record_of_nulls_is_told_from_a_value_that_does_not_decode(spark) -> None:
    """Spark's from_avro gives a value that does not decode as a record of nulls: with every field nullable, a
    record of nulls is also a real value (then a bad record for its missing key, not an undecodable one)."""
    from pyspark.sql import functions as F

    from features.engine.kafka import _avro

    stamp = {"type": "long", "logicalType": "timestamp-micros"}
    fields = [{"name": "user_id", "type": ["null", "string"]}, {"name": "event_ts", "type": [stamp, "null"]}]
    schema = json.dumps({"type": "record", "name": "E", "fields": fields})
    events = pd.DataFrame({"user_id": [None, "u1"], "event_ts": [None, EVENTS["event_ts"].iloc[0]]})
    values = avro_values(events, schema)
    assert values[0] == b"\x00\x02"  # the union index of null, per field
    decoded, kept = _avro(KafkaTopic("t", BOOTSTRAP, value_format="avro", schema=schema))
    frame = spark.createDataFrame([(v,) for v in [*values, b"\x06", b""]], "value binary")
    rows = frame.select(decoded.alias("r"), "value").select(F.col("r.user_id"), kept.alias("kept")).collect()
    assert [(r.user_id, r.kept) for r in rows] == [(None, None), ("u1", None), (None, "Bg=="), (None, "")]


def quarantined(repo: Repo, group: FeatureGroup) -> pd.DataFrame:
    folder = quarantine_root(repo.root, group.name) / "records"
    return pd.concat([pd.read_parquet(f) for f in folder.glob("stream-b*/*.parquet")], ignore_index=True)


def test_avro_values_stream_what_the_batch_engine_computes(spark, feast_repo_factory, tmp_path, kafka_topic) -> None:
    schema = avro_schema("timestamp-micros")
    events = arrival_order(EVENTS, pd.Timedelta(minutes=20), seed=3)  # within the 30 minute watermark
    values = avro_values(events.assign(channel="app"), schema)
    no_user = avro_values(events.iloc[:1].assign(user_id=None, channel="app"), schema)[0]
    bad = [values[0][:-4], b"", no_user, b'{"user_id": "u1"}']  # cut short, empty, valid without a key, JSON
    group, repo, run, where = stream_with_bad(feast_repo_factory, tmp_path, kafka_topic, values, bad, "avro", schema)
    [progress] = run.progress()
    assert (run.status()["group"] == group.name).sum() >= 3  # maxOffsetsPerTrigger splits the topic
    got = offline_rows(spark, repo, group)
    assert len(got) > 100
    assert_batch_engine_rows(spark, group, got, EVENTS, pd.Timestamp(progress.watermark))

    records = quarantined(repo, group)
    assert sorted(records["source_file"]) == sorted(where)
    by_place = records.set_index("source_file")
    undecoded = f"{UNPARSEABLE_AVRO}: the value does not decode as an Avro record of KafkaTopic.schema"
    assert list(by_place.loc[where, "reason"]) == [
        undecoded,
        f"{UNPARSEABLE_AVRO}: the record has no value",
        f"{MISSING_KEY}: user_id",
        undecoded,
    ]
    # A value that did not decode keeps its bytes (base64); one that decoded keeps its columns instead.
    kept = by_place.loc[where, "raw_record"]
    assert [base64.b64decode(kept[w]) for w in (where[0], where[1], where[3])] == [bad[0], bad[1], bad[3]]
    assert kept[where[2]] is None and by_place.loc[where[2], "card_id"] == events["card_id"].iloc[0]


def test_confluent_wire_format_strips_the_header_and_checks_the_magic_byte(
    spark, feast_repo_factory, tmp_path, kafka_topic
) -> None:
    schema = avro_schema("timestamp-millis")
    # Milliseconds are what the values can hold: the reference is computed over the same times.
    events = EVENTS.assign(event_ts=EVENTS["event_ts"].dt.floor("ms"))
    ordered = arrival_order(events, pd.Timedelta(minutes=20), seed=4)
    values = avro_values(ordered.assign(channel="app"), schema, header=confluent_header(7))
    body = values[0][5:]
    bad = [confluent_header(7, magic=1) + body, b"\x00\x00\x07", confluent_header(8) + body[:-4]]
    group, repo, run, where = stream_with_bad(
        feast_repo_factory, tmp_path, kafka_topic, values, bad, "confluent-avro", schema
    )
    [progress] = run.progress()
    got = offline_rows(spark, repo, group)
    assert len(got) > 100
    assert_batch_engine_rows(spark, group, got, events, pd.Timestamp(progress.watermark))

    records = quarantined(repo, group).set_index("source_file")
    assert sorted(records.index) == sorted(where)
    assert list(records.loc[where, "reason"]) == [
        f"{UNPARSEABLE_AVRO}: magic byte 0x01, not Confluent's 0x00",
        f"{UNPARSEABLE_AVRO}: shorter than Confluent's 5-byte header (magic byte, schema id)",
        f"{UNPARSEABLE_AVRO}: the value does not decode as an Avro record of KafkaTopic.schema (the writer's "
        "schema id: 8)",
    ]
    assert [base64.b64decode(records.loc[w, "raw_record"]) for w in where] == bad
