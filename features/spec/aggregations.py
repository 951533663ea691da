"""Aggregations (`features.agg`): what a feature computes over the rows of its window.

Every aggregation is one `Operation` entry in `OPERATIONS`: its parameters and their checks, the column types it
reads, its output type, its empty value, how the kernel receives its input, the expectations its output meets,
a plain Spark SQL form (the naive baseline the benches time) and its cost. The kernel's reduction of each entry is
`features.kernel.kinds.KINDS`, and the tests' brute-force reference `tests/reference.py`; a test checks
that all three cover the same kinds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from features.errors import DefinitionError
from features.spec.types import DType


class AggKind(Enum):
    COUNT = "count"
    SUM = "sum"
    AVG = "avg"
    MIN = "min"
    MAX = "max"
    STDDEV = "stddev"
    VARIANCE = "variance"
    SKEW = "skew"
    KURTOSIS = "kurtosis"
    FIRST = "first"
    LAST = "last"
    FIRST_K = "first_k"
    LAST_K = "last_k"
    TOP_K = "top_k"
    BOTTOM_K = "bottom_k"
    APPROX_COUNT_DISTINCT = "approx_count_distinct"
    APPROX_PERCENTILE = "approx_percentile"
    COUNT_DISTINCT = "count_distinct"
    BOUNDED_COUNT_DISTINCT = "bounded_count_distinct"
    HISTOGRAM = "histogram"
    TOP_FREQUENT = "top_frequent"
    SESSION_DURATION = "session_duration"
    SESSION_START = "session_start"
    LAST_EVENT_TIME = "last_event_time"
    DISTINCT_VALUES = "distinct_values"

    @property
    def op(self) -> Operation:
        return OPERATIONS[self]

    @property
    def empty_is_zero(self) -> bool:
        """An empty window gives 0 for these (docs/semantics.md, Empty windows)."""
        return self.op.empty is Empty.ZERO


class Empty(Enum):
    """The value of a window with no (non-null) value."""

    ZERO = "0"
    NULL = "null"
    EMPTY_MAP = "{}"
    EMPTY_LIST = "[]"  # distinct_values: a set with no member, so that membership needs no null check

    def make(self) -> Any:
        """The value itself: 0, None, or a new empty dict or list."""
        return {Empty.ZERO: 0, Empty.NULL: None, Empty.EMPTY_MAP: {}, Empty.EMPTY_LIST: []}[self]


class Expect(Enum):
    """What a feature's output satisfies by definition; the quality layer turns each into a check."""

    INTEGER = "integer"  # an integer type
    NOT_NULL = "not_null"
    NON_NEGATIVE = "non_negative"
    FINITE = "finite"
    AT_MOST_K = "at_most_k"  # bounded by the aggregation's k
    WITHIN_MIN_MAX = "within_min_max"  # between a min and a max of the same values, when the group has them
    WITHIN_MIN_MAX_ESTIMATE = "within_min_max_estimate"  # the same, up to an estimate's accuracy


SCALARS = frozenset({DType.INT64, DType.FLOAT64, DType.STRING, DType.BOOL})
NUMBERS = frozenset({DType.INT64, DType.FLOAT64})
ORDERED = frozenset({DType.INT64, DType.FLOAT64, DType.STRING})
DISCRETE = frozenset({DType.INT64, DType.STRING})  # histogram keys: exact values, no floats

_COUNTS = (Expect.INTEGER, Expect.NOT_NULL, Expect.NON_NEGATIVE)


def _int(_: DType | None) -> DType:
    return DType.INT64


def _float(_: DType | None) -> DType:
    return DType.FLOAT64


def _same(dtype: DType | None) -> DType:
    assert dtype is not None  # every aggregation with this rule reads a column (checked at construction)
    return dtype


def _list(dtype: DType | None) -> DType:
    return _same(dtype).list_of()


def _sum(dtype: DType | None) -> DType:
    return DType.INT64 if dtype is DType.INT64 else DType.FLOAT64


def _counts(_: DType | None) -> DType:
    return DType.COUNT_MAP


