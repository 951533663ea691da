"""Aggregations (`features.agg`): what a feature computes over the rows of its window."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from features.errors import DefinitionError
from features.spec.types import DType


class AggKind(Enum):
    COUNT = "count"
    SUM = "sum"
    AVG = "avg"
    MIN = "min"
    MAX = "max"
    STDDEV = "stddev"
    FIRST = "first"
    LAST = "last"
    APPROX_COUNT_DISTINCT = "approx_count_distinct"
    APPROX_PERCENTILE = "approx_percentile"
    LAST_K = "last_k"
    COUNT_DISTINCT = "count_distinct"

    @property
    def empty_is_zero(self) -> bool:
        """An empty window gives 0 for these and null for every other aggregation."""
        return self in (AggKind.COUNT, AggKind.SUM, AggKind.APPROX_COUNT_DISTINCT, AggKind.COUNT_DISTINCT)


_NUMERIC_ONLY = {AggKind.SUM, AggKind.AVG, AggKind.STDDEV, AggKind.APPROX_PERCENTILE}
_ORDERABLE = {AggKind.MIN, AggKind.MAX}
_SCALAR_INPUTS = {DType.INT64, DType.FLOAT64, DType.STRING, DType.BOOL}


@dataclass(frozen=True)
class Aggregation:
    """An aggregation kind with its input column and parameters. Build it with `features.agg`."""

    kind: AggKind
    column: str | None = None
    quantile: float | None = None
    k: int | None = None

    def __post_init__(self) -> None:
        name = f"agg.{self.kind.value}"
        if self.kind is AggKind.COUNT:
            if self.column is not None:
                raise DefinitionError(
                    f"{name}.column",
                    "count() counts rows and takes no column",
                    "write agg.count() and filter rows with Feature(where=...)",
                )
            return
        if not isinstance(self.column, str) or not self.column.strip():
            raise DefinitionError(
                f"{name}.column", "the column name is empty", f'name a source column, e.g. {name}("amount")'
            )
        if self.kind is AggKind.APPROX_PERCENTILE:
            q = self.quantile
            if not isinstance(q, int | float) or isinstance(q, bool) or not 0.0 <= q <= 1.0:
                raise DefinitionError(f"{name}.q", f"{q!r} is not a quantile", "use a number from 0 to 1, e.g. 0.95")
        if self.kind is AggKind.LAST_K:
            k = self.k
            if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 1000:
                raise DefinitionError(f"{name}.k", f"{k!r} is not a list length", "use a whole number from 1 to 1000")

    def check_input(self, dtype: DType, feature: str) -> None:
        """Raise if this aggregation cannot consume a column of `dtype`."""
        ok = dtype in _SCALAR_INPUTS
        if self.kind in _NUMERIC_ONLY:
            ok = dtype.is_numeric
        elif self.kind in _ORDERABLE:
            ok = dtype in (DType.INT64, DType.FLOAT64, DType.STRING)
        if not ok:
            raise DefinitionError(
                f"Feature({feature!r}).aggregation",
                f"{self.kind.value} cannot aggregate column {self.column!r} of type {dtype.value}",
                "aggregate a numeric column, or pick an aggregation that accepts this type",
            )

    def output_type(self, input_type: DType | None) -> DType:
        """The logical type of the feature value, given the input column type."""
        kind = self.kind
        if kind in (AggKind.COUNT, AggKind.APPROX_COUNT_DISTINCT, AggKind.COUNT_DISTINCT):
            return DType.INT64
        if kind in (AggKind.AVG, AggKind.STDDEV, AggKind.APPROX_PERCENTILE):
            return DType.FLOAT64
        assert input_type is not None  # every other kind has a column, checked at construction
        if kind is AggKind.SUM:
            return DType.INT64 if input_type is DType.INT64 else DType.FLOAT64
        if kind is AggKind.LAST_K:
            return input_type.list_of()
        return input_type

    def describe(self) -> str:
        args = [] if self.column is None else [repr(self.column)]
        if self.quantile is not None:
            args.append(repr(self.quantile))
        if self.k is not None:
            args.append(repr(self.k))
        return f"agg.{self.kind.value}({', '.join(args)})"


class agg:  # noqa: N801 - used as a namespace: agg.count(), agg.sum("amount")
    """Constructors for every aggregation."""

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
    def first(column: str) -> Aggregation:
        """Value of the earliest event; ties on the timestamp go to the smallest value."""
        return Aggregation(AggKind.FIRST, column)

    @staticmethod
    def last(column: str) -> Aggregation:
        """Value of the latest event; ties on the timestamp go to the largest value."""
        return Aggregation(AggKind.LAST, column)

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
    def approx_percentile(column: str, q: float) -> Aggregation:
        """The `q` quantile (the value of rank ceil(q n)), estimated within 1% relative from counts per
        logarithmic bucket (a DDSketch-style mergeable sketch)."""
        return Aggregation(AggKind.APPROX_PERCENTILE, column, quantile=q)

    @staticmethod
    def last_k(column: str, k: int) -> Aggregation:
        """The `k` latest values, newest first (ties on the timestamp: larger value first)."""
        return Aggregation(AggKind.LAST_K, column, k=k)
