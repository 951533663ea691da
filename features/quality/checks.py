"""The expectations derived from a FeatureGroup's definitions, and the user's own: what every batch of feature
rows is checked against (features.quality validates; features.quality.screen evaluates the derived ones in one pass).

The derived suite:
- every join key and `window_end` is never null;
- (join keys, window_end) is unique;
- `window_end` lies on the grid of some feature's `every` (epoch-aligned), or is the start of the range the
  batch was computed for (the engine's snapshot row there); in a whole table, such a row off the grid must
  repeat the key's previous values (or be its first row);
- counts and distinct counts are integer columns, never null, never negative (a bounded one at most its k);
- sums (never null), averages, standard deviations, variances, skews and kurtoses are finite, standard deviations
  and variances are not negative; histograms and top_frequent maps are never null;
- an average lies between the min and the max of the same column, window and filter (when the group has
  them), up to float rounding; an approx_percentile lies between them exactly.

Each derived check carries how the screen evaluates it: a Spark SQL condition true on exactly the rows the
expectation rejects (the same SQL Great Expectations runs), a uniqueness, or a column type.
"""

from __future__ import annotations

import copy
import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from features.errors import DefinitionError
from features.kernel.quantiles import ALPHA
from features.spec import WINDOW_END, AggKind, Feature, FeatureGroup
from features.spec.aggregations import Empty, Expect

if TYPE_CHECKING:
    from great_expectations.core import ExpectationSuite

MICROS = 1_000_000
FINITE = sys.float_info.max  # "finite" = between -FINITE and FINITE (NaN and +-inf are not)
AVG_TOLERANCE = 1e-9  # relative float rounding an average may show against the min/max of the same values
INTEGER_TYPES = ("LongType", "IntegerType", "ShortType", "ByteType")
ORIGIN = "features"  # key in an expectation's meta: {"check": ..., "group": ...} for derived ones
UNEXPECTED_ROWS = "unexpected_rows_expectation"
ALIGNED = f"aligned({WINDOW_END})"
# approx_percentile's estimate is within ALPHA of the exact quantile (features.kernel.quantiles)
PERCENTILE_SLACK = ALPHA / (1 - ALPHA) * (1 + 1e-9)


@dataclass(frozen=True)
class ExpectationSpec:
    """A Great Expectations expectation, built only when Great Expectations evaluates it: importing Great
    Expectations costs a cold process seconds, and a batch the one-pass screen passes never needs it."""

    kind: str  # its class in great_expectations.expectations
    kwargs: Mapping[str, Any]  # its arguments, description and meta included

    @property
    def expectation_type(self) -> str:
        """Great Expectations' name of the type, e.g. expect_column_values_to_not_be_null."""
        return re.sub(r"(?<!^)(?=[A-Z])", "_", self.kind).lower()

    @property
    def description(self) -> str:
        return str(self.kwargs["description"])

    def build(self) -> Any:
        import great_expectations.expectations as gxe

        return getattr(gxe, self.kind)(**copy.deepcopy(dict(self.kwargs)))


def _spec(kind: str, **kwargs: Any) -> ExpectationSpec:
    return ExpectationSpec(kind, kwargs)


@dataclass(frozen=True)
class DerivedCheck:
    """One expectation derived from the definitions, with how the one-pass screen evaluates it."""

    name: str  # short, stable: "not_null(user_id)", "finite(amount_sum_1h)", ...
    spec: ExpectationSpec
    unexpected_sql: str | None = None  # Spark SQL condition, true on exactly the rows the expectation rejects
    unique: tuple[str, ...] = ()  # columns whose combination must be unique
    slot_us: int = 0  # for unique (keys, window_end): a length every window end is a multiple of (0: none)
    column_types: tuple[str, tuple[str, ...]] | None = None  # (column, Spark type names allowed)

    @property
    def expectation(self) -> Any:
        """The Great Expectations Expectation (a new one each time: a suite takes ownership of what it holds)."""
        return self.spec.build()


def quoted(column: str) -> str:
    """A column name as Spark SQL reads it."""
    return f"`{column}`"


def _grid_us(group: FeatureGroup) -> list[int]:
    """The distinct `every` of the features, without those that are multiples of another (implied by it)."""
    everys = sorted({f.window.every_s * MICROS for f in group.features})
    return [e for e in everys if not any(e != o and e % o == 0 for o in everys)]


