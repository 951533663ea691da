"""JSON values of a Kafka source, decoded in the Python workers by pyarrow's JSON reader, with Spark's `from_json`
deciding every value that reader does not take.

Spark's `from_json` puts a character reader and a Jackson parser around each value: about 2 core-µs a value before
any field is read, which made a stream of JSON values 0.7x as fast as the same events from files. pyarrow parses a
whole batch of values at once. It only takes a value whose meaning is certain to be Spark's (docs/streaming.md,
"How JSON values are decoded"): an object of at most `MAX_FAST_BYTES` bytes on one line of valid UTF-8, whose fields
have exactly the declared JSON kind (a string for a string field, an integer for an integer field, a number for a
float field, true or false for a boolean), no field given twice. Event times travel as text and are parsed by Spark's
own cast, which is the parser `from_json` uses. Everything else (numbers given as text, a number for a string
field, a bad record) goes to `from_json`, so the decoded rows, and the bad records set aside, are Spark's.

`decode_batches` runs in the workers and imports no pyspark; `decode` wires it into a DataFrame."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.json as pj

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

# Longer values go to Spark: Jackson refuses nesting deeper than 1,000 and numbers longer than 1,000 digits, which a
# value of 2,000 bytes cannot reach, and pyarrow has no such limits.
MAX_FAST_BYTES = 2000
# A slice of values that does not parse whole is halved until it does; slices this short that still fail are left
# to Spark whole (a batch of bad records costs a few parses, not one a value).
SHORTEST_SLICE = 64
TAKEN = "fx_json_taken"
_FIELD = "fx_json_{}"
_ARROW = {"string": pa.string(), "double": pa.float64(), "bigint": pa.int64(), "boolean": pa.bool_()}
TEXT_KINDS = ("timestamp",)  # read as text by pyarrow, parsed by Spark's cast


def fast_types(declared: StructType) -> list[tuple[str, str]] | None:
    """The declared fields as (name, Spark type name), or None when a field has a type the fast path leaves to Spark."""
    fields = [(f.name, f.dataType.simpleString()) for f in declared.fields]
    if any(kind not in _ARROW and kind not in TEXT_KINDS for _, kind in fields):
        return None
    return fields


def decode_batches(batches: Iterator[pa.RecordBatch], fields: tuple[tuple[str, str], ...]) -> Iterator[pa.RecordBatch]:
    """Each batch (its first column the values) with the decoded fields and `TAKEN` added: where `TAKEN` is false,
    the fields are null and Spark decides the value."""
    schema = pa.schema([(name, _ARROW.get(kind, pa.string())) for name, kind in fields])
    for batch in batches:
        taken, table = parse(batch.column(0), schema)
        columns = [*batch.columns, *table.columns, pa.array(taken)]
        names = [*batch.schema.names, *(_FIELD.format(i) for i in range(len(fields))), TAKEN]
        yield pa.RecordBatch.from_arrays([_array(c) for c in columns], names=names)


def parse(values: pa.Array, schema: pa.Schema) -> tuple[np.ndarray, pa.Table]:
    """Which values the fast path takes, and the decoded rows of all values (nulls where not taken)."""
    values = values.cast(pa.binary())
    candidates = _framed(values)
    taken = np.zeros(len(values), dtype=bool)
    parts = []  # (index of each taken value, its decoded rows)
    index = np.flatnonzero(candidates)
    for chunk in np.array_split(index, max(1, len(index) // 50_000)) if len(index) else []:
        parts += _parse_slice(values, chunk, schema)
    if not parts:
        return taken, pa.table({f.name: pa.nulls(len(values), f.type) for f in schema})
    rows = np.concatenate([i for i, _ in parts])
    taken[rows] = True
    decoded = pa.concat_tables([t for _, t in parts]).combine_chunks()
    if len(rows) == len(values):  # every value taken, in order: the usual batch
        return taken, decoded
    # Each value's row in `decoded`, or past its end (a row of nulls) where not taken.
    position = np.full(len(values), len(rows), dtype=np.int64)
    position[rows] = np.arange(len(rows))
    padded = pa.concat_tables([decoded, pa.table({f.name: pa.nulls(1, f.type) for f in schema})])
    return taken, padded.take(pa.array(position)).combine_chunks()


def _framed(values: pa.Array) -> np.ndarray:
    """Values that can be parsed as one line each: present, starting with "{" and ending with "}", no longer than
    `MAX_FAST_BYTES`, with no line break inside (a line break would make one value two lines)."""
    n = len(values)
    if n == 0:
        return np.zeros(0, dtype=bool)
    offsets, data = _buffers(values)
    starts, ends = offsets[:-1], offsets[1:]
    lengths = ends - starts
    ok = (lengths >= 2) & (lengths <= MAX_FAST_BYTES)
    if values.null_count:
        ok &= ~np.asarray(values.is_null())
    first = np.where(ok, starts, 0)
    last = np.where(ok, ends - 1, 0)
    ok &= (data[first] == ord("{")) & (data[last] == ord("}"))
    breaks = np.flatnonzero((data[offsets[0] : offsets[-1]] == 10) | (data[offsets[0] : offsets[-1]] == 13))
    if len(breaks):
        ok[np.searchsorted(offsets, breaks + offsets[0], side="right") - 1] = False
    return ok


def _parse_slice(values: pa.Array, index: np.ndarray, schema: pa.Schema) -> list[tuple[np.ndarray, pa.Table]]:
    """The values at `index` parsed as lines, halving the slice wherever a value in it does not parse."""
    contiguous = index[-1] - index[0] == len(index) - 1
    table = _lines(values.slice(index[0], len(index)) if contiguous else values.take(pa.array(index)), schema)
    if table is not None:
        return [(index, table)]
    if len(index) <= SHORTEST_SLICE:
        return []
    half = len(index) // 2
    return _parse_slice(values, index[:half], schema) + _parse_slice(values, index[half:], schema)


def _lines(values: pa.Array, schema: pa.Schema) -> pa.Table | None:
    """`values` (each framed) decoded as JSON lines of `schema`, or None when one of them is not taken: invalid
    UTF-8 (Spark would replace the bytes), not a JSON object, a field of another kind or given twice."""
    try:
        values.cast(pa.string())  # validates UTF-8
    except pa.ArrowInvalid:
        return None
    offsets, data = _buffers(values)
    data = data[offsets[0] : offsets[-1]]
    joined = np.insert(data, offsets[1:] - offsets[0], ord("\n"))
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    read = pj.ReadOptions(use_threads=False, block_size=max(len(joined) + 1, 1 << 20))
    try:
        table = pj.read_json(pa.py_buffer(joined), read_options=read, parse_options=options)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    # Framing leaves no value that makes no line; one that makes two (`{...} {...}`) shows in the count.
    return table.combine_chunks() if table.num_rows == len(values) else None


def _buffers(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A binary array's offsets and bytes, without copies."""
    offsets = np.frombuffer(values.buffers()[1], dtype=np.int32, count=len(values) + 1, offset=values.offset * 4)
    data = values.buffers()[2]
    return offsets, np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, dtype=np.uint8)


