"""A Kafka source's JSON values decoded by pyarrow where its meaning is Spark's (features.engine.json_values): every
value decodes to what Spark's own `from_json` gives it, bad records included; the reference is Spark itself."""

from __future__ import annotations

import json
import random

import numpy as np
import pyarrow as pa
import pytest

from features.engine import json_values
from features.engine.json_values import MAX_FAST_BYTES, SHORTEST_SLICE

SCHEMA = pa.schema([("s", pa.string()), ("d", pa.float64()), ("i", pa.int64()), ("b", pa.bool_()), ("t", pa.string())])
DDL = "s string, d double, i bigint, b boolean, t timestamp"

# Values whose decoding differs between JSON readers, or that are no JSON object at all.
CORPUS = [
    '{"s":"a","d":1.5,"i":3,"b":true,"t":"2026-01-02T15:13:31.480263Z"}',
    '{"s":7}',
    '{"s":1.5e3}',
    '{"s":true}',
    '{"s":null}',
    '{"s":{"x":1}}',
    '{"s":[1,2]}',
    '{"s":"\\u00e9\\n"}',
    '{"s":"\\ud83d\\ude00"}',
    '{"s":"\\ud800"}',
    '{"s":"caf\u00e9"}',
    '{"s":"a\u0001b"}',
    '{"s":"\\u0000"}',
    '{"d":3}',
    '{"d":"3"}',
    '{"d":"NaN"}',
    '{"d":NaN}',
    '{"d":Infinity}',
    '{"d":-Infinity}',
    '{"d":"Infinity"}',
    '{"d":1e400}',
    '{"d":1e-400}',
    '{"d":-0.0}',
    '{"d":1.0000000000000002}',
    '{"d":12345678901234567890}',
    '{"d":.5}',
    '{"d":05}',
    '{"d":+1}',
    '{"d":1E5}',
    '{"i":3.0}',
    '{"i":"3"}',
    '{"i":9223372036854775807}',
    '{"i":9223372036854775808}',
    '{"i":-3}',
    '{"i":1e2}',
    '{"b":"true"}',
    '{"b":1}',
    '{"b":false}',
    '{"b":null}',
    '{"t":"2026-01-02"}',
    '{"t":"2026-01-02 15:13:31"}',
    '{"t":"2026-01-02T15:13:31"}',
    '{"t":"2026-01-02T15:13Z"}',
    '{"t":"2026-01-02T15:13:31+01:00"}',
    '{"t":"2026-01-02T15:13:31+0100"}',
    '{"t":"2026-01-02T15:13:31 UTC"}',
    '{"t":"2026-01-02T15:13:31.1234567Z"}',
    '{"t":1767366811}',
    '{"t":1767366811.5}',
    '{"t":"2026-1-2T15:13:31Z"}',
    '{"t":"20260102T151331Z"}',
    '{"t":""}',
    '{"t":" 2026-01-02T15:13:31Z"}',
    '{"t":"2026-01-02T24:00:00Z"}',
    '{"t":"2026-01-02T15:13:31,480Z"}',
    '{"t":"0001-01-01T00:00:00Z"}',
    '{"t":null}',
    '{"s":"a","s":"b"}',
    '{"S":"a"}',
    '{"x":{"y":[1,{"z":2}]},"s":"k"}',
    "{}",
    "[]",
    '[{"s":"a"}]',
    "5",
    "null",
    '"str"',
    "",
    " ",
    "nope",
    "true",
    '{"s":"a"} {"s":"b"}',
    '{"s":"a"}x',
    '{"s":"a",}',
    "{'s':'a'}",
    '{s:"a"}',
    ' {"s":"a"}',
    '{"s":"a"} ',
    '\ufeff{"s":"a"}',
    '{"s":"a\tb"}',
    '{"s":\n"a"}',
    '{"s":"a"}\r',
    '{"x":' + "[" * 1200 + "]" * 1200 + ',"s":"deep"}',
    '{"s":"' + "x" * MAX_FAST_BYTES + '"}',
]


def _binary(values: list[bytes | None]) -> pa.Array:
    return pa.array(values, pa.binary())


def _random_values(rng: random.Random, n: int) -> list[bytes | None]:
    """Mostly well-formed events, with every kind of field value mixed in at random."""
    kinds = {
        "s": ['"a"', '"\\u00e9x"', "7", "null", '"line\\nbreak"', "true"],
        "d": ["1.25", "3", '"2.5"', "null", "-0.0", "1e308", "NaN"],
        "i": ["42", "-7", "4.0", '"5"', "null", "9223372036854775807"],
        "b": ["true", "false", '"false"', "0", "null"],
        "t": ['"2026-03-04T05:06:07.123456Z"', '"2026-03-04 05:06:07"', '"2026-03-04T05:06Z"', "1767366811", '"x"'],
    }
    values: list[bytes | None] = []
    for _ in range(n):
        roll = rng.random()
        if roll < 0.005:
            values.append(rng.choice([None, b"", b"null", b"{", b"[1]", b'{"s":"a"} {"s":"b"}']))
            continue
        names = [k for k in kinds if rng.random() < 0.9] + (["extra"] if rng.random() < 0.2 else [])
        rng.shuffle(names)
        # Most events hold only values of their field's kind (the first two of each list), as a stream's do.
        pick = (lambda k: rng.choice(kinds[k][:2])) if roll < 0.97 else (lambda k: rng.choice(kinds[k]))
        fields = [f'"{k}":{pick(k) if k in kinds else json.dumps({"n": [1, 2]})}' for k in names]
        values.append(("{" + ",".join(fields) + "}").encode())
    return values