def _on_grid_sql(group: FeatureGroup) -> str:
    ends = f"unix_micros({quoted(WINDOW_END)})"
    return " OR ".join(f"pmod({ends}, {every}) = 0" for every in _grid_us(group))


def _grid_text(group: FeatureGroup) -> str:
    from features.spec.durations import format_duration

    return ", ".join(format_duration(every // MICROS) for every in _grid_us(group))


def _alignment(group: FeatureGroup, range_start: datetime | None, table: bool) -> DerivedCheck:
    off_grid = f"{quoted(WINDOW_END)} IS NOT NULL AND NOT ({_on_grid_sql(group)})"
    grid = _grid_text(group)
    if table:
        # A backfill that starts off the grid leaves a snapshot row per key at its start: the key's first row,
        # or one that repeats the key's previous values. Anything else off the grid is wrong.
        keys = ", ".join(quoted(k) for k in group.join_keys)
        over = f"OVER (PARTITION BY {keys} ORDER BY {quoted(WINDOW_END)})"
        same = " AND ".join(f"(lag({quoted(f.name)}) {over} <=> {quoted(f.name)})" for f in group.features)
        query = (
            f"SELECT * FROM (SELECT *, row_number() {over} AS __features_row, ({same}) AS __features_repeat "
            f"FROM {{batch}}) WHERE {off_grid} AND __features_row > 1 AND NOT __features_repeat"
        )
        description = (
            f"{WINDOW_END} is on the grid of a feature's every ({grid}), or is a range-start row that repeats "
            "the key's previous values"
        )
        return DerivedCheck(ALIGNED, _unexpected_rows(query, description, group, ALIGNED))
    condition = off_grid
    description = f"{WINDOW_END} is on the grid of a feature's every ({grid})"
    if range_start is not None:
        start_us = _micros(range_start)
        condition += f" AND {quoted(WINDOW_END)} <> timestamp_micros({start_us})"
        description += f" or is the range start {range_start.astimezone(UTC).isoformat()}"
    query = f"SELECT * FROM {{batch}} WHERE {condition}"
    return DerivedCheck(ALIGNED, _unexpected_rows(query, description, group, ALIGNED), unexpected_sql=condition)


def _micros(t: datetime) -> int:
    t = t if t.tzinfo is not None else t.replace(tzinfo=UTC)
    return int(t.timestamp()) * MICROS + t.microsecond


def _meta(group: FeatureGroup, check: str) -> dict[str, Any]:
    return {ORIGIN: {"group": group.name, "check": check}}


def _unexpected_rows(query: str, description: str, group: FeatureGroup, check: str) -> ExpectationSpec:
    return _spec(
        "UnexpectedRowsExpectation", unexpected_rows_query=query, description=description, meta=_meta(group, check)
    )


def _not_null(group: FeatureGroup, column: str, description: str) -> DerivedCheck:
    name = f"not_null({column})"
    spec = _spec("ExpectColumnValuesToNotBeNull", column=column, description=description, meta=_meta(group, name))
    return DerivedCheck(name, spec, unexpected_sql=f"{quoted(column)} IS NULL")


def _between(
    group: FeatureGroup, name: str, column: str, low: float | None, high: float | None, description: str
) -> DerivedCheck:
    kwargs: dict[str, Any] = {}
    inside = []
    if low is not None:
        kwargs["min_value"] = low
        inside.append(f"{quoted(column)} >= {low!r}")
    if high is not None:
        kwargs["max_value"] = high
        inside.append(f"{quoted(column)} <= {high!r}")
    spec = _spec(
        "ExpectColumnValuesToBeBetween", column=column, description=description, meta=_meta(group, name), **kwargs
    )
    # As in Great Expectations on Spark: nulls are skipped, NaN compares above everything (so it is outside).
    condition = f"{quoted(column)} IS NOT NULL AND NOT ({' AND '.join(inside)})"
    return DerivedCheck(name, spec, unexpected_sql=condition)


def _same_values(a: Feature, b: Feature) -> bool:
    """Whether two features aggregate the same rows (column, window and filter)."""
    return (a.aggregation.column, a.window, a.where) == (b.aggregation.column, b.window, b.where)


def _companions(group: FeatureGroup, feature: Feature, kind: AggKind) -> Feature | None:
    for other in group.features:
        if other.aggregation.kind is kind and _same_values(other, feature):
            return other
    return None


def derived_checks(
    group: FeatureGroup, *, range_start: datetime | None = None, table: bool = False
) -> list[DerivedCheck]:
    """The checks that follow from the group's definitions (see the module docstring). Needs no Spark.

    `range_start`: the start of the range a batch was computed for (its snapshot rows may be off the grid).
    `table`: the rows are a whole offline table (any number of backfill ranges); the alignment check then
    needs window functions and has no one-pass form.
    """
    checks = [_not_null(group, key, f"join key {key} is never null") for key in group.join_keys]
    checks.append(_not_null(group, WINDOW_END, f"{WINDOW_END} is never null"))
    key_columns = (*group.join_keys, WINDOW_END)
    name = f"unique({', '.join(key_columns)})"
    checks.append(
        DerivedCheck(
            name,
            _spec(
                "ExpectCompoundColumnsToBeUnique",
                column_list=list(key_columns),
                description=f"one row per key and {WINDOW_END}: ({', '.join(key_columns)}) is unique",
                meta=_meta(group, name),
            ),
            unique=key_columns,
            slot_us=math.gcd(*_grid_us(group)),
        )
    )
    checks.append(_alignment(group, range_start, table))
    for feat in group.features:
        checks.extend(_output_checks(group, feat))
    return checks


_EMPTY_WORDS = {Empty.ZERO: "an empty window gives 0", Empty.EMPTY_MAP: "an empty window gives an empty map"}


def _output_checks(group: FeatureGroup, feat: Feature) -> list[DerivedCheck]:
    """The checks of one feature's column: what its aggregation's `Operation.expect` says its values satisfy."""
    column, kind = feat.name, feat.aggregation.kind
    expect, checks = kind.op.expect, []
    if Expect.INTEGER in expect:
        what = "count" if kind is AggKind.COUNT else "distinct count"
        name = f"integer({column})"
        spec = _spec(
            "ExpectColumnValuesToBeInTypeList",
            column=column,
            type_list=list(INTEGER_TYPES),
            description=f"{column} is an integer {what}",
            meta=_meta(group, name),
        )
        checks.append(DerivedCheck(name, spec, column_types=(column, INTEGER_TYPES)))
    if Expect.NOT_NULL in expect:
        checks.append(_not_null(group, column, f"{column} is never null ({_EMPTY_WORDS[kind.op.empty]})"))
    low = 0 if Expect.NON_NEGATIVE in expect else None
    if Expect.FINITE in expect:
        words = "is finite and not negative" if low == 0 else "is finite"
        checks.append(
            _between(group, f"finite({column})", column, -FINITE if low is None else 0, FINITE, f"{column} {words}")
        )
    elif low == 0:
        checks.append(_between(group, f"non_negative({column})", column, 0, None, f"{column} is not negative"))
    if Expect.AT_MOST_K in expect:
        k = feat.aggregation.k
        checks.append(_between(group, f"at_most_k({column})", column, None, k, f"{column} is at most k = {k}"))
    if Expect.WITHIN_MIN_MAX in expect:
        checks.extend(_average_bounds(group, feat))
    if Expect.WITHIN_MIN_MAX_ESTIMATE in expect:
        checks.extend(_percentile_bounds(group, feat))
    return checks


def _percentile_bounds(group: FeatureGroup, feat: Feature) -> list[DerivedCheck]:
    """A percentile lies between the min and the max of the same values, up to its estimate's accuracy: within
    ALPHA of the exact quantile x, so |estimate - x| <= ALPHA / (1 - ALPHA) * |estimate|."""
    low = _companions(group, feat, AggKind.MIN)
    high = _companions(group, feat, AggKind.MAX)
    p = quoted(feat.name)
    slack = f"{PERCENTILE_SLACK!r} * abs({p})"
    out = []
    for bound, op, sign, word in ((low, "<", "-", "at_least"), (high, ">", "+", "at_most")):
        if bound is None:
            continue
        b = quoted(bound.name)
        condition = f"{p} IS NOT NULL AND {b} IS NOT NULL AND {p} {op} {b} {sign} {slack}"
        name = f"{word}({feat.name}, {bound.name})"
        description = f"{feat.name} {'>=' if op == '<' else '<='} {bound.name} (up to the estimate's 1% accuracy)"
        query = f"SELECT * FROM {{batch}} WHERE {condition}"
        out.append(DerivedCheck(name, _unexpected_rows(query, description, group, name), unexpected_sql=condition))
    return out


def _average_bounds(group: FeatureGroup, feat: Feature) -> list[DerivedCheck]:
    """An average lies between the min and the max of the same values, up to the rounding of its sum."""
    low = _companions(group, feat, AggKind.MIN)
    high = _companions(group, feat, AggKind.MAX)
    if low is None and high is None:
        return []
    avg = quoted(feat.name)
    outside = []
    for bound, op in ((low, "<"), (high, ">")):
        if bound is None:
            continue
        b = quoted(bound.name)
        sign = "-" if op == "<" else "+"
        slack = f"{AVG_TOLERANCE!r} * (abs({b}) + abs({avg}))"
        outside.append(f"({b} IS NOT NULL AND {avg} {op} {b} {sign} {slack})")
    condition = f"{avg} IS NOT NULL AND ({' OR '.join(outside)})"
    names = " and ".join(b.name for b in (low, high) if b is not None)
    verb = "lies between" if low is not None and high is not None else ("is at least" if low else "is at most")
    description = f"{feat.name} {verb} {names} (up to float rounding)"
    query = f"SELECT * FROM {{batch}} WHERE {condition}"
    name = f"within({feat.name}, {names.replace(' and ', ', ')})"
    return [DerivedCheck(name, _unexpected_rows(query, description, group, name), unexpected_sql=condition)]


def user_expectations(group: FeatureGroup) -> list[Any]:
    """Copies of the group's own expectations (a suite takes ownership of what it holds)."""
    copies = []
    for expectation in group.expectations:
        copy = expectation.copy(deep=True)
        copy.id = None
        copies.append(copy)
    return copies


def expectation_suite(
    group: FeatureGroup, *, range_start: datetime | None = None, table: bool = False
) -> ExpectationSuite:
    """The group's Great Expectations suite: the derived expectations, then the user's."""
    return suite_of(group, derived_checks(group, range_start=range_start, table=table))


def suite_of(group: FeatureGroup, checks: list[DerivedCheck]) -> ExpectationSuite:
    import great_expectations as gx

    expectations = [c.expectation for c in checks]
    return gx.ExpectationSuite(name=group.name, expectations=[*expectations, *user_expectations(group)])


def expectation_name(expectation: Any) -> str:
    """How reports name an expectation: its `description`, else its type and columns."""
    description = getattr(expectation, "description", None)
    if description:
        return str(description)
    kwargs = expectation.configuration.kwargs
    columns = [str(kwargs[k]) for k in ("column", "column_A", "column_B") if kwargs.get(k) is not None]
    if kwargs.get("column_list"):
        columns += [str(c) for c in kwargs["column_list"]]
    return f"{expectation.expectation_type}({', '.join(columns)})"


def config_name(config: Any) -> str:
    """How reports name an expectation from its configuration (as in a validation result)."""
    description = getattr(config, "description", None)
    if description:
        return str(description)
    kwargs = config.kwargs
    columns = [str(kwargs[k]) for k in ("column", "column_A", "column_B") if kwargs.get(k) is not None]
    if kwargs.get("column_list"):
        columns += [str(c) for c in kwargs["column_list"]]
    return f"{config.type}({', '.join(columns)})"


def _columns_of(expectation: Any) -> list[str]:
    kwargs = expectation.configuration.kwargs
    columns = [kwargs[k] for k in ("column", "column_A", "column_B") if isinstance(kwargs.get(k), str)]
    columns += [c for c in kwargs.get("column_list") or [] if isinstance(c, str)]
    return columns


def check_user_expectations(group: FeatureGroup, columns: Sequence[str]) -> None:
    """Raise a DefinitionError naming the expectation if it reads a column the rows do not have."""
    for expectation in group.expectations:
        missing = [c for c in _columns_of(expectation) if c not in columns]
        if missing:
            raise DefinitionError(
                f"FeatureGroup({group.name!r}).expectations",
                f"{expectation_name(expectation)!r} reads column(s) {', '.join(map(repr, missing))}, which the "
                f"group's rows do not have (columns: {', '.join(columns)})",
                "point the expectation at a join key, window_end or a feature of this group",
            )
