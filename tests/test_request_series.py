"""The Series request-time features are given and give: `series_of` (features.kernel.request_time), made without
pandas' look at the array it is given, is the one `pd.Series` makes, on this pandas and on the public constructor
it falls back to; one moment for all rows (the server's and the logged model's when no row has a time) is that
moment."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pytest

import features.kernel.request_time as kernel
from features.kernel.request_time import UTC_MICROS, series_of, utc_array
from features.spec.request import RequestFeature
from features.stores.request_inputs import request_columns_of_values, request_times

NAT = np.iinfo(np.int64).min


def arrays(rows: int) -> list[np.ndarray | pd.api.extensions.ExtensionArray]:
    """One array of each type a served row's inputs and outputs take, and of some a function may return, `rows`
    long."""
    micros = np.array([1_767_225_600_000_000 + i if i % 2 else NAT for i in range(rows)], dtype=np.int64)
    return [
        np.array([1.5 if i % 2 else np.nan for i in range(rows)]),
        np.arange(rows, dtype=np.int64),
        np.array([i % 2 == 0 for i in range(rows)], dtype=bool),
        np.array(["m1" if i % 2 else None for i in range(rows)], dtype=object),
        np.array(["m1"] * rows),  # numpy's text: pandas makes it objects
        np.arange(rows, dtype=np.int32),
        np.arange(rows).astype("M8[ns]"),
        pd.arrays.BooleanArray(np.ones(rows, bool), np.array([i % 3 == 0 for i in range(rows)], dtype=bool)),
        utc_array(micros),
    ]


@pytest.mark.parametrize("fast", [True, False], ids=["pandas' own maker", "public constructor"])
@pytest.mark.parametrize("rows", [0, 1, 3])
def test_series_of_makes_what_pd_series_makes(monkeypatch, fast: bool, rows: int) -> None:
    if not fast:
        monkeypatch.setattr(kernel, "_FAST_SERIES", None)
    elif kernel._FAST_SERIES is None:
        pytest.skip("this pandas has no maker of its own: series_of is the public constructor")
    index = pd.RangeIndex(5, 5 + rows)
    for values in arrays(rows):
        made = series_of(values, index)
        pd.testing.assert_series_equal(made, pd.Series(values, index=index), check_exact=True)
        assert made.name is None and made.index is index
    times = series_of(arrays(rows)[-1], index)
    assert times.dtype == UTC_MICROS and times.isna().tolist() == [i % 2 == 0 for i in range(rows)]


def test_series_of_an_array_not_of_one_dimension_is_refused_as_pd_series_refuses_it() -> None:
    with pytest.raises(ValueError, match="1-dimensional"):
        series_of(np.zeros((2, 2)), pd.RangeIndex(2))


@pytest.mark.parametrize(
    "moment",
    [
        datetime(2026, 1, 2, 3, 4, 5, 678_901, tzinfo=UTC),
        datetime(2026, 1, 2, 3, 4, 5, 678_901, tzinfo=timezone(timedelta(hours=-5))),
        datetime(1969, 12, 31, 23, 59, 59, 1, tzinfo=UTC),
        datetime(2026, 1, 2, 3, 4, 5, 678_901),  # naive: UTC
        pd.Timestamp("2026-01-02 03:04:05.678901", tz="Europe/Paris"),
    ],
)
def test_one_moment_for_all_rows_is_that_moment(moment: datetime) -> None:
    """A moment's microseconds were once read from pandas' nanoseconds: the server's "now" was in the year 57973."""
    want = pd.Timestamp(moment).tz_localize("UTC") if moment.tzinfo is None else pd.Timestamp(moment).tz_convert("UTC")
    times = request_times(moment, pd.RangeIndex(3))
    assert times.dtype == UTC_MICROS and times.tolist() == [want] * 3
    echo = RequestFeature("echo", lambda request_time: request_time, dtype="timestamp")
    served = request_columns_of_values({}, [echo], {}, moment, 2)["echo"]
    assert served.tolist() == [want] * 2
