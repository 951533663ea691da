"""Brute-force reference of docs/semantics.md: what every feature value means.

Written straight from the definition, slow and obvious, with no Spark and no `features.kernel.panes`:

    value(k, t) = AGG over rows r with key k, where(r) true, event_ts(r) in [E - size, E)
    E = floor(t / every) * every        (integer microseconds since the epoch, UTC)

Lifetime windows read (-inf, E). A Session window reads the key's session open at E: its rows before E (after
`where`) in time order, split wherever two consecutive ones are `gap` or more apart; the last run, if its last
row is less than `gap` before E. Nulls (None, NaN, NaT) in the value column are ignored; count() counts
rows. (A float NaN is a null here, as it is once pandas writes it to Parquet or Spark reads it from pandas.)
An empty window gives 0 for count, sum and the distinct counts, {} for histogram and top_frequent, [] for
distinct_values, and None for everything else.
Rows whose timestamp or key is null belong to no window.

`where` is a Spark SQL condition, evaluated here with SQL's three-valued logic (a comparison with null is
unknown, NOT unknown is unknown, only true keeps a row), which pandas' own query() would get wrong for
`NOT (amount > 100)` or `status != 'FAILED'` over null values. Supported: comparisons (= == != <> < <= > >=)
between columns and literals, AND, OR, NOT, parentheses, IS [NOT] NULL, [NOT] IN (...),
[NOT] BETWEEN ... AND ..., TRUE, FALSE, boolean columns. Anything else raises ValueError.
"""

from __future__ import annotations

import bisect
import functools
import math
import operator
import re
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from features import Feature, FeatureGroup
from features.spec import AggKind
from features.spec.aggregations import Empty

MICROS = 1_000_000
_EPOCH = pd.Timestamp(0, tz="UTC")
_ONE_US = pd.Timedelta(microseconds=1)
# approx_percentile's documented accuracy: within 1% of the exact value, relative (features.agg.approx_percentile)
PERCENTILE_RELATIVE_ERROR = 0.01
_NEVER_NULL = {kind for kind in AggKind if kind.op.empty is not Empty.NULL}


# ---------------------------------------------------------------------------------------------------------
# Time


@functools.lru_cache(maxsize=1 << 16)  # lookups ask for the same times again and again
def to_micros(t: pd.Timestamp | str) -> int:
    """Microseconds since the epoch (floor); a naive timestamp is read as UTC."""
    ts = pd.Timestamp(t)
    ts = ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")
    return (ts - _EPOCH) // _ONE_US


