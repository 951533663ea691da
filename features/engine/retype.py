"""A Parquet file's columns in a source schema's Arrow types, read by pyarrow: how a file holding a column as Arrow's
null type (pandas' type of a column of None alone) is read, in a backfill and in a stream alike
(features.engine.files.null_rows), since Spark's vectorized reader refuses such a column as a string, a boolean or a
timestamp. The file has conformed to the schema first (features.engine.files.nonconformity: each column it holds
converts without loss), so each conversion here is the one Spark's reader makes of a file that has the column's
type: integers widened, float32 to float64, dictionary and large strings to strings, any timestamp to microseconds
in UTC (a naive time taken as UTC, nanoseconds truncated towards the past, as features.engine.source reads them).
A column the file lacks, or holds as the null type, is nulls of the schema's type.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

# Microseconds per unit of a Parquet timestamp, as (multiply, floor-divide).
_TO_MICROS = {"s": (1_000_000, 1), "ms": (1_000, 1), "us": (1, 1), "ns": (1, 1_000)}


def retyped_columns(table: pa.Table, fields: Sequence[pa.Field]) -> list[pa.Array]:
    """`table`'s columns as `fields` give them (matched by name ignoring case, as Spark matches a file's columns):
    each cast to its field's type, timestamps to microseconds, a missing or null-typed one all nulls."""
    by_name = {name.lower(): name for name in table.column_names}
    columns = []
    for field in fields:
        name = by_name.get(field.name.lower())
        found = None if name is None else table.column(name).combine_chunks()
        if found is None or pa.types.is_null(found.type):
            columns.append(pa.nulls(table.num_rows, field.type))
        elif pa.types.is_timestamp(field.type):
            columns.append(_in_micros(found).cast(field.type))
        else:
            columns.append(found.cast(field.type))
    return columns


def _in_micros(stamps: pa.Array) -> pa.Array:
    """A timestamp column as int64 microseconds since the epoch (UTC), truncated towards the past."""
    scale, divisor = _TO_MICROS[stamps.type.unit]
    raw = stamps.cast(pa.int64())
    values = np.floor_divide(raw.fill_null(0).to_numpy() * scale, divisor)
    return pa.array(values, pa.int64(), mask=raw.is_null().to_numpy(zero_copy_only=False))
