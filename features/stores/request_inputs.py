"""Request-time features on rows read from any store: their inputs put in one form, then computed by the one
function, `features.kernel.request_time.request_column`.

Training sets (Feast's join, the Spark join), the logged model (online values), the feature server (Feast's JSON)
and Feast's on-demand views each hold the stored values in their own form: numpy arrays or lists, pandas or Python
timestamps, JSON epoch seconds, null or the empty window's value. `request_columns` gives each stored input the
form `fill_empty` gives a training set (by its `filled_column`: the empty-window value, Python lists and dicts,
integers as int64 or Int64), timestamps as UTC `datetime64[us, UTC]`, and each request field its declared type, so
that a function sees the same values wherever it runs, and gives the same value (docs/definitions.md, "Request-time
features"); `request_columns_of_values` does the same from a list of Python values per column (the feature
server's JSON, Feast's python-mode views).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd

from features.errors import ConfigError, RequestFieldError
from features.kernel.request_time import UTC_MICROS, Columns, request_column, series_of, utc_array, utc_micros
from features.repo import Repo
from features.spec.request import REQUEST_TIME, RequestFeature
from features.spec.types import DType
from features.stores.feature_refs import FeatureColumn, empty_value, filled_column, filled_lists

_ELEMENTS = {DType.INT64_LIST: DType.INT64, DType.FLOAT64_LIST: DType.FLOAT64, DType.STRING_LIST: DType.STRING}


def request_features_of(
    repo: Repo, wanted: Sequence[str | RequestFeature] | str | RequestFeature
) -> list[RequestFeature]:
    """Request-time features by name (the repo's `RequestFeature`s) or as objects, checked against the repo's
    groups, in order, each once."""
    if isinstance(wanted, str | RequestFeature):
        wanted = [wanted]
    out: dict[str, RequestFeature] = {}
    for item in wanted:
        if isinstance(item, RequestFeature):
            item.check_against(repo.groups)
            feature = item
        else:
            found = repo.request_features.get(str(item))
            if found is None:
                known = ", ".join(sorted(repo.request_features)) or "none"
                raise ConfigError(
                    f"request_features: {item!r} is no request-time feature of {repo.root} (it defines {known}). "
                    "Fix: name one of those, or pass the RequestFeature itself"
                )
            feature = found
        if out.setdefault(feature.name, feature) is not feature:
            raise ConfigError(
                f"request_features: two request-time features are named {feature.name!r}. Fix: ask for each once"
            )
    return list(out.values())


def input_refs(features: Sequence[RequestFeature]) -> list[str]:
    """The stored features ("group:feature") the request-time features read, in order of first use."""
    return list(dict.fromkeys(s.ref for f in features for s in f.features))


def request_fields(features: Sequence[RequestFeature]) -> dict[str, DType]:
    """Every request field the features read, with its type; a ConfigError if two declare one field apart."""
    fields: dict[str, DType] = {}
    for feature in features:
        for field, dtype in feature.request.items():
            if fields.setdefault(field, dtype) is not dtype:
                raise ConfigError(
                    f"request_features: the field {field!r} is {fields[field].value} for one request-time feature "
                    f"and {dtype.value} for {feature.name!r}. Fix: declare it with one type in each"
                )
    return fields


def with_request_features(
    frame: pd.DataFrame,
    features: Sequence[RequestFeature],
    stored: Mapping[str, FeatureColumn],
    times: pd.Series | datetime | None,
) -> pd.DataFrame:
    """`frame` (one row per request: the request fields and the stored inputs, the column of each ref in `stored`)
    with one more column per request-time feature (a copy). `times`: each row's request time (a Series aligned
    with the frame, or one moment for all), for the features that take `request_time`."""
    return frame.assign(**request_columns(frame, features, stored, times, frame.index))


def request_columns(
    columns: Columns,
    features: Sequence[RequestFeature],
    stored: Mapping[str, FeatureColumn],
    times: pd.Series | datetime | None,
    index: pd.Index,
) -> dict[str, pd.Series]:
    """Each request-time feature's column (by its name) from `columns`: the rows' request fields and stored inputs
    by name (a frame, or Series indexed by `index`), each put in one form first (see the module's docstring)."""
    _check_read(columns, stored)
    inputs = {ref: stored_input(columns[c.name], c) for ref, c in stored.items()}
    fields = {field: typed_request_field(columns, field, dtype) for field, dtype in request_fields(features).items()}
    return _applied(features, inputs, fields, times, index)


def request_columns_of_values(
    values: Mapping[str, Sequence[Any]],
    features: Sequence[RequestFeature],
    stored: Mapping[str, FeatureColumn],
    times: pd.Series | datetime | None,
    rows: int,
) -> dict[str, pd.Series]:
    """`request_columns` for rows given as Python values, a list per column by name (a feature server's request
    and Feast's JSON answer, a Feast python-mode view's inputs): each list put in the one form directly, numbers
    and times by numpy, with no column of Python objects made first (a request's row costs little more than the
    functions: pandas takes ~10 us for each object it makes)."""
    _check_read(values, stored)
    index = pd.RangeIndex(rows)
    inputs = {ref: stored_input_of(values[c.name], c, index) for ref, c in stored.items()}
    fields = {
        field: typed_field_values(values[_field(values, field, dtype)], field, dtype, index)
        for field, dtype in request_fields(features).items()
    }
    return _applied(features, inputs, fields, times, index)


def _check_read(columns: Columns | Mapping[str, Any], stored: Mapping[str, FeatureColumn]) -> None:
    absent = [(ref, c.name) for ref, c in stored.items() if c.name not in columns]
    if absent:
        raise ConfigError(f"request_features: the rows have no column {absent[0][1]!r} ({absent[0][0]}), which is read")


def _applied(
    features: Sequence[RequestFeature],
    inputs: dict[str, pd.Series],
    fields: dict[str, pd.Series],
    times: pd.Series | datetime | None,
    index: pd.Index,
) -> dict[str, pd.Series]:
    """Each feature's column by the one function, from its inputs in the one form."""
    if any(f.wants_request_time for f in features):
        fields[REQUEST_TIME] = request_times(times, index)
    out = {}
    for feature in features:
        given = {name: fields[name] for name in feature.request} | {s.name: inputs[s.ref] for s in feature.features}
        if feature.wants_request_time:
            given[REQUEST_TIME] = fields[REQUEST_TIME]
        out[feature.name] = request_column(given, feature, index)
    return out


def stored_input(values: pd.Series, column: FeatureColumn) -> pd.Series:
    """A stored input in the one form: as `filled_column` fills it, a time as UTC (null where there is none, a
    time's empty value), from a datetime, its text or JSON's epoch seconds."""
    if column.dtype is not DType.TIMESTAMP:
        return filled_column(values, column)
    if values.dtype.kind in "iuf":
        return utc_series(_micros_of_seconds(values.to_numpy(dtype=np.float64)), values.index)
    if values.dtype.kind == "O" and len(values) and all(isinstance(v, int | float) for v in values.dropna()):
        return utc_series(_micros_of_seconds(pd.to_numeric(values).to_numpy(dtype=np.float64)), values.index)
    return utc_micros(values)


_NUMPY_TYPES = {DType.FLOAT64: np.float64, DType.INT64: np.int64}


def stored_input_of(values: Sequence[Any], column: FeatureColumn, index: pd.Index) -> pd.Series:
    """`stored_input` of Python values (JSON's, Feast's): numbers and times in numpy first (a double's null as
    NaN, a time from epoch seconds or a datetime), which `stored_input` fills without looking at each value."""
    if column.dtype is DType.TIMESTAMP:
        micros = _micros_of(values)
        if micros is not None:
            return utc_series(micros, index)
    elif column.dtype.name.endswith("_LIST"):  # one column made, not one of the given lists and one of their copies
        return filled_lists(values, column, index)
    elif column.dtype in _NUMPY_TYPES:
        try:
            if column.dtype is DType.INT64 and None in values:  # a key with no row: a count's 0, or pandas' Int64
                empty = empty_value(column)
                if empty is None:
                    return pd.Series(pd.array(values, dtype="Int64"), index=index)
                values = [empty if v is None else v for v in values]
            return stored_input(series_of(np.array(values, dtype=_NUMPY_TYPES[column.dtype]), index), column)
        except (TypeError, ValueError, OverflowError):  # not all numbers: the column of objects says what they are
            pass
    return stored_input(pd.Series(values, index=index, dtype=object), column)


_NONE = type(None)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_NAT = np.iinfo(np.int64).min  # NaT as datetime64's integer


def _micros_of(values: Sequence[Any]) -> np.ndarray | None:
    """Times as integer microseconds since the epoch (`_NAT` for none) from epoch seconds (JSON) or datetimes with
    a time zone (Feast's); None for values of other types (text: pandas parses those)."""
    types = set(map(type, values))
    if types <= {int, float, _NONE}:
        return _micros_of_seconds(np.array(values, dtype=np.float64))
    if types <= {datetime, _NONE} and all(v is None or v.tzinfo is not None for v in values):
        return np.array([_NAT if v is None else (v - _EPOCH) // _MICROSECOND for v in values], dtype=np.int64)
    return None


def _micros_of_seconds(seconds: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(seconds), _NAT, np.round(seconds * 1e6)).astype(np.int64)


def utc_series(micros: np.ndarray, index: pd.Index) -> pd.Series:
    """Microseconds since the epoch (`_NAT` for none) as a column of UTC times."""
    return series_of(utc_array(micros), index)


def request_times(times: pd.Series | datetime | None, index: pd.Index) -> pd.Series:
    if times is None:
        raise ConfigError(f"request_features: no {REQUEST_TIME} for features that take it")
    if isinstance(times, pd.Series):
        times = utc_micros(times)
        return times if times.index.equals(index) else times.set_axis(index)  # by position
    if type(times) is datetime and times.tzinfo is not None:  # the server's and the model's now: a tenth of the
        micros = (times - _EPOCH) // _MICROSECOND  # time pandas takes below
    else:
        moment = pd.Timestamp(times)
        moment = moment.tz_localize("UTC") if moment.tzinfo is None else moment.tz_convert("UTC")
        micros = moment.as_unit("us").value // 1_000  # `value` is in nanoseconds, whatever the unit
    return utc_series(np.full(len(index), micros, dtype=np.int64), index)


_FIXES = {
    DType.FLOAT64: "send a number",
    DType.INT64: "send a whole number",
    DType.STRING: "send a string",
    DType.BOOL: "send true or false",
    DType.TIMESTAMP: "send an ISO-8601 time (e.g. 2026-01-02T10:00:00Z) or epoch seconds",
}


def typed_request_field(columns: Columns, field: str, dtype: DType) -> pd.Series:
    """The request field's column in its declared type (null where it is missing); a RequestFieldError naming the
    field and the first row whose value is not of that type."""
    values = columns[_field(columns, field, dtype)]
    kind = values.dtype.kind
    if dtype is DType.FLOAT64 and kind in "iuf":
        return values.astype("float64")
    if dtype is DType.INT64 and kind in "iu":
        return values.astype("Int64")
    if dtype is DType.BOOL and kind == "b":
        return values.astype("boolean")
    if dtype is DType.TIMESTAMP and kind == "M":
        return utc_micros(values)
    return typed_field_values(values.tolist(), field, dtype, values.index)


def _field(columns: Columns | Mapping[str, Any], field: str, dtype: DType) -> str:
    """The field, a RequestFieldError if the rows have no such column."""
    if field not in columns:
        raise RequestFieldError(
            field, "missing: a request-time feature reads this request field", f"add {field!r} ({dtype.value})"
        )
    return field


def typed_field_values(given: Sequence[Any], field: str, dtype: DType, index: pd.Index) -> pd.Series:
    """`typed_request_field` of Python values (a list per field, as JSON gives them), indexed by `index`."""
    types = set(map(type, given))  # one look per type where all values of the types fit: converted in one go
    if dtype is DType.FLOAT64 and types <= _NUMBERS:
        return series_of(np.array(given, dtype=np.float64), index)
    if dtype is DType.STRING and types <= _TEXTS:
        return series_of(np.array(given, dtype=object), index)
    if dtype is DType.TIMESTAMP and types <= {datetime, _NONE}:
        micros = _micros_of(given)  # Feast's datetimes in one go; text and JSON's seconds value by value below
        if micros is not None:
            return utc_series(micros, index)
    plain = [_as_field_value(v, dtype) for v in given]
    bad = next((i for i, v in enumerate(plain) if v is _WRONG), None)
    if bad is not None:
        shown = given[bad]
        shown = shown.item() if isinstance(shown, np.generic) else shown
        raise RequestFieldError(
            f"{field}.{bad}",
            f"{shown!r} is not a {dtype.value} (the request field's declared type)",
            _FIXES.get(dtype, f"send a list of {_ELEMENTS.get(dtype, dtype).value} values") + f" for {field!r}",
        )
    if dtype is DType.FLOAT64:
        return pd.Series(plain, index=index, dtype="float64")
    if dtype is DType.INT64:
        return pd.Series(pd.array(plain, dtype="Int64"), index=index)
    if dtype is DType.BOOL:
        return pd.Series(pd.array(plain, dtype="boolean"), index=index)
    if dtype is DType.TIMESTAMP:
        return pd.Series(pd.to_datetime(plain, utc=True), index=index).astype(UTC_MICROS)
    return pd.Series(plain, index=index, dtype=object)


_WRONG = object()
_NUMBERS = frozenset({float, int, type(None)})  # what a double field takes as its number (None: missing)
_TEXTS = frozenset({str, type(None)})


def _as_field_value(value: Any, dtype: DType) -> Any:
    """The value as a plain Python value of the type, None for a missing one, `_WRONG` when it is not of it."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or value is pd.NA or value is pd.NaT or (isinstance(value, float) and np.isnan(value)):
        return None
    if isinstance(value, bool):
        return value if dtype is DType.BOOL else _WRONG
    if dtype is DType.FLOAT64:
        return float(value) if isinstance(value, int | float) else _WRONG
    if dtype is DType.INT64:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value if isinstance(value, int) else _WRONG
    if dtype is DType.STRING:
        return value if isinstance(value, str) else _WRONG
    if dtype is DType.TIMESTAMP:
        if isinstance(value, int | float):
            return pd.Timestamp(value, unit="s", tz="UTC")
        try:
            moment = pd.Timestamp(value)
        except (TypeError, ValueError):
            return _WRONG
        return moment.tz_localize("UTC") if moment.tzinfo is None else moment
    element = _ELEMENTS.get(dtype)
    if element is None or not isinstance(value, list | tuple | np.ndarray):
        return _WRONG
    items = [_as_field_value(v, element) for v in value]
    return _WRONG if any(v is _WRONG for v in items) else items
