"""Per-aggregation Spark expressions for the two phases, shared by the batch and streaming engines.

Every aggregation is a mergeable partial (a monoid):
    phase1      rows of one (key, pane) -> partial          (an aggregate expression)
    merge_over  partials in a window frame -> partial       (aggregate expressions over a WindowSpec)
    merge2      partial (+) partial -> partial              (a scalar expression)
    finalize    partial -> feature value, with DESIGN.md's meaning of an empty window
All of them ignore null partials, which is how rows that carry no data (probes) pass through frames.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import Column, WindowSpec
from pyspark.sql import functions as F

from features.spec import AggKind, DType, Feature
from features.spec.aggregations import DEFAULT_HLL_LG_K, DEFAULT_KLL_K


@dataclass(frozen=True)
class Partial:
    """The Spark expressions of one feature's aggregation."""

    # (where, value, ts_us) -> aggregate; `where` is None when every row counts
    phase1: Callable[[Column | None, Column | None, Column], Column]
    merge_over: Callable[[Column, WindowSpec], Column]
    merge2: Callable[[Column, Column], Column]
    finalize: Callable[[Column], Column]
    integral: bool = False  # an exact integer sum, which can be subtracted again
    # Computed over the whole window partition before merge_over (window functions cannot nest).
    prepare: Callable[[Column, WindowSpec], Column] | None = None


def _either(a: Column, b: Column, both: Column) -> Column:
    """Merge two partials where null means 'nothing yet': the other one, or `both` when both are there."""
    return F.when(a.isNull(), b).when(b.isNull(), a).otherwise(both)


def _null_add(a: Column, b: Column) -> Column:
    return _either(a, b, a + b)


def _kept(where: Column | None, value: Column) -> Column:
    """The value on rows that pass `where`, null elsewhere (aggregates skip nulls)."""
    return value if where is None else F.when(where, value)


def _kept_item(where: Column | None, value: Column, ts: Column) -> Column:
    """(ts, value) on rows that pass `where` and hold a value; null elsewhere."""
    keep = value.isNotNull() if where is None else where & value.isNotNull()
    return F.when(keep, F.struct(ts.alias("ts"), value.alias("v")))


def _avg() -> Partial:
    def phase1(where: Column | None, value: Column | None, ts: Column) -> Column:
        x = _kept(where, value.cast("double"))  # type: ignore[union-attr]
        return F.struct(F.count(x).alias("n"), F.sum(x).alias("s"))

    return Partial(
        phase1=phase1,
        merge_over=lambda p, w: F.struct(F.sum(p["n"]).over(w).alias("n"), F.sum(p["s"]).over(w).alias("s")),
        merge2=lambda a, b: F.struct(_null_add(a["n"], b["n"]).alias("n"), _null_add(a["s"], b["s"]).alias("s")),
        finalize=lambda p: F.when(F.coalesce(p["n"], F.lit(0)) > 0, p["s"] / p["n"]),
    )


def _moments(n: Column, mean: Column, m2: Column) -> Column:
    return F.struct(n.alias("n"), mean.alias("mean"), m2.alias("m2"))


def _stddev() -> Partial:
    """Partials (n, mean, M2) as in Welford/Chan: a sum of squares would cancel catastrophically for values
    with a large mean and a small spread (balances, epoch seconds)."""

    def phase1(where: Column | None, value: Column | None, ts: Column) -> Column:
        x = _kept(where, value.cast("double"))  # type: ignore[union-attr]
        return _moments(F.count(x), F.avg(x), F.var_pop(x) * F.count(x))

    def prepare(p: Column, whole: WindowSpec) -> Column:
        # A shift constant per window partition (any pane mean will do) keeps the frame sums below small.
        return F.struct(
            p["n"].alias("n"), p["mean"].alias("mean"), p["m2"].alias("m2"), F.min(p["mean"]).over(whole).alias("c")
        )

    def merge_over(p: Column, w: WindowSpec) -> Column:
        d = p["mean"] - p["c"]
        n = F.sum(p["n"]).over(w)
        a = F.sum(p["n"] * d).over(w)
        b = F.sum(p["m2"] + p["n"] * d * d).over(w)
        return _moments(n, F.first(p["c"]).over(w) + a / n, b - a * a / n)

    def merge2(a: Column, b: Column) -> Column:
        n = a["n"] + b["n"]
        delta = b["mean"] - a["mean"]
        both = _moments(n, a["mean"] + delta * b["n"] / n, a["m2"] + b["m2"] + delta * delta * a["n"] * b["n"] / n)
        empty_a, empty_b = F.coalesce(a["n"], F.lit(0)) == 0, F.coalesce(b["n"], F.lit(0)) == 0
        return F.when(empty_a, b).when(empty_b, a).otherwise(both)

    def finalize(p: Column) -> Column:
        # max(0, .) because rounding can make a zero M2 slightly negative.
        return F.when(F.coalesce(p["n"], F.lit(0)) > 1, F.sqrt(F.greatest(F.lit(0.0), p["m2"] / (p["n"] - 1))))

    return Partial(phase1, merge_over, merge2, finalize, prepare=prepare)


