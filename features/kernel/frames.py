"""The kernel's input events as pandas, every integer exact, and how an aggregation reads a value column.

Arrow's own conversion (`Table.to_pandas`) turns an integer column that holds a null into float64, which rounds
every value above 2^53 and hashes 5 as 5.0: the same merchant id would then be another value in a batch (or a
file, or a micro-batch) that happens to hold a null. So both engines convert a kernel call's events with
`events_frame`, which keeps such a column as integers with a validity mask (pandas' nullable `Int64`), and every
aggregation reads its value column through `column_values`, which hands it int64 values and that mask whatever
form the column came in. Columns without nulls, the common case, convert exactly as before.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from features.spec import DType


def events_frame(table: pa.Table) -> pd.DataFrame:
    """`table` as pandas, as `to_pandas` converts it, but for integer columns holding a null: those become
    nullable `Int64` columns (int64 values and a mask) instead of float64 ones."""
    nullable = [
        name for name, column in zip(table.column_names, table.columns, strict=True) if _nullable_integers(column)
    ]
    if not nullable:
        return table.to_pandas()
    frame = table.drop_columns(nullable).to_pandas()
    for name in nullable:
        frame.insert(table.column_names.index(name), name, _masked_integers(table[name]))
    return frame


def _nullable_integers(column: pa.ChunkedArray) -> bool:
    return pa.types.is_integer(column.type) and column.null_count > 0


def _masked_integers(column: pa.ChunkedArray) -> pd.arrays.IntegerArray:
    values = pc.fill_null(column, 0).cast(pa.int64()).to_numpy()
    return pd.arrays.IntegerArray(values, pc.is_null(column).to_numpy())


def column_values(column: pd.Series, dtype: DType | None) -> tuple[np.ndarray, np.ndarray]:
    """(values, valid) of a value column: a numpy array and a mask of its non-null entries. An INT64 column's
    values are int64 (null entries 0); a FLOAT64 column's float64 (null entries NaN); others as they are."""
    if dtype is DType.INT64:
        return _integers(column)
    if dtype is DType.FLOAT64:
        values = column.to_numpy(dtype=np.float64, na_value=np.nan)
        return values, ~np.isnan(values)
    values = column.to_numpy()
    return values, ~pd.isna(values)


def _integers(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    kind = column.dtype.kind if isinstance(column.dtype, np.dtype) else None
    if kind in ("i", "u"):  # no null: the fast path, no copy for int64
        values = column.to_numpy().astype(np.int64, copy=False)
        return values, np.ones(len(values), dtype=bool)
    if pd.api.types.is_integer_dtype(column.dtype):  # nullable integers (events_frame's, or Arrow-backed)
        return column.to_numpy(dtype=np.int64, na_value=0), column.notna().to_numpy()
    if kind == "O" and pd.api.types.infer_dtype(column, skipna=True) in ("integer", "empty"):  # Python ints, None
        valid = column.notna().to_numpy()
        values = np.zeros(len(column), dtype=np.int64)
        values[valid] = column.to_numpy()[valid].astype(np.int64)
        return values, valid
    # A float column here lost its integers already (one above 2^53 is rounded): refused, never summed or hashed.
    raise TypeError(
        f"kernel input {column.name!r} holds int64 values as {column.dtype}, which rounds integers above 2^53; "
        "convert Arrow input with features.kernel.events_frame"
    )
