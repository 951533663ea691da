"""The Avro schema of a Kafka source's values (`KafkaTopic(value_format="avro", schema=...)`), checked when the
definition is built: it must be an Avro record whose fields hold every column of the source's declared schema,
each of an Avro type that decodes to the column's type. Plain JSON parsing: the spec imports no Spark and no Avro
library; Spark's `from_avro` reads the same text when the stream starts."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from features.errors import DefinitionError
from features.spec.types import DType

# The Avro types that decode (Spark's from_avro) to each logical type; a timestamp is a long with one of
# TIMESTAMP_LOGICAL_TYPES. An enum decodes to its symbol's text.
AVRO_TYPES: Mapping[DType, tuple[str, ...]] = {
    DType.INT64: ("int", "long"),
    DType.FLOAT64: ("float", "double"),
    DType.STRING: ("string", "enum"),
    DType.BOOL: ("boolean",),
    DType.TIMESTAMP: ("long",),
}
# Instants in UTC, which Spark reads as its timestamp type. The local-timestamp-* types are wall-clock times with
# no zone (Spark's timestamp_ntz), which would be read in the session's time zone: refused, like a plain long.
TIMESTAMP_LOGICAL_TYPES = ("timestamp-millis", "timestamp-micros")
_WANTED = {
    DType.INT64: "an Avro int or long",
    DType.FLOAT64: "an Avro float or double",
    DType.STRING: "an Avro string (or enum)",
    DType.BOOL: "an Avro boolean",
    DType.TIMESTAMP: 'an Avro long with "logicalType": "timestamp-millis" or "timestamp-micros"',
}


def record_fields(schema: str | Mapping[str, Any], where: str) -> tuple[str, dict[str, Any]]:
    """The schema as JSON text, and its record's fields (name -> Avro type as written); a DefinitionError naming
    `where` if it is not the JSON of an Avro record."""
    if isinstance(schema, Mapping):
        text = json.dumps(schema)
    elif isinstance(schema, str):
        text = schema
    else:
        raise DefinitionError(
            where,
            f"expected the Avro schema as JSON text, got {type(schema).__name__}",
            'pass the text of the value\'s .avsc file, e.g. schema=Path("transaction.avsc").read_text()',
        )
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DefinitionError(
            where, f"the Avro schema is not JSON ({exc})", "pass the text of the value's .avsc file"
        ) from None
    example = '{"type": "record", "name": "Transaction", "fields": [{"name": "user_id", "type": "string"}, ...]}'
    if not isinstance(parsed, dict) or parsed.get("type") != "record":
        raise DefinitionError(
            where, "the Avro schema is not a record (each value must decode to one event)", f"write {example}"
        )
    if not isinstance(parsed.get("name"), str) or not parsed["name"]:
        raise DefinitionError(where, "the Avro record has no name (Avro requires one)", f"write {example}")
    fields = parsed.get("fields")
    if not isinstance(fields, list) or not all(
        isinstance(f, dict) and isinstance(f.get("name"), str) and "type" in f for f in fields
    ):
        raise DefinitionError(
            where, 'the Avro record\'s "fields" is not a list of {"name": ..., "type": ...}', f"write {example}"
        )
    by_name: dict[str, Any] = {}
    for item in fields:
        if item["name"] in by_name:
            raise DefinitionError(where, f"the Avro field {item['name']!r} is listed twice", "list each field once")
        by_name[item["name"]] = item["type"]
    return text, by_name


def check_covers(
    fields: Mapping[str, Any], columns: Mapping[str, DType], where: str, skip: tuple[str, ...] = ()
) -> None:
    """A DefinitionError naming `where` unless every column of `columns` (but `skip`) is a field of the Avro record
    of a type that decodes to the column's type (`AVRO_TYPES`), or a union of it with null."""
    for column, dtype in columns.items():
        if column in skip:
            continue
        if column not in fields:
            raise DefinitionError(
                where,
                f"the source's column {column!r} is not a field of the Avro record (its fields: {', '.join(fields)})",
                "add the field to the Avro schema (Avro names are case-sensitive), or remove the column from the "
                "EventSource's schema",
            )
        avro_type = _non_null(fields[column])
        if avro_type is None or not _fits(avro_type, dtype):
            raise DefinitionError(
                where,
                f"the source declares {column!r} as {dtype.value} and its Avro field is {json.dumps(fields[column])}",
                f"make the field {_WANTED[dtype]} (or a union of it with null), or declare the column's type to match",
            )


def null_indexes(fields: Mapping[str, Any]) -> list[int] | None:
    """For each field, the index of "null" in its union, if every field may be null; else None. A record whose
    fields are all null is encoded as these indexes alone, and it is the one record that decodes to what Spark's
    from_avro gives for a value that does not decode (every field null)."""
    indexes = []
    for avro_type in fields.values():
        if not isinstance(avro_type, list) or "null" not in avro_type:
            return None
        indexes.append(avro_type.index("null"))
    return indexes


def _non_null(avro_type: Any) -> Any:
    """The type of a field, without a union with null; None for other unions, which no column type reads."""
    if isinstance(avro_type, list):
        others = [t for t in avro_type if t != "null"]
        return others[0] if len(others) == 1 and len(avro_type) == 2 else None
    return avro_type


def _fits(avro_type: Any, dtype: DType) -> bool:
    name = avro_type.get("type") if isinstance(avro_type, dict) else avro_type
    logical = avro_type.get("logicalType") if isinstance(avro_type, dict) else None
    if dtype is DType.TIMESTAMP:
        return name == "long" and logical in TIMESTAMP_LOGICAL_TYPES
    # Other logical types decode to other Spark types (a date, a decimal), but a uuid is a string still.
    return name in AVRO_TYPES[dtype] and logical in (None, "uuid")