def test_framing_leaves_to_spark_what_cannot_be_one_line_of_one_object() -> None:
    values = [b'{"s":"a"}', None, b"", b"null", b' {"s":"a"}', b'{"s":\n"a"}', b'{"s":"a"}\r', b'{"s":"b"}']
    values.append(b'{"s":"' + b"x" * MAX_FAST_BYTES + b'"}')
    taken, table = json_values.parse(_binary(values), SCHEMA)
    assert taken.tolist() == [True] + [False] * 6 + [True, False]
    assert table.column("s").to_pylist() == ["a", *[None] * 6, "b", None]


def test_a_slice_with_a_bad_value_is_halved_until_the_good_values_parse() -> None:
    good = [f'{{"s":"v{i}","i":{i}}}'.encode() for i in range(SHORTEST_SLICE * 8)]
    values = [*good[:300], b'{"i":"not a number"}', *good[300:]]
    taken, table = json_values.parse(_binary(values), SCHEMA)
    bad = 300
    # The bad value's slice of at most SHORTEST_SLICE values is left to Spark whole; every other value is taken.
    assert not taken[bad]
    assert (~taken).sum() <= SHORTEST_SLICE
    assert taken.sum() >= len(values) - SHORTEST_SLICE
    decoded = table.column("i").to_pylist()
    assert all(decoded[k] == (k if k < bad else k - 1) for k in np.flatnonzero(taken))
    assert all(decoded[k] is None for k in np.flatnonzero(~taken))


@pytest.mark.parametrize(
    "value", [b"null", b"{\xff}", b'{"s":"\xff\xfe"}', b'{"s":"a"} {"s":"b"}', b'{"s":"a","s":"b"}']
)
def test_values_pyarrow_would_misread_are_never_taken(value: bytes) -> None:
    # `null` alone crashes pyarrow 25's reader given a schema; invalid UTF-8 would pass through where Spark replaces
    # it; two objects in one value would make two rows; a field given twice is Spark's last, pyarrow's error.
    taken, table = json_values.parse(_binary([b'{"s":"ok"}', value, b'{"s":"ok2"}']), SCHEMA)
    assert not taken[1]
    assert table.num_rows == 3


def _spark_rows(spark, values: list[bytes | None]) -> tuple[list, list]:
    """Each value decoded by the fast path and by Spark's from_json alone, as comparable rows."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    declared = T.StructType.fromDDL(DDL)
    raw = spark.createDataFrame(
        [(None if v is None else bytearray(v), k) for k, v in enumerate(values)], "value binary, offset bigint"
    ).repartition(3)
    fast = json_values.decode(raw, declared, "_corrupt", ["value", "offset"])
    assert fast is not None
    frame, decoded = fast
    with_corrupt = T.StructType([*declared.fields, T.StructField("_corrupt", T.StringType())])
    spark_only = F.from_json(
        F.col("value").cast("string"), with_corrupt, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt"}
    )

    def rows(df, column) -> list:
        # Timestamps as microseconds and doubles as text: Python's datetime has no year 0 and NaN != NaN.
        r = df.select("offset", column.alias("r")).select(
            "offset",
            F.col("r").isNull().alias("null"),
            "r.s",
            F.col("r.d").cast("string").alias("d"),
            "r.i",
            "r.b",
            F.unix_micros("r.t").alias("t"),
            "r._corrupt",
        )
        return sorted(tuple(x) for x in r.collect())

    return rows(frame, decoded), rows(raw, spark_only)


def test_every_value_decodes_as_spark_decodes_it(spark) -> None:
    values = [v.encode() for v in CORPUS] + [None]
    fast, reference = _spark_rows(spark, values)
    assert fast == reference


def test_random_values_decode_as_spark_decodes_them(spark) -> None:
    rng = random.Random(20261201)
    values = _random_values(rng, 3000)
    fast, reference = _spark_rows(spark, values)
    assert fast == reference
    # Most of these values are taken by the fast path, or the test would check Spark against itself.
    taken, _ = json_values.parse(_binary(values), SCHEMA)
    assert taken.mean() > 0.25


def test_a_schema_with_another_type_is_left_to_spark() -> None:
    from pyspark.sql import types as T

    assert json_values.fast_types(T.StructType.fromDDL("s string, n decimal(10,2)")) is None
    assert json_values.fast_types(T.StructType.fromDDL(DDL)) == [
        ("s", "string"),
        ("d", "double"),
        ("i", "bigint"),
        ("b", "boolean"),
        ("t", "timestamp"),
    ]
