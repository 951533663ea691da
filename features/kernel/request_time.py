"""Request-time features applied to rows: the one function training sets, the logged model and the feature server
call (features.spec.request defines them), so that the three give the same values.

A frame holds one row per request: its request fields, each stored feature a request-time feature reads (by its
parameter name) and, for those that ask for it, `request_time`. The values come out in the declared type; a
function that raises, returns the wrong length or a value that is not of its type gives a `DataError` naming the
feature and the first failing row, never a silent null. A null input is passed on as it is (a key with no history
has null stored values): what it means is the function's to say."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd

from features.errors import DataError
from features.spec.request import REQUEST_TIME, RequestFeature
from features.spec.types import DType

FIRST_FAILING_LOOKS = 10_000  # rows tried one by one to name the one a failing function fails on
_CAST = {
    DType.INT64: "Int64",
    DType.FLOAT64: "float64",
    DType.STRING: "string",
    DType.BOOL: "boolean",
}


def add_request_features(frame: pd.DataFrame, features: Sequence[RequestFeature]) -> pd.DataFrame:
    """`frame` with one more column per request-time feature (a copy; `frame` is left as it is)."""
    out = frame.copy()
    for feature in features:
        out[feature.name] = request_values(frame, feature)
    return out


def request_values(frame: pd.DataFrame, feature: RequestFeature) -> pd.Series:
    """The feature's value for every row of `frame`, in its declared type, indexed as `frame`."""
    missing = [name for name in feature.parameters if name not in frame.columns]
    if missing:
        raise DataError(
            f"{feature.name}: the rows have no column {missing[0]!r}, which the request-time feature reads. Fix: "
            + (
                f"give {REQUEST_TIME} (the time of each row)"
                if missing[0] == REQUEST_TIME
                else f"add {missing[0]!r} to the rows (a request field) or to the features fetched"
            )
        )
    columns = {name: frame[name] for name in feature.parameters}
    values = _by_rows(feature, columns, len(frame)) if feature.row else _by_columns(feature, columns, len(frame))
    return _typed(feature, values, frame.index, columns)


def _by_columns(feature: RequestFeature, columns: dict[str, pd.Series], count: int) -> Any:
    try:
        values = feature.function(**columns)
    except Exception as exc:
        raise _failed(feature, columns, _first_failing(feature, columns), f"{type(exc).__name__}: {exc}") from exc
    if np.isscalar(values) or values is None:
        raise DataError(
            f"{feature.name}: the function returned one value ({values!r}), not a column of {count} values. Fix: "
            "compute with the columns it is given (pandas Series), or declare it with row=True to be called per row"
        )
    if len(values) != count:
        raise DataError(
            f"{feature.name}: the function returned {len(values)} values for {count} rows. Fix: return one value "
            "per row, in the rows' order"
        )
    return values


def _by_rows(feature: RequestFeature, columns: dict[str, pd.Series], count: int) -> list[Any]:
    lists = {name: column.tolist() for name, column in columns.items()}
    out = []
    for i in range(count):
        row = {name: _plain(values[i]) for name, values in lists.items()}
        try:
            out.append(feature.function(**row))
        except Exception as exc:
            raise _failed(feature, columns, i, f"{type(exc).__name__}: {exc}") from exc
    return out


def _first_failing(feature: RequestFeature, columns: dict[str, pd.Series]) -> int | None:
    """The first row on which the vectorized function fails alone, for the error (None: it fails only as a
    whole)."""
    for i in range(min(len(next(iter(columns.values()), [])), FIRST_FAILING_LOOKS)):
        try:
            feature.function(**{name: column.iloc[i : i + 1] for name, column in columns.items()})
        except Exception:  # the row that raises alone is the one to name
            return i
    return None


def _typed(feature: RequestFeature, values: Any, index: pd.Index, columns: dict[str, pd.Series]) -> pd.Series:
    series = values.reset_index(drop=True) if isinstance(values, pd.Series) else pd.Series(list(values), dtype=object)
    kind = feature.dtype
    if not _fits_as_a_whole(series, kind):
        bad = next((i for i, value in enumerate(series.tolist()) if not _fits(value, kind)), None)
        if bad is not None:
            why = f"{_plain(series.iloc[bad])!r} does not fit {kind.value}"
            raise _failed(feature, columns, bad, why)
    series.index = index
    if kind is DType.TIMESTAMP:
        return pd.to_datetime(series, utc=True).astype("datetime64[us, UTC]")
    if kind in _CAST:
        return series.astype(_CAST[kind])
    return series.map(lambda v: None if _plain(v) is None else [_plain(x) for x in v])  # the list types


def _fits_as_a_whole(series: pd.Series, kind: DType) -> bool:
    """Whether the column's own type is the declared one (no value need be looked at)."""
    held = series.dtype.kind
    if kind is DType.FLOAT64:
        return held in "iuf"
    if kind is DType.INT64:
        return held in "iu"
    if kind is DType.BOOL:
        return held == "b"
    if kind is DType.TIMESTAMP:
        return held == "M"
    return False


_ELEMENT = {DType.INT64_LIST: DType.INT64, DType.FLOAT64_LIST: DType.FLOAT64, DType.STRING_LIST: DType.STRING}


def _fits(value: Any, kind: DType) -> bool:
    plain = _plain(value) if not isinstance(value, list | tuple | np.ndarray) else value
    if plain is None:
        return True
    if kind is DType.FLOAT64:
        return isinstance(plain, int | float) and not isinstance(plain, bool)
    if kind is DType.INT64:
        return (isinstance(plain, int) and not isinstance(plain, bool)) or (
            isinstance(plain, float) and plain.is_integer()
        )
    if kind is DType.STRING:
        return isinstance(plain, str)
    if kind is DType.BOOL:
        return isinstance(plain, bool)
    if kind is DType.TIMESTAMP:
        return isinstance(plain, datetime)
    element = _ELEMENT.get(kind)
    return (
        element is not None and isinstance(plain, list | tuple | np.ndarray) and all(_fits(v, element) for v in plain)
    )


def _failed(feature: RequestFeature, columns: dict[str, pd.Series], row: int | None, why: str) -> DataError:
    if row is None:
        where = "on the rows as a whole"
    else:
        shown = ", ".join(f"{name}={_plain(column.iloc[row])!r}" for name, column in columns.items())
        where = f"at row {row} ({shown})"
    return DataError(
        f"{feature.name}: the request-time feature failed {where}: {why}. Fix: make the function give a "
        f"{feature.dtype.value} for every row (a null input comes from a key with no history, or a missing field)"
    )


def _plain(value: Any) -> Any:
    """A plain Python value for a row function and an error (None for pandas' missing markers)."""
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, float) and np.isnan(value):
        return None
    if isinstance(value, pd.Timestamp):
        return value.to_pydatetime()
    if isinstance(value, np.generic):
        return value.item()
    return value
