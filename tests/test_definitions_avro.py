"""Kafka sources with Avro values (unit tests: no Spark): `KafkaTopic(value_format="avro" | "confluent-avro",
schema=...)` takes the Avro schema of the values, which must be a record whose fields hold every column of the
source's declared schema, each of an Avro type that decodes to the column's type; every mistake names the field
and the fix."""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_definitions import expect_error

from features import EventSource, KafkaTopic
from features.spec import DType
from features.spec.avro import null_indexes

COLUMNS = {"user_id": "string", "amount": "double", "qty": "int64", "ok": "bool", "ts": "timestamp"}
MICROS = {"type": "long", "logicalType": "timestamp-micros"}


def record(**fields: Any) -> str:
    base = {"user_id": "string", "amount": "double", "qty": "long", "ok": "boolean", "ts": MICROS, **fields}
    items = [{"name": name, "type": avro_type} for name, avro_type in base.items() if avro_type is not None]
    return json.dumps({"type": "record", "name": "Event", "fields": items})


def source(schema: str, value_format: str = "avro", columns: dict[str, str] = COLUMNS, **kw: Any) -> EventSource:
    topic = KafkaTopic("t", "h:9092", value_format=value_format, schema=schema, **kw)
    return EventSource("s", path="p", timestamp="ts", schema=columns, kafka=topic)


def test_an_avro_record_that_holds_the_columns_is_a_source() -> None:
    # Narrower Avro types widen to the column's (int -> int64, float -> float64), nullable unions in either order,
    # an enum or a uuid is a string, fields the source does not declare are ignored.
    schema = record(
        user_id={"type": "string", "logicalType": "uuid"},
        amount=["null", "float"],
        qty=["int", "null"],
        ts={"type": "long", "logicalType": "timestamp-millis"},
        note="string",
    )
    events = source(schema)
    assert events.kafka is not None and events.kafka.schema == schema
    assert list(events.kafka.avro_fields) == ["user_id", "amount", "qty", "ok", "ts", "note"]
    enum = {"type": "enum", "name": "Status", "symbols": ["A", "B"]}
    status = source(record(status=enum), "confluent-avro", {**COLUMNS, "status": "string"})
    assert status.schema is not None and status.schema["status"] is DType.STRING
    # The schema may be given as a dict too; the topic keeps its JSON text, part of the source's identity.
    as_dict = KafkaTopic("t", "h:9092", value_format="avro", schema=json.loads(schema))
    assert json.loads(as_dict.schema or "") == json.loads(schema)
    assert hash(as_dict) != hash(KafkaTopic("t", "h:9092", value_format="avro", schema=record()))


def test_the_record_time_needs_no_time_field_in_the_avro_record() -> None:
    events = source(record(ts=None), event_time="record")
    assert events.schema is not None and events.schema["ts"] is DType.TIMESTAMP


def test_a_record_of_nulls_has_one_encoding_when_every_field_may_be_null() -> None:
    assert null_indexes({"a": ["null", "string"], "b": ["long", "null"]}) == [0, 1]
    assert null_indexes({"a": ["null", "string"], "b": "long"}) is None


@pytest.mark.parametrize(
    ("make", "field", "fix"),
    [
        (lambda: KafkaTopic("t", "h:9092", value_format="avro"), "KafkaTopic('t').schema", "schema="),
        (lambda: KafkaTopic("t", "h:9092", schema=record()), "KafkaTopic('t').schema", 'value_format="avro"'),
        (lambda: KafkaTopic("t", "h:9092", value_format="avro", schema=3), "KafkaTopic('t').schema", ".avsc"),
        (lambda: KafkaTopic("t", "h:9092", value_format="avro", schema="{nope"), "KafkaTopic('t').schema", ".avsc"),
        (
            lambda: KafkaTopic("t", "h:9092", value_format="avro", schema='{"type": "string"}'),
            "KafkaTopic('t').schema",
            '"type": "record"',
        ),
        (
            lambda: KafkaTopic("t", "h:9092", value_format="avro", schema='{"type": "record", "fields": []}'),
            "KafkaTopic('t').schema",
            '"name": "Transaction"',
        ),
        (
            lambda: KafkaTopic("t", "h:9092", value_format="avro", schema='{"type": "record", "name": "E"}'),
            "KafkaTopic('t').schema",
            '"fields": [{"name": "user_id"',
        ),
        (
            lambda: KafkaTopic(
                "t",
                "h:9092",
                value_format="confluent-avro",
                schema='{"type": "record", "name": "E", "fields": [{"name": "a", "type": "int"}, '
                '{"name": "a", "type": "long"}]}',
            ),
            "KafkaTopic('t').schema",
            "list each field once",
        ),
        (lambda: source(record(qty=None)), "KafkaTopic('t').schema", "add the field to the Avro schema"),
        (lambda: source(record(amount="string")), "KafkaTopic('t').schema", "an Avro float or double"),
        (lambda: source(record(qty="double")), "KafkaTopic('t').schema", "an Avro int or long"),
        (lambda: source(record(ok="int")), "KafkaTopic('t').schema", "an Avro boolean"),
        (lambda: source(record(user_id="bytes")), "KafkaTopic('t').schema", "an Avro string (or enum)"),
        (lambda: source(record(ts="long")), "KafkaTopic('t').schema", '"logicalType": "timestamp-millis"'),
        (
            lambda: source(record(ts={"type": "long", "logicalType": "local-timestamp-micros"})),
            "KafkaTopic('t').schema",
            "timestamp-micros",
        ),
        (lambda: source(record(ts="string")), "KafkaTopic('t').schema", "timestamp-millis"),
        (
            lambda: source(record(qty={"type": "int", "logicalType": "date"})),
            "KafkaTopic('t').schema",
            "an Avro int or long",
        ),
        (lambda: source(record(amount=["null", "double", "string"])), "KafkaTopic('t').schema", "union of it"),
    ],
)
def test_avro_mistakes_name_the_field_and_the_fix(make, field, fix) -> None:
    expect_error(make, field, fix)


def test_a_missing_field_is_named_with_the_fields_there_are() -> None:
    exc = expect_error(lambda: source(record(qty=None)), "KafkaTopic('t').schema", "EventSource's schema")
    assert "'qty' is not a field of the Avro record (its fields: user_id, amount, ok, ts)" in str(exc)
    exc = expect_error(lambda: source(record(amount="string")), "KafkaTopic('t').schema", "declare")
    assert "declares 'amount' as float64 and its Avro field is \"string\"" in str(exc)