def _timestamp(_: DType | None) -> DType:
    return DType.TIMESTAMP


@dataclass(frozen=True)
class Operation:
    """Everything about one aggregation kind that does not depend on an engine."""

    summary: str  # what it returns, one line (the README's table)
    output: Callable[[DType | None], DType]  # the value's type, from the input column's
    empty: Empty = Empty.NULL
    column: bool = True  # reads a column (count() does not)
    inputs: frozenset[DType] = SCALARS
    k_max: int | None = None  # takes k, 1..k_max
    quantile: bool = False  # takes q, 0..1
    cast: str = "raw"  # the kernel's input: "raw" (as the source has it), "double", or "text" unless int/string
    expect: tuple[Expect, ...] = ()
    # A Spark SQL aggregate over one window's rows, the benches' naive baseline ("": none is plain enough):
    # {col} the value column with `where` applied, {keep} the `where`, {item} a non-null value with its time as
    # named_struct('t', time, 'v', value) (null for a null value), {k} and {q} the parameters.
    sql: str = ""
    cost: str = "O(1) per pane"  # what a pane keeps (the README's table)
    exact: bool = True
    session_only: bool = False  # describes the session itself: only over a Session window


OPERATIONS: dict[AggKind, Operation] = {
    AggKind.COUNT: Operation(
        "number of rows", _int, Empty.ZERO, column=False, expect=_COUNTS, sql="count_if({keep})", cost="a count"
    ),
    AggKind.SUM: Operation(
        "sum (integers stay exact int64)",
        _sum,
        Empty.ZERO,
        inputs=NUMBERS,
        expect=(Expect.NOT_NULL, Expect.FINITE),
        sql="coalesce(sum({col}), 0)",
        cost="a count and a sum",
    ),
    AggKind.AVG: Operation(
        "mean",
        _float,
        inputs=NUMBERS,
        cast="double",
        expect=(Expect.FINITE, Expect.WITHIN_MIN_MAX),
        sql="avg({col})",
        cost="a count and a sum",
    ),
    AggKind.MIN: Operation("smallest value", _same, inputs=ORDERED, sql="min({col})", cost="one value"),
    AggKind.MAX: Operation("largest value", _same, inputs=ORDERED, sql="max({col})", cost="one value"),
    AggKind.STDDEV: Operation(
        "sample standard deviation (n - 1); null below 2 values",
        _float,
        inputs=NUMBERS,
        cast="double",
        expect=(Expect.FINITE, Expect.NON_NEGATIVE),
        sql="stddev_samp({col})",
        cost="count, mean, M2",
    ),
    AggKind.VARIANCE: Operation(
        "sample variance (n - 1); null below 2 values",
        _float,
        inputs=NUMBERS,
        cast="double",
        expect=(Expect.FINITE, Expect.NON_NEGATIVE),
        sql="var_samp({col})",
        cost="count, mean, M2",
    ),
    AggKind.SKEW: Operation(
        "bias-corrected sample skewness (as pandas); null below 3 values, 0 when all are equal",
        _float,
        inputs=NUMBERS,
        cast="double",
        expect=(Expect.FINITE,),
        # try_divide: under ANSI mode (Spark 4's default) a window of 2 values would divide by zero.
        sql="try_divide(skewness({col}) * sqrt(count({col}) * (count({col}) - 1)), count({col}) - 2)",
        cost="count, mean, M2, M3, min, max",
    ),
    AggKind.KURTOSIS: Operation(
        "bias-corrected sample excess kurtosis (as pandas); null below 4 values, 0 when all are equal",
        _float,
        inputs=NUMBERS,
        cast="double",
        expect=(Expect.FINITE,),
        sql=(
            "try_divide(((count({col}) + 1) * kurtosis({col}) + 6) * (count({col}) - 1),"
            " (count({col}) - 2) * (count({col}) - 3))"
        ),
        cost="count, mean, M2, M3, M4, min, max",
    ),
    AggKind.FIRST: Operation(
        "value of the earliest event (timestamp ties: the smallest value)",
        _same,
        sql="min({item}).v",
        cost="one event",
    ),
    AggKind.LAST: Operation(
        "value of the latest event (timestamp ties: the largest value)",
        _same,
        sql="max({item}).v",
        cost="one event",
    ),
    AggKind.FIRST_K: Operation(
        "the k earliest values, oldest first",
        _list,
        k_max=1000,
        sql="transform(slice(array_sort(collect_list({item})), 1, {k}), x -> x.v)",
        cost="k events",
    ),
    AggKind.LAST_K: Operation(
        "the k latest values, newest first",
        _list,
        k_max=1000,
        sql="transform(slice(reverse(array_sort(collect_list({item}))), 1, {k}), x -> x.v)",
        cost="k events",
    ),
    AggKind.TOP_K: Operation(
        "the k largest values, largest first (duplicates kept)",
        _list,
        inputs=ORDERED,
        k_max=1000,
        sql="slice(reverse(array_sort(collect_list({col}))), 1, {k})",
        cost="k values",
    ),
    AggKind.BOTTOM_K: Operation(
        "the k smallest values, smallest first (duplicates kept)",
        _list,
        inputs=ORDERED,
        k_max=1000,
        sql="slice(array_sort(collect_list({col})), 1, {k})",
        cost="k values",
    ),
    AggKind.APPROX_COUNT_DISTINCT: Operation(
        "distinct values, counted as distinct 64-bit hashes",
        _int,
        Empty.ZERO,
        cast="text",
        expect=_COUNTS,
        sql="approx_count_distinct({col})",
        cost="8 bytes per distinct value",
        exact=False,
    ),
    AggKind.APPROX_PERCENTILE: Operation(
        "the q quantile, within 1% relative",
        _float,
        inputs=NUMBERS,
        quantile=True,
        cast="double",
        expect=(Expect.FINITE, Expect.WITHIN_MIN_MAX_ESTIMATE),
        sql="percentile_approx({col}, {q})",
        cost="a count per logarithmic bucket",
        exact=False,
    ),
    AggKind.COUNT_DISTINCT: Operation(
        "exact number of distinct values",
        _int,
        Empty.ZERO,
        expect=_COUNTS,
        sql="count(DISTINCT {col})",
        cost="each distinct value",
    ),
    AggKind.BOUNDED_COUNT_DISTINCT: Operation(
        "min(k, number of distinct values), exact",
        _int,
        Empty.ZERO,
        k_max=1_000_000,
        expect=(*_COUNTS, Expect.AT_MOST_K),
        sql="least({k}, count(DISTINCT {col}))",
        cost="each distinct value",
    ),
    AggKind.HISTOGRAM: Operation(
        "map from each distinct value (as text) to its count",
        _counts,
        Empty.EMPTY_MAP,
        inputs=DISCRETE,
        expect=(Expect.NOT_NULL,),
        cost="each distinct value and its count",
    ),
    AggKind.TOP_FREQUENT: Operation(
        "map of the k most frequent values (as text) to their counts; count ties: the smaller value",
        _counts,
        Empty.EMPTY_MAP,
        inputs=DISCRETE,
        k_max=1000,
        expect=(Expect.NOT_NULL,),
        cost="each distinct value and its count",
    ),
    AggKind.SESSION_DURATION: Operation(
        "seconds from the open session's first event to its last; null when none is open",
        _float,
        column=False,
        expect=(Expect.FINITE, Expect.NON_NEGATIVE),
        cost="its first and last event time",
        session_only=True,
    ),
    AggKind.SESSION_START: Operation(
        "the open session's first event time; null when none is open",
        _timestamp,
        column=False,
        cost="its first event time",
        session_only=True,
    ),
    AggKind.LAST_EVENT_TIME: Operation(
        "the latest event's time, to the second (the time since it is taken at request time)",
        _timestamp,
        column=False,
        cost="its latest event time",
    ),
    AggKind.DISTINCT_VALUES: Operation(
        "the distinct values as a list, smallest first: a set, for exact membership",
        _list,
        Empty.EMPTY_LIST,
        inputs=DISCRETE,
        sql="array_sort(collect_set({col}))",
        cost="each distinct value",
    ),
}


