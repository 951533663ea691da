"""Request-time features applied to rows: the one function training sets, the logged model and the feature server
call (features.spec.request defines them), so that the three give the same values.

A frame holds one row per request: its request fields, each stored feature a request-time feature reads (by its
parameter name) and, for those that ask for it, `request_time`. The values come out in the declared type; a
function that raises, returns the wrong length or a value that is not of its type gives a `DataError` naming the
feature and the first failing row, never a silent null. A null input is passed on as it is (a key with no history
has null stored values): what it means is the function's to say."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
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
Columns = Mapping[str, pd.Series] | pd.DataFrame  # a frame, or its columns by name (each indexed alike)
UTC_MICROS = pd.DatetimeTZDtype("us", "UTC")  # the one form of a time; made once (a dtype's name is parsed per use)


def series_of(values: np.ndarray | pd.api.extensions.ExtensionArray, index: pd.Index) -> pd.Series:
    """`pd.Series(values, index=index, copy=False)` of a one-dimensional array already in its column type, made
    without pandas' look at what it is given (~4 us a Series instead of 11, 24 for a time): a served request's
    row makes one per input and per output, 14 for the example repo's five, which was most of what computing
    them cost beside the functions."""
    if _FAST_SERIES is not None and values.ndim == 1 and len(values) == len(index):
        return _FAST_SERIES(values, index)
    return pd.Series(values, index=index, copy=False)


def utc_array(micros: np.ndarray) -> pd.api.extensions.ExtensionArray:
    """Microseconds since the epoch (datetime64's NaT integer for none) as an array of UTC times."""
    if _FAST_SERIES is not None:
        return pd.arrays.DatetimeArray._simple_new(micros.view("M8[us]"), dtype=UTC_MICROS)
    return pd.array(micros.view("M8[us]")).tz_localize("UTC")


def _fast_series() -> Callable[[Any, pd.Index], pd.Series] | None:
    """The Series maker pandas uses for its own results, where this pandas has it and it makes what
    `pd.Series` makes; None otherwise (`series_of` then calls `pd.Series`)."""
    try:
        from pandas.core.internals import SingleBlockManager

        template = pd.Series(dtype=np.float64)

        def make(values: Any, index: pd.Index) -> pd.Series:
            return pd.Series._constructor_from_mgr(template, SingleBlockManager.from_array(values, index), [index])

        times = np.array([5, np.iinfo(np.int64).min], dtype=np.int64).view("M8[us]")
        probes = [
            (make(np.array([1.5, np.nan]), pd.RangeIndex(2)), pd.Series([1.5, np.nan])),
            (
                make(pd.arrays.DatetimeArray._simple_new(times, dtype=UTC_MICROS), pd.RangeIndex(2)),
                pd.Series(times, dtype=UTC_MICROS),
            ),
        ]
    except (ImportError, AttributeError, TypeError):  # another pandas: the public constructor
        return None
    fits = all(made.name is None and made.dtype == want.dtype and made.equals(want) for made, want in probes)
    return make if fits else None


_FAST_SERIES = _fast_series()


def add_request_features(frame: pd.DataFrame, features: Sequence[RequestFeature]) -> pd.DataFrame:
    """`frame` with one more column per request-time feature (a copy; `frame` is left as it is)."""
    return frame.assign(**{feature.name: request_values(frame, feature) for feature in features})


def request_values(frame: pd.DataFrame, feature: RequestFeature) -> pd.Series:
    """The feature's value for every row of `frame`, in its declared type, indexed as `frame`."""
    return request_column(frame, feature, frame.index)


def request_column(columns: Columns, feature: RequestFeature, index: pd.Index) -> pd.Series:
    """The feature's value for every row, from `columns` (its parameters' columns by name, each a Series indexed
    by `index`: the rows), in its declared type. Few rows or many, the function is called the same way; a frame
    need not be built around the columns (the feature server's requests are a row or a few)."""
    missing = [name for name in feature.parameters if name not in columns]
    if missing:
        raise DataError(
            f"{feature.name}: the rows have no column {missing[0]!r}, which the request-time feature reads. Fix: "
            + (
                f"give {REQUEST_TIME} (the time of each row)"
                if missing[0] == REQUEST_TIME
                else f"add {missing[0]!r} to the rows (a request field) or to the features fetched"
            )
        )
    inputs = {name: columns[name] for name in feature.parameters}
    values = _by_rows(feature, inputs, len(index)) if feature.row else _by_columns(feature, inputs, len(index))
    return _typed(feature, values, index, inputs)


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
    """The function called on each row, by position where it allows (`columns` are in its parameters' order): a
    dict of keyword arguments per row was about half of a Spark batch's time for a two-parameter test."""
    names, function = list(columns), feature.function
    values = [plain_values(column) for column in columns.values()]
    rows = (lambda: zip(*values, strict=True)) if names else (lambda: [()] * count)
    call = function if feature.positional else lambda *args: function(**dict(zip(names, args, strict=True)))
    try:
        return list(itertools.starmap(call, rows()))
    except Exception as exc:  # the rows called again one by one, to name the first that fails
        failed = exc
    for i, args in enumerate(rows()):
        try:
            call(*args)
        except Exception as exc:
            raise _failed(feature, columns, i, f"{type(exc).__name__}: {exc}") from exc
    raise _failed(feature, columns, None, f"{type(failed).__name__}: {failed}") from failed  # none fails alone


def plain_values(column: pd.Series) -> list[Any]:
    """The column's values as `_plain` gives each (None for a missing one), a whole column at a time where its
    type allows: a row function is called a million times in a training set."""
    if isinstance(column.dtype, np.dtype) and column.dtype.kind in "iub":
        return column.tolist()  # numpy integers and booleans: Python values, never missing
    if isinstance(column.dtype, np.dtype) and column.dtype.kind == "f":
        return [None if v != v else v for v in column.tolist()]  # NaN is the one value unequal to itself
    values = column.tolist()
    if set(map(type, values)) <= _PLAIN_TYPES:  # text, lists (a set's members): plain already
        return values
    return [_plain(v) for v in values]


_PLAIN_TYPES = frozenset({str, list, dict, bool, int, type(None)})  # the types `_plain` gives as they are


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
    """The function's values as a Series of the declared type, indexed by `index` (by position, as returned); the
    first value that does not fit the type is named with its row."""
    kind = feature.dtype
    if isinstance(values, list) and _types_fit(values, kind):  # a row function's values: no column of objects first
        return _from_python(values, kind, index)
    if isinstance(values, pd.Series):
        series = values if values.index is index or values.index.equals(index) else values.set_axis(index)
    elif isinstance(values, np.ndarray) and values.dtype != object:
        series = series_of(values, index)
    else:
        series = pd.Series(values if isinstance(values, list) else list(values), index=index, dtype=object)
    if _fits_as_a_whole(series, kind):
        return _cast(series, kind)
    plain = series.tolist()
    if _types_fit(plain, kind):  # Python values (a row function's): converted in one go
        return _from_python(plain, kind, index)
    bad = next((i for i, value in enumerate(plain) if not _fits(value, kind)), None)
    if bad is not None:
        raise _failed(feature, columns, bad, f"{_plain(plain[bad])!r} does not fit {kind.value}")
    return _cast(series, kind)


def _from_python(plain: list[Any], kind: DType, index: pd.Index) -> pd.Series:
    """Plain values of types that fit `kind` (`_types_fit`) in its column type."""
    if kind is DType.FLOAT64:
        return series_of(np.array(plain, dtype=np.float64), index)
    if kind is DType.BOOL:  # a row function's test: pd.array's own look at each value took 0.1 ms for one
        missing = np.array([v is None for v in plain], dtype=bool)
        values = np.array([v is not None and bool(v) for v in plain], dtype=bool)
        return series_of(pd.arrays.BooleanArray(values, missing), index)
    return pd.Series(pd.array(plain, dtype=_CAST[kind]), index=index)


def _cast(series: pd.Series, kind: DType) -> pd.Series:
    """Values that fit `kind` in its column type."""
    if kind is DType.TIMESTAMP:
        return utc_micros(series)
    if kind is DType.BOOL and series.dtype == np.bool_:  # what a comparison gives: none is missing
        return series_of(pd.arrays.BooleanArray(series.to_numpy(), np.zeros(len(series), bool)), series.index)
    if kind in _CAST:
        return series if series.dtype == _CAST[kind] else series.astype(_CAST[kind])
    return series.map(lambda v: None if _plain(v) is None else [_plain(x) for x in v])  # the list types


def utc_micros(values: pd.Series) -> pd.Series:
    """Times as UTC microseconds (naive ones are UTC); a column of datetimes converted as a whole (pd.to_datetime
    looks at each value of one: 45 ms for a Spark batch of 10,000 rows)."""
    if values.dtype == UTC_MICROS:
        return values
    if isinstance(values.dtype, pd.DatetimeTZDtype):
        values = values.dt.tz_convert("UTC")
    elif values.dtype.kind == "M":
        values = values.dt.tz_localize("UTC")
    else:
        values = pd.to_datetime(values, utc=True)
    return values.astype(UTC_MICROS)


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


# The types whose every value fits a declared type (`_fits` is asked only of the values of other types).
_FITTING_TYPES: dict[DType, frozenset[type]] = {
    DType.FLOAT64: frozenset({float, int, type(None), np.float64, np.float32, np.int64, np.int32}),
    DType.INT64: frozenset({int, type(None), np.int64, np.int32}),
    DType.STRING: frozenset({str, type(None)}),
    DType.BOOL: frozenset({bool, type(None), np.bool_}),
}


def _types_fit(values: list[Any], kind: DType) -> bool:
    """Whether every value is of a type all of whose values fit `kind` (one look per type, not per value)."""
    fitting = _FITTING_TYPES.get(kind)
    return fitting is not None and set(map(type, values)) <= fitting


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