def window_bounds_us(feature: Feature, t: pd.Timestamp | str) -> tuple[int | None, int]:
    """[lo, hi) in microseconds of the events that make the feature's value at t; lo is None for Lifetime."""
    every = feature.window.every_s * MICROS
    end = (to_micros(t) // every) * every  # Python's // is a true floor, also before 1970
    if feature.window.size_s is None:
        return None, end
    return end - feature.window.size_s * MICROS, end


def _event_micros(events: pd.DataFrame, column: str) -> pd.Series:
    """Each row's timestamp in microseconds (floor), as Python ints; None where the timestamp is null."""
    stamps = pd.to_datetime(events[column], utc=True)
    return pd.Series(
        [None if pd.isna(s) else (s - _EPOCH) // _ONE_US for s in stamps], index=events.index, dtype=object
    )


# ---------------------------------------------------------------------------------------------------------
# `where`: a small Spark SQL condition evaluator with three-valued logic


@dataclass(frozen=True)
class _Truth:
    """A SQL boolean per row: `known` False means unknown (null); `value` is True only where known."""

    value: np.ndarray
    known: np.ndarray

    def __and__(self, other: _Truth) -> _Truth:
        known_false = (self.known & ~self.value) | (other.known & ~other.value)
        return _Truth(self.value & other.value, (self.known & other.known) | known_false)

    def __or__(self, other: _Truth) -> _Truth:
        known_true = self.value | other.value
        return _Truth(known_true, (self.known & other.known) | known_true)

    def __invert__(self) -> _Truth:
        return _Truth(self.known & ~self.value, self.known)


@dataclass(frozen=True)
class _Operand:
    """A column or a literal, broadcast to one Python value per row."""

    values: np.ndarray  # dtype object
    null: np.ndarray

    @classmethod
    def literal(cls, value: object, n: int) -> _Operand:
        values = np.empty(n, dtype=object)
        values[:] = [value] * n
        return cls(values, np.full(n, value is None))

    def truth(self) -> _Truth:
        present = self.values[~self.null]
        if not all(isinstance(v, bool | np.bool_) for v in present):
            raise ValueError("reference where: a non-boolean column or literal is used as a condition")
        value = np.zeros(len(self.values), dtype=bool)
        value[~self.null] = present.astype(bool)
        return _Truth(value, ~self.null)


_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "=": operator.eq,
    "==": operator.eq,
    "!=": operator.ne,
    "<>": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_KEYWORDS = {"AND", "OR", "NOT", "IS", "NULL", "IN", "BETWEEN", "TRUE", "FALSE"}
_TOKEN = re.compile(
    r"""\s*(?:
        (?P<string>'(?:[^']|'')*')
      | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
      | (?P<name>`[^`]+`|[A-Za-z_][A-Za-z0-9_]*)
      | (?P<symbol><=|>=|<>|!=|==|=|<|>|\(|\)|,|-)
    )""",
    re.VERBOSE,
)


def _tokenize(text: str) -> list[tuple[str, str]]:
    tokens, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        match = _TOKEN.match(text, pos)
        if match is None:
            raise ValueError(f"reference where: cannot read {text[pos:]!r} in {text!r}")
        kind = match.lastgroup or ""
        word = match.group(kind)
        if kind == "name" and word.upper() in _KEYWORDS:
            kind, word = "keyword", word.upper()
        tokens.append((kind, word))
        pos = match.end()
    return tokens


class _Where:
    """Recursive descent over the tokens, evaluating as it goes (every branch over every row)."""

    def __init__(self, text: str, frame: pd.DataFrame) -> None:
        self.text = text
        self.frame = frame
        self.tokens = _tokenize(text)
        self.pos = 0

    def evaluate(self) -> np.ndarray:
        truth = self._or()
        if self.pos != len(self.tokens):
            self._fail(f"unexpected {self.tokens[self.pos][1]!r}")
        return truth.value & truth.known  # only true keeps a row

    # -- helpers
    def _fail(self, problem: str) -> None:
        raise ValueError(f"reference where: {problem} in {self.text!r} (unsupported or invalid)")

    def _peek(self, word: str) -> bool:
        return self.pos < len(self.tokens) and self.tokens[self.pos][1] == word

    def _take(self, word: str) -> bool:
        if self._peek(word):
            self.pos += 1
            return True
        return False

    def _expect(self, word: str) -> None:
        if not self._take(word):
            self._fail(f"expected {word!r}")

    # -- grammar: or > and > not > predicate, as in SQL
    def _or(self) -> _Truth:
        truth = self._and()
        while self._take("OR"):
            truth = truth | self._and()
        return truth

    def _and(self) -> _Truth:
        truth = self._not()
        while self._take("AND"):
            truth = truth & self._not()
        return truth

    def _not(self) -> _Truth:
        if self._take("NOT"):
            return ~self._not()
        return self._predicate()

    def _predicate(self) -> _Truth:
        if self._take("("):
            truth = self._or()
            self._expect(")")
            return truth
        left = self._operand()
        if self.pos < len(self.tokens) and self.tokens[self.pos][1] in _COMPARE:
            op = _COMPARE[self.tokens[self.pos][1]]
            self.pos += 1
            return _compare(left, self._operand(), op)
        if self._take("IS"):
            negate = self._take("NOT")
            self._expect("NULL")
            truth = _Truth(left.null.copy(), np.ones(len(left.null), dtype=bool))
            return ~truth if negate else truth
        negate = self._take("NOT")
        if self._take("IN"):
            truth = self._in(left)
        elif self._take("BETWEEN"):
            low = self._operand()
            self._expect("AND")
            truth = _compare(left, low, operator.ge) & _compare(left, self._operand(), operator.le)
        elif negate:
            self._fail("NOT must be followed by IN or BETWEEN here")
        elif self.pos < len(self.tokens) and not self._peek("AND") and not self._peek("OR") and not self._peek(")"):
            self._fail(f"unexpected {self.tokens[self.pos][1]!r}")
        else:
            return left.truth()
        return ~truth if negate else truth

    def _in(self, left: _Operand) -> _Truth:
        self._expect("(")
        options = [self._literal()]
        while self._take(","):
            options.append(self._literal())
        self._expect(")")
        if any(v is None for v in options):
            self._fail("NULL inside IN (...)")
        value = np.array([not null and v in options for v, null in zip(left.values, left.null, strict=True)])
        return _Truth(value.astype(bool), ~left.null)

    def _operand(self) -> _Operand:
        if self.pos >= len(self.tokens):
            self._fail("the condition ends early")
        kind, word = self.tokens[self.pos]
        if kind == "name":
            self.pos += 1
            return self._column(word.strip("`"))
        return _Operand.literal(self._literal(), len(self.frame))

    def _literal(self) -> object:
        negative = self._take("-")
        if self.pos >= len(self.tokens):
            self._fail("the condition ends early")
        kind, word = self.tokens[self.pos]
        self.pos += 1
        if kind == "number":
            number = float(word) if any(c in word for c in ".eE") else int(word)
            return -number if negative else number
        if negative:
            self._fail("'-' before something that is not a number")
        if kind == "string":
            return word[1:-1].replace("''", "'")
        if word in ("TRUE", "FALSE", "NULL"):
            return {"TRUE": True, "FALSE": False, "NULL": None}[word]
        self._fail(f"unexpected {word!r}")
        return None  # unreachable: _fail raises

    def _column(self, name: str) -> _Operand:
        # Spark resolves column names case-insensitively by default.
        matches = [c for c in self.frame.columns if c == name] or [
            c for c in self.frame.columns if str(c).lower() == name.lower()
        ]
        if len(matches) != 1:
            self._fail(f"unknown column {name!r}")
        series = self.frame[matches[0]]
        return _Operand(series.to_numpy(dtype=object), series.isna().to_numpy())


def _compare(left: _Operand, right: _Operand, op: Callable[[Any, Any], Any]) -> _Truth:
    """A comparison is unknown when either side is null."""
    known = ~(left.null | right.null)
    value = np.zeros(len(known), dtype=bool)
    for i in np.flatnonzero(known):
        value[i] = bool(op(left.values[i], right.values[i]))
    return _Truth(value, known)


def where_mask(events: pd.DataFrame, where: str | None) -> np.ndarray:
    """Which rows a Spark SQL `where` keeps (True only where the condition is true, not null)."""
    if where is None:
        return np.ones(len(events), dtype=bool)
    return _Where(where, events.reset_index(drop=True)).evaluate()


# ---------------------------------------------------------------------------------------------------------
# Windows and aggregations


def _native(value: object) -> object:
    """A numpy scalar as the plain Python value (int, float, str, bool)."""
    return value.item() if isinstance(value, np.generic) else value


def _is_null(value: object) -> bool:
    return value is None or value is pd.NA or value is pd.NaT or (isinstance(value, float) and math.isnan(value))


# One row a feature can read: its event time in microseconds and its value column's value (None for count()).
_Row = tuple[int, object]


@dataclass(frozen=True)
class _FeatureRows:
    """The rows a feature can ever read (where true, timestamp present), split by key, as plain (time, value)
    tuples: each lookup scans its key's rows in Python, with no pandas indexing per lookup."""

    feature: Feature
    by_key: dict[tuple[object, ...], list[_Row]]
    integral: bool  # an integer value column: sums stay integers


def _prepare(events: pd.DataFrame, group: FeatureGroup, feature_name: str) -> _FeatureRows:
    feature = group.feature(feature_name)
    rows = events.reset_index(drop=True)
    rows = rows[where_mask(rows, feature.where)].copy()
    rows["_ts_us"] = _event_micros(rows, group.source.timestamp)
    rows = rows[rows["_ts_us"].notna()]
    keys = list(group.join_keys)
    column = feature.aggregation.column
    by_key = {}
    for key, part in rows.groupby(keys, dropna=True, sort=False):
        values = part[column] if column is not None else [None] * len(part)
        by_key[tuple(_native(k) for k in key)] = [
            (ts, _native(v)) for ts, v in zip(part["_ts_us"], values, strict=True)
        ]
    integral = column is not None and _integral(events[column])
    return _FeatureRows(feature, by_key, integral)


def _integral(column: pd.Series) -> bool:
    """An integer column: int64, nullable `Int64`, or Python ints with None (object), whose sums stay integers. (An
    object column of ints is not an integer dtype: its sums would go through floats, rounding above 2^53.)"""
    return pd.api.types.is_integer_dtype(column) or pd.api.types.infer_dtype(column, skipna=True) == "integer"


def _as_key(key: object) -> tuple[object, ...]:
    return tuple(key) if isinstance(key, tuple | list) else (key,)


def _window_rows(prepared: _FeatureRows, key: object, t: pd.Timestamp | str) -> list[_Row]:
    rows = prepared.by_key.get(_as_key(key), [])
    lo, hi = window_bounds_us(prepared.feature, t)
    inside = [row for row in rows if (lo is None or lo <= row[0]) and row[0] < hi]
    if prepared.feature.window.gap_s is not None:
        return _open_session(inside, hi, prepared.feature.window.gap_s * MICROS)
    return inside


def _open_session(rows: list[_Row], end: int, gap: int) -> list[_Row]:
    """The rows (all before `end`) of the session open at `end`: the last run of rows in time order whose
    consecutive times are less than `gap` apart, if its last time is less than `gap` before `end`; else none."""
    times = sorted(ts for ts, _ in rows)
    if not times or end - times[-1] >= gap:
        return []
    first = len(times) - 1
    while first > 0 and times[first] - times[first - 1] < gap:
        first -= 1
    return [row for row in rows if row[0] >= times[first]]


def _pairs(rows: list[_Row]) -> list[_Row]:
    """(timestamp, value) of every non-null value in the window."""
    return [row for row in rows if not _is_null(row[1])]


def _aggregate(prepared: _FeatureRows, rows: list[_Row]) -> object:
    aggregation = prepared.feature.aggregation
    kind = aggregation.kind
    if kind is AggKind.COUNT:
        return len(rows)
    if kind in (AggKind.SESSION_START, AggKind.SESSION_DURATION):
        if len(rows) == 0:
            return None
        first, last = min(ts for ts, _ in rows), max(ts for ts, _ in rows)
        if kind is AggKind.SESSION_DURATION:
            return (last - first) / MICROS
        return pd.Timestamp(first - first % MICROS, unit="us", tz="UTC")  # to the whole second, as Feast keeps it
    if kind is AggKind.LAST_EVENT_TIME:  # every row's time counts, whatever its values
        if len(rows) == 0:
            return None
        last = max(ts for ts, _ in rows)
        return pd.Timestamp(last - last % MICROS, unit="us", tz="UTC")  # rounded down to the second
    pairs = _pairs(rows)
    values = [v for _, v in pairs]
    if kind is AggKind.SUM:
        return sum(values) if prepared.integral else math.fsum(values)  # fsum: the correctly rounded sum
    if kind in (AggKind.APPROX_COUNT_DISTINCT, AggKind.COUNT_DISTINCT):
        return len(set(values))
    if kind is AggKind.BOUNDED_COUNT_DISTINCT:
        return min(aggregation.k, len(set(values)))
    if kind in (AggKind.HISTOGRAM, AggKind.TOP_FREQUENT):
        return _counts(values, aggregation)
    if kind is AggKind.DISTINCT_VALUES:
        return sorted(set(values))  # a set, smallest first; [] for no value
    if not values:
        return None
    return _FOLD[kind](values, pairs, aggregation)


def _avg(values: list[Any], pairs: list[tuple[int, Any]], aggregation: Any) -> float:
    total = sum(values) if all(isinstance(v, int) for v in values) else math.fsum(values)
    return total / len(values)


def _stddev(values: list[Any], pairs: list[tuple[int, Any]], aggregation: Any) -> float | None:
    return float(statistics.stdev(values)) if len(values) >= 2 else None  # sample stddev, exact arithmetic


def _percentile(values: list[Any], pairs: list[tuple[int, Any]], aggregation: Any) -> float:
    return float(np.quantile(np.array(sorted(values), dtype=float), aggregation.quantile, method="inverted_cdf"))


def _last_k(values: list[Any], pairs: list[tuple[int, Any]], aggregation: Any) -> list[Any]:
    newest_first = sorted(pairs, key=lambda p: (p[0], p[1]), reverse=True)  # ties: larger value first
    return [v for _, v in newest_first[: aggregation.k]]


def _first_k(values: list[Any], pairs: list[tuple[int, Any]], aggregation: Any) -> list[Any]:
    oldest_first = sorted(pairs, key=lambda p: (p[0], p[1]))  # ties: smaller value first
    return [v for _, v in oldest_first[: aggregation.k]]


def _moment(statistic: str, least: int) -> Callable[[list[Any], list[tuple[int, Any]], Any], float | None]:
    """pandas' own bias-corrected skew / kurt (or the sample variance) of the exact values: the contract's
    definition; null below `least` values."""

    def fold(values: list[Any], pairs: list[tuple[int, Any]], aggregation: Any) -> float | None:
        if len(values) < least:
            return None
        if statistic == "var":
            return float(statistics.variance(values))  # exact arithmetic, denominator n - 1
        if len(set(values)) == 1:
            return 0.0
        series = pd.Series(values, dtype="float64")
        return float(series.skew() if statistic == "skew" else series.kurt())

    return fold


def _counts(values: list[Any], aggregation: Any) -> dict[str, int]:
    """histogram: {value's text: count} in value order; top_frequent: the k most frequent, count ties to the
    smaller value."""
    counted = sorted(Counter(values).items())
    if aggregation.kind is AggKind.TOP_FREQUENT:
        counted = sorted(counted, key=lambda item: -item[1])[: aggregation.k]  # stable: ties stay in value order
    return {str(value): count for value, count in counted}


_FOLD: dict[AggKind, Callable[[list[Any], list[tuple[int, Any]], Any], object]] = {
    AggKind.AVG: _avg,
    AggKind.MIN: lambda values, pairs, a: min(values),
    AggKind.MAX: lambda values, pairs, a: max(values),
    AggKind.STDDEV: _stddev,
    AggKind.FIRST: lambda values, pairs, a: min(pairs, key=lambda p: (p[0], p[1]))[1],  # ties: smallest
    AggKind.LAST: lambda values, pairs, a: max(pairs, key=lambda p: (p[0], p[1]))[1],  # ties: largest
    AggKind.APPROX_PERCENTILE: _percentile,
    AggKind.LAST_K: _last_k,
    AggKind.FIRST_K: _first_k,
    AggKind.TOP_K: lambda values, pairs, a: sorted(values, reverse=True)[: a.k],
    AggKind.BOTTOM_K: lambda values, pairs, a: sorted(values)[: a.k],
    AggKind.VARIANCE: _moment("var", 2),
    AggKind.SKEW: _moment("skew", 3),
    AggKind.KURTOSIS: _moment("kurt", 4),
}


# ---------------------------------------------------------------------------------------------------------
# Public API


def reference_value(
    events: pd.DataFrame, group: FeatureGroup, feature_name: str, key: tuple[object, ...], t: pd.Timestamp
) -> object:
    """The exact value of one feature for one key at time t (Python int/float/str/bool/list, or None).

    Each call rescans `events`; for many lookups use `reference_frame`, which prepares the rows once.

    approx_count_distinct is the exact distinct count; approx_percentile is the exact lower quantile
    (numpy method="inverted_cdf"); judge an estimate with `percentile_ok`.
    """
    prepared = _prepare(events, group, feature_name)
    return _aggregate(prepared, _window_rows(prepared, key, t))


def reference_window_values(
    events: pd.DataFrame, group: FeatureGroup, feature_name: str, key: tuple[object, ...], t: pd.Timestamp
) -> list[Any]:
    """The sorted non-null values of the feature's column inside its window for (key, t)."""
    prepared = _prepare(events, group, feature_name)
    if prepared.feature.aggregation.column is None:
        raise ValueError(f"feature {feature_name!r} is a count() and reads no column")
    return sorted(v for _, v in _pairs(_window_rows(prepared, key, t)))


def percentile_ok(estimate: float, exact: float) -> bool:
    """An approx_percentile estimate is within the documented relative accuracy of the exact quantile."""
    return abs(estimate - exact) <= PERCENTILE_RELATIVE_ERROR * abs(exact) * (1 + 1e-9)


def rank_error(sorted_values: Sequence[Any], estimate: float, q: float) -> float:
    """How far `estimate` is from being a q-quantile of `sorted_values`, in normalized rank.

    The estimate sits at every rank r from rank_lo (values below it) to rank_hi (values at or below it),
    since values may tie; the error is the smallest |r/n - q| over that range.
    """
    n = len(sorted_values)
    if n == 0:
        raise ValueError("rank_error needs at least one value")
    rank_lo = bisect.bisect_left(sorted_values, estimate)
    rank_hi = bisect.bisect_right(sorted_values, estimate)
    closest = min(max(q * n, rank_lo), rank_hi)
    return abs(closest / n - q)


def reference_frame(
    events: pd.DataFrame, group: FeatureGroup, keys_and_times: list[tuple[tuple[object, ...], pd.Timestamp]]
) -> pd.DataFrame:
    """One row per (key, t): the join-key columns, `t` (UTC) and every feature of the group.

    Features that are never null (count, sum, approx_count_distinct) get int64 / float64 columns; every
    other feature is an object column of exact Python values, with None for null.
    """
    prepared = [_prepare(events, group, feature.name) for feature in group.features]
    columns: dict[str, list[object]] = {name: [] for name in [*group.join_keys, "t"]}
    columns.update({rows_of.feature.name: [] for rows_of in prepared})
    for key, t in keys_and_times:
        for name, part in zip(group.join_keys, _as_key(key), strict=True):
            columns[name].append(part)
        columns["t"].append(pd.Timestamp(to_micros(t), unit="us", tz="UTC"))
        for rows_of in prepared:
            columns[rows_of.feature.name].append(_aggregate(rows_of, _window_rows(rows_of, key, t)))
    frame = pd.DataFrame({name: pd.Series(columns[name], dtype=object) for name in group.join_keys})
    frame["t"] = pd.Series(columns["t"], dtype="datetime64[us, UTC]")
    for rows_of in prepared:
        # Built straight in its final dtype, so that None stays None in the object columns.
        frame[rows_of.feature.name] = pd.Series(columns[rows_of.feature.name], dtype=_column_dtype(rows_of))
    return frame


def _column_dtype(prepared: _FeatureRows) -> str:
    kind = prepared.feature.aggregation.kind
    if kind not in _NEVER_NULL or kind.op.empty in (Empty.EMPTY_MAP, Empty.EMPTY_LIST):
        return "object"
    if kind is AggKind.SUM and not prepared.integral:
        return "float64"
    return "int64"