_TYPE_FIX = {
    NUMBERS: "aggregate a numeric column (integer or float)",
    ORDERED: "aggregate a number or string column",
    DISCRETE: "aggregate an integer or string column (floats have no exact values to count; bucket them first)",
    SCALARS: "aggregate a number, string or boolean column",
}


@dataclass(frozen=True)
class Aggregation:
    """An aggregation kind with its input column and parameters. Build it with `features.agg`."""

    kind: AggKind
    column: str | None = None
    quantile: float | None = None
    k: int | None = None

    def __post_init__(self) -> None:
        name, op = f"agg.{self.kind.value}", self.kind.op
        if not op.column:
            if self.column is not None:
                raise DefinitionError(
                    f"{name}.column",
                    f"{self.kind.value}() reads the rows' times, not a column",
                    f"write agg.{self.kind.value}() and filter rows with Feature(where=...)",
                )
            return
        if not isinstance(self.column, str) or not self.column.strip():
            raise DefinitionError(
                f"{name}.column", "the column name is empty", f'name a source column, e.g. {name}("amount")'
            )
        if op.quantile:
            q = self.quantile
            if not isinstance(q, int | float) or isinstance(q, bool) or not 0.0 <= q <= 1.0:
                raise DefinitionError(f"{name}.q", f"{q!r} is not a quantile", "use a number from 0 to 1, e.g. 0.95")
        if op.k_max is not None:
            k = self.k
            if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= op.k_max:
                raise DefinitionError(
                    f"{name}.k", f"{k!r} is not a valid k", f"use a whole number from 1 to {op.k_max}"
                )

    def check_input(self, dtype: DType, feature: str) -> None:
        """Raise if this aggregation cannot consume a column of `dtype`."""
        inputs = self.kind.op.inputs
        if dtype not in inputs:
            raise DefinitionError(
                f"Feature({feature!r}).aggregation",
                f"{self.kind.value} cannot aggregate column {self.column!r} of type {dtype.value}",
                f"{_TYPE_FIX[inputs]}, or pick an aggregation that accepts {dtype.value}",
            )

    def output_type(self, input_type: DType | None) -> DType:
        """The logical type of the feature value, given the input column type."""
        return self.kind.op.output(input_type)

    @property
    def empty_value(self) -> Any:
        """The value of a window with nothing to aggregate: 0, None, {} or [] (a fresh dict or list each time)."""
        return self.kind.op.empty.make()

    def describe(self) -> str:
        args = [] if self.column is None else [repr(self.column)]
        if self.quantile is not None:
            args.append(repr(self.quantile))
        if self.k is not None:
            args.append(repr(self.k))
        return f"agg.{self.kind.value}({', '.join(args)})"