def _count() -> Partial:
    return Partial(
        phase1=lambda where, value, ts: F.count(F.lit(1)) if where is None else F.count_if(where),
        merge_over=lambda p, w: F.sum(p).over(w),
        merge2=_null_add,
        finalize=lambda p: F.coalesce(p, F.lit(0)).cast("long"),
        integral=True,
    )


def _sum(dtype: DType) -> Partial:
    zero = F.lit(0) if dtype is DType.INT64 else F.lit(0.0)
    return Partial(
        phase1=lambda where, value, ts: F.sum(_kept(where, value)),  # type: ignore[arg-type]
        merge_over=lambda p, w: F.sum(p).over(w),
        merge2=_null_add,
        finalize=lambda p: F.coalesce(p, zero),
        integral=dtype is DType.INT64,
    )


def _extreme(smallest: bool) -> Partial:
    agg, pick = (F.min, F.least) if smallest else (F.max, F.greatest)
    return Partial(
        phase1=lambda where, value, ts: agg(_kept(where, value)),  # type: ignore[arg-type]
        merge_over=lambda p, w: agg(p).over(w),
        merge2=pick,  # least/greatest skip nulls
        finalize=lambda p: p,
    )


def _by_time(earliest: bool) -> Partial:
    """first/last: the extreme (ts, value) struct; comparing structs breaks timestamp ties by value."""
    extreme = _extreme(smallest=earliest)

    def phase1(where: Column | None, value: Column | None, ts: Column) -> Column:
        item = _kept_item(where, value, ts)  # type: ignore[arg-type]
        return (F.min if earliest else F.max)(item)

    return Partial(phase1, extreme.merge_over, extreme.merge2, lambda p: p["v"])


def _last_k(k: int) -> Partial:
    def newest(items: Column) -> Column:
        # Structs sort by ts, then value: newest first, ties on ts -> larger value first.
        return F.slice(F.sort_array(items, asc=False), 1, k)

    def phase1(where: Column | None, value: Column | None, ts: Column) -> Column:
        return newest(F.collect_list(_kept_item(where, value, ts)))  # type: ignore[arg-type]

    def merge_over(p: Column, w: WindowSpec) -> Column:
        return newest(F.flatten(F.collect_list(p).over(w)))

    def finalize(p: Column) -> Column:
        return F.when(F.size(p) > 0, F.transform(p, lambda item: item["v"]))

    return Partial(phase1, merge_over, lambda a, b: _either(a, b, newest(F.concat(a, b))), finalize)


def _hll(dtype: DType) -> Partial:
    def phase1(where: Column | None, value: Column | None, ts: Column) -> Column:
        # HLL sketches take integers, strings and bytes; floats and booleans are hashed by their text.
        x = value if dtype in (DType.INT64, DType.STRING) else value.cast("string")  # type: ignore[union-attr]
        return F.hll_sketch_agg(_kept(where, x), DEFAULT_HLL_LG_K)

    return Partial(
        phase1=phase1,
        merge_over=lambda p, w: F.hll_union_agg(p).over(w),
        merge2=lambda a, b: _either(a, b, F.hll_union(a, b)),
        finalize=lambda p: F.coalesce(F.hll_sketch_estimate(p), F.lit(0)).cast("long"),
    )


def _kll(quantile: float) -> Partial:
    def phase1(where: Column | None, value: Column | None, ts: Column) -> Column:
        return F.kll_sketch_agg_double(_kept(where, value.cast("double")), DEFAULT_KLL_K)  # type: ignore[union-attr]

    def finalize(p: Column) -> Column:
        n = F.kll_sketch_get_n_double(p)
        return F.when(F.coalesce(n, F.lit(0)) > 0, F.kll_sketch_get_quantile_double(p, F.lit(quantile)))

    return Partial(
        phase1=phase1,
        merge_over=lambda p, w: F.kll_merge_agg_double(p).over(w),
        merge2=lambda a, b: _either(a, b, F.kll_sketch_merge_double(a, b)),
        finalize=finalize,
    )


def partial_for(feature: Feature, input_type: DType | None) -> Partial:
    """The partial-aggregate expressions of one feature, given its input column type."""
    agg = feature.aggregation
    match agg.kind:
        case AggKind.COUNT:
            return _count()
        case AggKind.SUM:
            return _sum(agg.output_type(input_type))
        case AggKind.AVG:
            return _avg()
        case AggKind.STDDEV:
            return _stddev()
        case AggKind.MIN:
            return _extreme(smallest=True)
        case AggKind.MAX:
            return _extreme(smallest=False)
        case AggKind.FIRST:
            return _by_time(earliest=True)
        case AggKind.LAST:
            return _by_time(earliest=False)
        case AggKind.LAST_K:
            return _last_k(agg.k or 1)
        case AggKind.APPROX_COUNT_DISTINCT:
            return _hll(input_type or DType.STRING)
        case AggKind.APPROX_PERCENTILE:
            return _kll(agg.quantile if agg.quantile is not None else 0.5)
    raise AssertionError(f"unhandled aggregation {agg.kind}")  # every AggKind is matched above
