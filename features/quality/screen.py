"""The one-pass screen: a group's derived checks (features.quality.checks) evaluated together in one Spark aggregation,
instead of the dozens of jobs Great Expectations runs for a suite. features.quality reports what it finds, and
hands a batch to Great Expectations when anything fails.

Uniqueness of (join keys, window_end) is counted in the same aggregation, without a job of its own: the rows are
grouped by a 64-bit hash of their join keys and block of window-end slots (see `_screen_plan`), each group counts
its rows and its distinct window ends, with the row conditions counted alongside, and the groups' counts are then
summed. A null window end, or two groups of one hash, counts as a duplicate, which only ever raises a
false alarm that Great Expectations clears. A uniqueness check of a single column counts distinct 64-bit hashes
in a job of its own (a hash collision, about n^2 / 2^65, is such a false alarm too).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from features.quality.checks import DerivedCheck, quoted
from features.spec import WINDOW_END

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass(frozen=True)
class _ScreenPlan:
    """The one-pass screen's aggregation: per group of `by` (none: the whole batch), `aggregates`; with `by`, the
    groups' counts summed by `sums`."""

    by: list[Any]  # column names or Spark Columns
    aggregates: list[Any]  # Spark Columns
    sums: list[Any]  # Spark Columns
    grouped: DerivedCheck | None  # the uniqueness check counted per group
    conditions: dict[str, DerivedCheck]  # output column -> row-condition check


def _screen_plan(checks: list[DerivedCheck]) -> _ScreenPlan:
    conditions = {f"_c{i}": c for i, c in enumerate(c for c in checks if c.unexpected_sql)}
    grouped = next((c for c in checks if len(c.unique) > 1), None)
    shape = (tuple(str(c.unexpected_sql) for c in conditions.values()), grouped and (grouped.unique, grouped.slot_us))
    by, aggregates, sums = _screen_columns(shape, _jvm_of_columns())
    return _ScreenPlan(by, aggregates, sums, grouped, conditions)


def _jvm_of_columns() -> int:
    """Which JVM the Spark Columns made now belong to (0 under Spark Connect, whose Columns are Python's own, also
    in a process that started a JVM of its own before)."""
    from pyspark import SparkContext
    from pyspark.sql.utils import is_remote

    return 0 if is_remote() or SparkContext._gateway is None else id(SparkContext._gateway)


@functools.lru_cache(maxsize=64)
def _screen_columns(shape: tuple[tuple[str, ...], Any], jvm: int) -> tuple[list[Any], list[Any], list[Any]]:
    """The screen's Columns for checks of this shape (their conditions, the uniqueness check's columns and slot),
    made once per JVM: a stream screens every micro-batch with the same checks, and making them (a call to the
    JVM for each function and name, some 200) took 0.08 s of each batch."""
    from pyspark.sql import functions as F

    conditions, grouped = shape
    names = [f"_c{i}" for i in range(len(conditions))]
    counted = [F.count_if(F.expr(sql)).alias(name) for name, sql in zip(names, conditions, strict=True)]
    rows = F.count(F.lit(1)).alias("_rows")
    sums = [F.coalesce(F.sum(c), F.lit(0)).alias(c) for c in ["_rows", "_distinct", *names]]
    if grouped is None:
        return [], [rows, *counted], sums
    unique, slot_us = grouped
    *by, last = unique
    if last != WINDOW_END or not slot_us:
        distinct = F.size(F.array_distinct(F.collect_list(F.col(last)))).alias("_distinct")
        return by, [rows, distinct, *counted], sums

    # Window ends as bits, grouped by a 64-bit hash of the join keys and a block of 64 slots (slot = window end /
    # slot length): the distinct ends of a group are the bits its bit_or sets. One long as the grouping key and
    # one integer aggregate, which Spark hashes, where collecting the ends in arrays falls back to sorting every
    # row, and grouping by the key columns themselves hashes and copies strings: the screen took 0.30 s instead of
    # 0.40 s on the cached rows of bench/quality.py. Two ends in one slot (an end off the grid) or two groups of
    # one hash (about g^2 / 2^65 for g groups) look like a duplicate: a false alarm, which Great Expectations clears.
    def floor_div(x: str, y: int) -> str:  # `div` rounds toward zero: before 1970, two slots would share one
        return f"(({x}) - pmod({x}, {y})) div {y}"

    slot = floor_div(f"unix_micros({quoted(WINDOW_END)})", slot_us)
    distinct = F.expr(f"bit_count(bit_or(shiftleft(1L, int(pmod({slot}, 64)))))").alias("_distinct")
    group_hash = F.xxhash64(*[F.col(quoted(k)) for k in by], F.expr(floor_div(slot, 64))).alias("_group")
    return [group_hash], [rows, distinct, *counted], sums


@dataclass(frozen=True)
class Screen:
    """What the screen found in one batch: its rows, and each check's count of rejected rows (1 for a wrong
    column type; for uniqueness, rows minus distinct combinations)."""

    rows: int
    rejected: dict[str, int]
    types: dict[str, str]  # column -> Spark type name, of the rows screened


def screen_rows(rows: DataFrame, checks: list[DerivedCheck], by: Sequence[str] = ()) -> dict[tuple[Any, ...], Screen]:
    """Screen `rows` in one Spark job: one batch, or (`by`) the batches that the values of the columns `by` tell
    apart, each screened on its own. Keyed by the values of `by` (`()` for one batch); a value no row has is
    absent."""
    plan = _screen_plan(checks)
    if plan.by:
        found = rows.groupBy(*by, *plan.by).agg(*plan.aggregates).groupBy(*by).agg(*plan.sums).collect()
    else:
        found = rows.groupBy(*by).agg(*plan.aggregates).collect()
    types = {f.name: type(f.dataType).__name__ for f in rows.schema.fields}
    screens = {}
    for row in found:
        value = tuple(row[b] for b in by)
        n = int(row["_rows"])
        counts = {c.name: int(row[name]) for name, c in plan.conditions.items()}
        for check in checks:
            if check is plan.grouped:
                counts[check.name] = n - int(row["_distinct"])
            elif check.unique:
                counts[check.name] = n - _distinct_hashes(rows, check.unique, by, value)
            elif check.column_types is not None:
                column, allowed = check.column_types
                counts[check.name] = 0 if types.get(column) in allowed else 1
        screens[value] = Screen(n, {c.name: counts[c.name] for c in checks if c.name in counts}, types)
    return screens


def _distinct_hashes(rows: DataFrame, columns: Sequence[str], by: Sequence[str], value: tuple[Any, ...]) -> int:
    from pyspark.sql import functions as F

    for column, v in zip(by, value, strict=True):
        rows = rows.where(F.col(column).eqNullSafe(v))
    found = rows.agg(F.count_distinct(F.xxhash64(*[F.col(c) for c in columns]))).first()
    return int(found[0]) if found is not None else 0