class agg:  # noqa: N801 - used as a namespace: agg.count(), agg.sum("amount")
    """Constructors for every aggregation (docs/definitions.md has the table of what each returns)."""

    @staticmethod
    def count() -> Aggregation:
        """Number of rows in the window (after `where`)."""
        return Aggregation(AggKind.COUNT)

    @staticmethod
    def sum(column: str) -> Aggregation:
        return Aggregation(AggKind.SUM, column)

    @staticmethod
    def avg(column: str) -> Aggregation:
        return Aggregation(AggKind.AVG, column)

    @staticmethod
    def min(column: str) -> Aggregation:
        return Aggregation(AggKind.MIN, column)

    @staticmethod
    def max(column: str) -> Aggregation:
        return Aggregation(AggKind.MAX, column)

    @staticmethod
    def stddev(column: str) -> Aggregation:
        """Sample standard deviation (null for fewer than two values)."""
        return Aggregation(AggKind.STDDEV, column)

    @staticmethod
    def variance(column: str) -> Aggregation:
        """Sample variance, denominator n - 1 (null for fewer than two values)."""
        return Aggregation(AggKind.VARIANCE, column)

    @staticmethod
    def skew(column: str) -> Aggregation:
        """Bias-corrected sample skewness as pandas' `Series.skew()` (null below 3 values, 0 if all are equal)."""
        return Aggregation(AggKind.SKEW, column)

    @staticmethod
    def kurtosis(column: str) -> Aggregation:
        """Bias-corrected excess kurtosis as pandas' `Series.kurt()` (null below 4 values, 0 if all are equal)."""
        return Aggregation(AggKind.KURTOSIS, column)

    @staticmethod
    def first(column: str) -> Aggregation:
        """Value of the earliest event; ties on the timestamp go to the smallest value."""
        return Aggregation(AggKind.FIRST, column)

    @staticmethod
    def last(column: str) -> Aggregation:
        """Value of the latest event; ties on the timestamp go to the largest value."""
        return Aggregation(AggKind.LAST, column)

    @staticmethod
    def first_k(column: str, k: int) -> Aggregation:
        """The `k` earliest values, oldest first (ties on the timestamp: smaller value first)."""
        return Aggregation(AggKind.FIRST_K, column, k=k)

    @staticmethod
    def last_k(column: str, k: int) -> Aggregation:
        """The `k` latest values, newest first (ties on the timestamp: larger value first)."""
        return Aggregation(AggKind.LAST_K, column, k=k)

    @staticmethod
    def top_k(column: str, k: int) -> Aggregation:
        """The `k` largest values, largest first, duplicates kept."""
        return Aggregation(AggKind.TOP_K, column, k=k)

    @staticmethod
    def bottom_k(column: str, k: int) -> Aggregation:
        """The `k` smallest values, smallest first, duplicates kept."""
        return Aggregation(AggKind.BOTTOM_K, column, k=k)

    @staticmethod
    def approx_count_distinct(column: str) -> Aggregation:
        """Distinct values, counted as distinct 64-bit hashes (exact but for hash collisions: below n^2 / 2^65)."""
        return Aggregation(AggKind.APPROX_COUNT_DISTINCT, column)

    @staticmethod
    def count_distinct(column: str) -> Aggregation:
        """The exact number of distinct non-null values (a value counts while any pane holding it is in the
        window)."""
        return Aggregation(AggKind.COUNT_DISTINCT, column)

    @staticmethod
    def bounded_count_distinct(column: str, k: int) -> Aggregation:
        """min(k, the exact number of distinct non-null values)."""
        return Aggregation(AggKind.BOUNDED_COUNT_DISTINCT, column, k=k)

    @staticmethod
    def approx_percentile(column: str, q: float) -> Aggregation:
        """The `q` quantile (the value of rank ceil(q n)), estimated within 1% relative from counts per
        logarithmic bucket (a DDSketch-style mergeable sketch)."""
        return Aggregation(AggKind.APPROX_PERCENTILE, column, quantile=q)

    @staticmethod
    def session_duration() -> Aggregation:
        """Over a `Session` window: seconds from the open session's first event to its last (null if none)."""
        return Aggregation(AggKind.SESSION_DURATION)

    @staticmethod
    def session_start() -> Aggregation:
        """Over a `Session` window: the open session's first event time (null if none is open)."""
        return Aggregation(AggKind.SESSION_START)

    @staticmethod
    def last_event_time() -> Aggregation:
        """The time of the window's latest event (after `where`), rounded down to the second; null if none. At
        request time, `request_time - last_event_time` is the time since the key's last event."""
        return Aggregation(AggKind.LAST_EVENT_TIME)

    @staticmethod
    def distinct_values(column: str) -> Aggregation:
        """The window's distinct non-null values as a list, smallest first; an empty window gives []. A set: `x in
        value` is exact membership."""
        return Aggregation(AggKind.DISTINCT_VALUES, column)

    @staticmethod
    def histogram(column: str) -> Aggregation:
        """A map from each distinct value (as text) to how many times it occurs; an empty window gives {}."""
        return Aggregation(AggKind.HISTOGRAM, column)

    @staticmethod
    def top_frequent(column: str, k: int) -> Aggregation:
        """The `k` most frequent values (as text) with their counts, as a map; count ties go to the smaller
        value."""
        return Aggregation(AggKind.TOP_FREQUENT, column, k=k)