def _array(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def decode(raw: DataFrame, declared: StructType, corrupt: str, columns: list[str]) -> tuple[DataFrame, Column] | None:
    """`raw`'s `value` and `columns` (Spark's Kafka rows), and a column of that frame: the value's fields as a struct
    with `corrupt` (the text of a value Spark finds corrupt), as `from_json(value, declared + corrupt)` gives it;
    or None when a declared type is one the fast path leaves to Spark."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    fields = fast_types(declared)
    if fields is None:
        return None
    kept = raw.select("value", *(c for c in columns if c != "value"))
    out = T.StructType(
        [
            *kept.schema.fields,
            *(
                T.StructField(_FIELD.format(i), T.StringType() if kind in TEXT_KINDS else f.dataType)
                for i, (f, (_, kind)) in enumerate(zip(declared.fields, fields, strict=True))
            ),
            T.StructField(TAKEN, T.BooleanType()),
        ]
    )
    mapped = kept.mapInArrow(functools.partial(decode_batches, fields=tuple(fields)), out)
    taken = F.col(TAKEN)
    parsed = []
    for i, (name, kind) in enumerate(fields):
        column = F.col(_FIELD.format(i))
        if kind in TEXT_KINDS:
            value = F.expr(f"try_cast(`{_FIELD.format(i)}` AS {kind})")
            taken = taken & (column.isNull() | value.isNotNull())
            column = value
        parsed.append(column.alias(name))
    with_corrupt = T.StructType([*declared.fields, T.StructField(corrupt, T.StringType())])
    spark_parsed = F.from_json(
        F.col("value").cast("string"), with_corrupt, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": corrupt}
    )
    struct = F.struct(*parsed, F.lit(None).cast("string").alias(corrupt))
    decoded = F.when(taken, struct).otherwise(spark_parsed)
    return mapped, decoded
