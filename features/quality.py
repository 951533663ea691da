"""Data quality: every batch of feature rows is checked with Great Expectations 1.x before anything is written.

This is the only module that imports Great Expectations. For each FeatureGroup it derives an expectation suite
from the definitions (`expectation_suite`), adds the user's own expectations (`FeatureGroup.expectations`),
and validates a Spark DataFrame of change-point rows with `validate_batch`, which any engine calls (the batch
backfill now, a stream per micro-batch). The derived suite:

- every join key and `window_end` is never null;
- (join keys, window_end) is unique;
- `window_end` lies on the grid of some feature's `every` (epoch-aligned), or is the start of the range the
  batch was computed for (the engine's snapshot row there); in a whole table, such a row off the grid must
  repeat the key's previous values (or be its first row);
- counts and approx_count_distinct are integer columns, never null, never negative;
- sums (never null), averages and standard deviations are finite, standard deviations are not negative;
- an average lies between the min and the max of the same column, window and filter (when the group has
  them), up to float rounding; an approx_percentile lies between them exactly.

Cost: Great Expectations resolves each expectation with several Spark jobs of its own, so a suite of 20
expectations is dozens of jobs per batch. By default (`mode="auto"`) the derived expectations are instead
evaluated together in one Spark aggregation (grouped by the join keys, for an exact uniqueness count): each
of them is a row condition (the same Spark SQL that Great Expectations runs), a uniqueness count or a schema
check. When all pass, their Great Expectations results are filled in from that pass (marked so in their
`meta`); when any fails, the whole suite runs in Great Expectations on the same DataFrame, and its result is
the one reported. User expectations always run in Great Expectations. `mode="full"` runs everything there.
bench/quality.py measures both against the batch they validate.

What happens on failure is the caller's policy (`FeatureGroup.on_invalid`): "fail" writes the result JSON and
raises `ValidationFailed`; "quarantine" also writes the failed batch, aside from the stores
(`quarantine_batch`). `publish_docs` adds a result to the repo's Great Expectations Data Docs (HTML).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from features.errors import ConfigError, DefinitionError, ValidationFailed
from features.kernel.quantiles import ALPHA
from features.spec import WINDOW_END, AggKind, Feature, FeatureGroup

if TYPE_CHECKING:
    import pandas as pd
    from great_expectations.core import ExpectationSuite, ExpectationSuiteValidationResult
    from great_expectations.core.expectation_validation_result import ExpectationValidationResult
    from pyspark.sql import DataFrame

    from features.repo import Repo

logger = logging.getLogger(__name__)

MICROS = 1_000_000
QUARANTINE_DIR = Path("data") / "quarantine"
VALIDATION_DIR = Path("data") / "validation"
# Policies for a batch that fails validation (FeatureGroup.on_invalid), and each engine's default.
FAIL, QUARANTINE = "fail", "quarantine"
BACKFILL_DEFAULT = FAIL
STREAM_DEFAULT = QUARANTINE
FINITE = sys.float_info.max  # "finite" = between -FINITE and FINITE (NaN and +-inf are not)
AVG_TOLERANCE = 1e-9  # relative float rounding an average may show against the min/max of the same values
INTEGER_TYPES = ("LongType", "IntegerType", "ShortType", "ByteType")
ORIGIN = "features"  # key in an expectation's meta: {"check": ..., "group": ...} for derived ones
SCREENED = "features_one_pass"  # meta key of a result filled in from the one-pass screen
MODES = ("auto", "full")
UNEXPECTED_ROWS = "unexpected_rows_expectation"
ALIGNED = f"aligned({WINDOW_END})"


# ---------------------------------------------------------------------------------------------------------
# The suite derived from the definitions

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


def _q(column: str) -> str:
    return f"`{column}`"


def _grid_us(group: FeatureGroup) -> list[int]:
    """The distinct `every` of the features, without those that are multiples of another (implied by it)."""
    everys = sorted({f.window.every_s * MICROS for f in group.features})
    return [e for e in everys if not any(e != o and e % o == 0 for o in everys)]


def _on_grid_sql(group: FeatureGroup) -> str:
    ends = f"unix_micros({_q(WINDOW_END)})"
    return " OR ".join(f"pmod({ends}, {every}) = 0" for every in _grid_us(group))


def _grid_text(group: FeatureGroup) -> str:
    from features.spec.durations import format_duration

    return ", ".join(format_duration(every // MICROS) for every in _grid_us(group))


def _alignment(group: FeatureGroup, range_start: datetime | None, table: bool) -> DerivedCheck:
    off_grid = f"{_q(WINDOW_END)} IS NOT NULL AND NOT ({_on_grid_sql(group)})"
    grid = _grid_text(group)
    if table:
        # A backfill that starts off the grid leaves a snapshot row per key at its start: the key's first row,
        # or one that repeats the key's previous values. Anything else off the grid is wrong.
        keys = ", ".join(_q(k) for k in group.join_keys)
        over = f"OVER (PARTITION BY {keys} ORDER BY {_q(WINDOW_END)})"
        same = " AND ".join(f"(lag({_q(f.name)}) {over} <=> {_q(f.name)})" for f in group.features)
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
        condition += f" AND {_q(WINDOW_END)} <> timestamp_micros({start_us})"
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
    return DerivedCheck(name, spec, unexpected_sql=f"{_q(column)} IS NULL")


def _between(
    group: FeatureGroup, name: str, column: str, low: float | None, high: float | None, description: str
) -> DerivedCheck:
    kwargs: dict[str, Any] = {}
    inside = []
    if low is not None:
        kwargs["min_value"] = low
        inside.append(f"{_q(column)} >= {low!r}")
    if high is not None:
        kwargs["max_value"] = high
        inside.append(f"{_q(column)} <= {high!r}")
    spec = _spec(
        "ExpectColumnValuesToBeBetween", column=column, description=description, meta=_meta(group, name), **kwargs
    )
    # As in Great Expectations on Spark: nulls are skipped, NaN compares above everything (so it is outside).
    condition = f"{_q(column)} IS NOT NULL AND NOT ({' AND '.join(inside)})"
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
        column, kind = feat.name, feat.aggregation.kind
        if kind in (AggKind.COUNT, AggKind.APPROX_COUNT_DISTINCT, AggKind.COUNT_DISTINCT):
            what = "count" if kind is AggKind.COUNT else "distinct count"
            name = f"integer({column})"
            checks.append(
                DerivedCheck(
                    name,
                    _spec(
                        "ExpectColumnValuesToBeInTypeList",
                        column=column,
                        type_list=list(INTEGER_TYPES),
                        description=f"{column} is an integer {what}",
                        meta=_meta(group, name),
                    ),
                    column_types=(column, INTEGER_TYPES),
                )
            )
            checks.append(_not_null(group, column, f"{column} is never null (an empty window counts 0)"))
            checks.append(_between(group, f"non_negative({column})", column, 0, None, f"{column} is not negative"))
        elif kind is AggKind.SUM:
            checks.append(_not_null(group, column, f"{column} is never null (an empty window sums to 0)"))
            checks.append(_between(group, f"finite({column})", column, -FINITE, FINITE, f"{column} is finite"))
        elif kind is AggKind.AVG:
            checks.append(_between(group, f"finite({column})", column, -FINITE, FINITE, f"{column} is finite"))
            checks.extend(_average_bounds(group, feat))
        elif kind is AggKind.STDDEV:
            checks.append(
                _between(group, f"finite({column})", column, 0, FINITE, f"{column} is finite and not negative")
            )
        elif kind is AggKind.APPROX_PERCENTILE:
            checks.append(_between(group, f"finite({column})", column, -FINITE, FINITE, f"{column} is finite"))
            checks.extend(_percentile_bounds(group, feat))
    return checks


def _percentile_bounds(group: FeatureGroup, feat: Feature) -> list[DerivedCheck]:
    """A percentile lies between the min and the max of the same values, up to its estimate's accuracy: within
    ALPHA of the exact quantile x, so |estimate - x| <= ALPHA / (1 - ALPHA) * |estimate|."""
    low = _companions(group, feat, AggKind.MIN)
    high = _companions(group, feat, AggKind.MAX)
    p = _q(feat.name)
    slack = f"{PERCENTILE_SLACK!r} * abs({p})"
    out = []
    for bound, op, sign, word in ((low, "<", "-", "at_least"), (high, ">", "+", "at_most")):
        if bound is None:
            continue
        b = _q(bound.name)
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
    avg = _q(feat.name)
    outside = []
    for bound, op in ((low, "<"), (high, ">")):
        if bound is None:
            continue
        b = _q(bound.name)
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
    return _suite(group, derived_checks(group, range_start=range_start, table=table))


def _suite(group: FeatureGroup, checks: list[DerivedCheck]) -> ExpectationSuite:
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


def _config_name(config: Any) -> str:
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


# ---------------------------------------------------------------------------------------------------------
# Reports


@dataclass(frozen=True)
class Outcome:
    """One expectation's result, in plain values."""

    name: str
    expectation_type: str
    success: bool
    user: bool  # declared by the user (FeatureGroup.expectations), not derived
    check: str | None  # the derived check's short name (DerivedCheck.name), None for user expectations
    unexpected: int | None  # rows that failed it (or the observed value of a row-count check)
    examples: tuple[Any, ...] = ()
    error: str | None = None  # the exception, when Great Expectations could not evaluate it


@dataclass
class ValidationReport:
    """The result of validating one batch (or table) of a group's feature rows.

    `result` is Great Expectations' own ExpectationSuiteValidationResult (render it, store it, or read its
    `results`); `outcomes` is the same in plain values, one per expectation, failures first in `failures`.
    When the one-pass screen alone passed the batch, `result` and `suite` are built on first use, so that a
    job whose batches pass never imports Great Expectations.
    """

    group: str
    success: bool
    rows: int
    outcomes: list[Outcome]
    evaluated_by: str  # "one-pass screen" (+ Great Expectations for user expectations) or "great_expectations"
    seconds: float
    # Great Expectations' result and suite, or (screened) what builds them
    great_expectations: Callable[[], tuple[ExpectationSuiteValidationResult, ExpectationSuite]] = field(repr=False)
    run_id: str = field(default_factory=lambda: new_run_id())
    result_path: str | None = None  # where the result JSON was written, if it was
    docs_path: str | None = None  # the Data Docs page of this result, if published
    _built: tuple[ExpectationSuiteValidationResult, ExpectationSuite] | None = field(default=None, repr=False)

    @property
    def result(self) -> ExpectationSuiteValidationResult:
        return self._objects()[0]

    @property
    def suite(self) -> ExpectationSuite:
        return self._objects()[1]

    @property
    def evaluated_by_great_expectations(self) -> bool:
        return "great_expectations" in self.evaluated_by

    def _objects(self) -> tuple[ExpectationSuiteValidationResult, ExpectationSuite]:
        if self._built is None:
            self._built = self.great_expectations()
        return self._built

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.success]

    def failed_names(self) -> list[str]:
        return [o.name for o in self.failures]

    def summary(self) -> str:
        head = f"{self.group}: {len(self.outcomes)} expectations on {self.rows:,} rows"
        if self.success:
            return f"{head}, all passed ({self.seconds:.1f}s)"
        return f"{head}, {len(self.failures)} failed: {_failure_list(self)}"

    def to_pandas(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(
            [
                {
                    "expectation": o.name,
                    "type": o.expectation_type,
                    "user": o.user,
                    "success": o.success,
                    "unexpected": o.unexpected,
                    "examples": list(o.examples),
                    "error": o.error,
                }
                for o in self.outcomes
            ]
        )

    def to_json_dict(self) -> dict[str, Any]:
        """Great Expectations' result as JSON-ready data."""
        return self.result.to_json_dict()

    def write_result(self, path: str | Path) -> str:
        """Write Great Expectations' result as JSON; returns the path."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(json.dumps(self.to_json_dict(), indent=2, default=str))
        tmp.replace(target)
        self.result_path = str(target)
        return str(target)

    def _repr_html_(self) -> str:  # notebooks
        return self.to_pandas()._repr_html_()  # type: ignore[operator]

    def __str__(self) -> str:
        return self.summary()


def new_run_id() -> str:
    """A sortable, file-name-safe id for one validation run: UTC time plus a random suffix."""
    return f"{datetime.now(UTC):%Y%m%dT%H%M%S%fZ}-{uuid.uuid4().hex[:6]}"


def _outcome(result: ExpectationValidationResult) -> Outcome:
    config = result.expectation_config
    meta = (config.meta or {}) if config is not None else {}
    details = result.result or {}
    unexpected = details.get("unexpected_count")
    observed = details.get("observed_value")
    if unexpected is None and isinstance(observed, int) and getattr(config, "type", "") == UNEXPECTED_ROWS:
        unexpected = observed
    examples = details.get("partial_unexpected_list") or details.get("details", {}).get("unexpected_rows") or []
    return Outcome(
        name=_config_name(config) if config is not None else "?",
        expectation_type=config.type if config is not None else "?",
        success=bool(result.success),
        user=ORIGIN not in meta,
        check=meta[ORIGIN].get("check") if isinstance(meta.get(ORIGIN), dict) else None,
        unexpected=None if unexpected is None else int(unexpected),
        examples=tuple(examples[:5]),
        error=_exception(result.exception_info),
    )


def _exception(info: Any) -> str | None:
    """The first line of the exception Great Expectations caught, if any (its info is either one record or
    one record per metric)."""
    if not isinstance(info, dict):
        return None
    records = [info] if "raised_exception" in info else [v for v in info.values() if isinstance(v, dict)]
    for record in records:
        if record.get("raised_exception"):
            message = str(record.get("exception_message") or "raised an exception").strip()
            return message.splitlines()[0] if message else "raised an exception"
    return None


def _report(
    group: FeatureGroup,
    suite: ExpectationSuite,
    result: ExpectationSuiteValidationResult,
    rows: int,
    evaluated_by: str,
    began: float,
) -> ValidationReport:
    """A report of what Great Expectations evaluated."""
    outcomes = [_outcome(r) for r in result.results]
    outcomes.sort(key=lambda o: o.success)  # failures first, otherwise in suite order
    return ValidationReport(
        group=group.name,
        success=bool(result.success),
        rows=rows,
        outcomes=outcomes,
        evaluated_by=evaluated_by,
        seconds=time.perf_counter() - began,
        great_expectations=lambda: (result, suite),
    )


# ---------------------------------------------------------------------------------------------------------
# Running Great Expectations on Spark

_LOCK = threading.RLock()  # a Data Context is not thread-safe, and Spark checks share a temp view name
_CONTEXT: Any = None
_CONTEXT_SPARK: Any = None
DATASOURCE = "features"


def _context(spark: Any) -> Any:
    """One ephemeral Data Context per process (per SparkSession), with its Spark datasource."""
    global _CONTEXT, _CONTEXT_SPARK
    if _CONTEXT is None or _CONTEXT_SPARK is not spark:
        import great_expectations as gx
        from great_expectations.data_context.types.base import ProgressBarsConfig

        context = gx.get_context(mode="ephemeral")
        context.variables.progress_bars = ProgressBarsConfig(globally=False)
        # persist=False: callers hand in DataFrames they already persisted (and unpersist themselves).
        context.data_sources.add_spark(name=DATASOURCE, persist=False)
        _CONTEXT, _CONTEXT_SPARK = context, spark
    return _CONTEXT


def _batch(context: Any, asset_name: str, rows: DataFrame) -> Any:
    datasource = context.data_sources.get(DATASOURCE)
    # Great Expectations runs its SQL checks (a temp view, then spark.sql) on a session of its own choosing, a
    # Spark Connect one first if the process has one: they must run on the session the rows belong to.
    datasource.get_execution_engine().spark = rows.sparkSession
    try:
        asset = datasource.get_asset(asset_name)
    except LookupError:
        asset = datasource.add_dataframe_asset(name=asset_name)
    try:
        definition = asset.get_batch_definition("whole")
    except (KeyError, LookupError, ValueError):
        definition = asset.add_batch_definition_whole_dataframe("whole")
    return definition.get_batch(batch_parameters={"dataframe": rows})


def run_great_expectations(
    group: FeatureGroup, rows: DataFrame, expectations: Sequence[Any], result_format: str = "SUMMARY"
) -> ExpectationSuiteValidationResult:
    """Validate `rows` (a Spark DataFrame, preferably persisted) against `expectations` with Great
    Expectations' Spark execution engine."""
    import great_expectations as gx

    with _LOCK:
        context = _context(rows.sparkSession)
        suite = gx.ExpectationSuite(name=group.name, expectations=list(expectations))
        return _batch(context, group.name, rows).validate(suite, result_format=result_format)


# ---------------------------------------------------------------------------------------------------------
# The one-pass screen


SLOT_WORDS = 8  # 64-bit words of window-end slots per key and block in the screen's uniqueness count


@dataclass(frozen=True)
class _ScreenPlan:
    """The one-pass screen's aggregation: per group of `by` (none: the whole batch), `aggregates`."""

    by: list[Any]  # column names or Spark Columns
    aggregates: list[Any]  # Spark Columns
    grouped: DerivedCheck | None  # the uniqueness check counted per group
    conditions: dict[str, DerivedCheck]  # output column -> row-condition check


def _screen_plan(checks: list[DerivedCheck]) -> _ScreenPlan:
    from pyspark.sql import functions as F

    conditions = {f"_c{i}": c for i, c in enumerate(checks) if c.unexpected_sql}
    counted = [F.count_if(F.expr(str(c.unexpected_sql))).alias(name) for name, c in conditions.items()]
    grouped = next((c for c in checks if len(c.unique) > 1), None)
    if grouped is None:
        return _ScreenPlan([], [F.count(F.lit(1)).alias("_rows"), *counted], None, conditions)
    *by, last = grouped.unique
    if last != WINDOW_END or not grouped.slot_us:
        distinct = F.size(F.array_distinct(F.collect_list(F.col(last)))).alias("_distinct")
        return _ScreenPlan(by, [F.count(F.lit(1)).alias("_rows"), distinct, *counted], grouped, conditions)
    # Window ends as bits, grouped by key and block of SLOT_WORDS * 64 slots (slot = window end / slot length):
    # each word a bit_or of its slots, the distinct ends of a (key, block) its bits set. Only integer
    # aggregates, which Spark hashes, where collecting the ends in arrays falls back to sorting every row. Two
    # ends in one slot (an end off the grid) look like a duplicate: a false alarm, which Great Expectations clears.
    def floor_div(x: str, y: int) -> str:  # `div` rounds toward zero: before 1970, two slots would share one
        return f"(({x}) - pmod({x}, {y})) div {y}"

    slot = floor_div(f"unix_micros({_q(WINDOW_END)})", grouped.slot_us)
    bit = f"pmod({slot}, {64 * SLOT_WORDS})"
    words = [
        f"coalesce(bit_count(bit_or(CASE WHEN {bit} div 64 = {w} THEN shiftleft(1L, int(pmod({bit}, 64))) END)), 0)"
        for w in range(SLOT_WORDS)
    ]
    distinct = F.expr(" + ".join(words)).alias("_distinct")
    block = F.expr(floor_div(slot, 64 * SLOT_WORDS)).alias("_block")
    keys = [F.col(_q(k)) for k in by]
    return _ScreenPlan([*keys, block], [F.count(F.lit(1)).alias("_rows"), distinct, *counted], grouped, conditions)


def _screen(rows: DataFrame, checks: list[DerivedCheck]) -> tuple[int, dict[str, int]]:
    """Rows in the batch, and each check's count of rejected rows (1 for a wrong column type; for uniqueness,
    rows minus distinct combinations): one Spark job for all of them.

    Uniqueness of (join keys, window_end) needs no hashing of the rows: they are grouped by the join keys (and a
    block of window-end slots, see `_screen_plan`), and each group counts its rows and its distinct window ends,
    with the row conditions counted alongside; the groups' counts are then summed. A null in the combination
    counts as a duplicate, which only ever raises a false alarm that Great Expectations clears. A
    uniqueness check of a single column counts distinct 64-bit hashes in a job of its own (a hash collision,
    about n^2 / 2^65, is such a false alarm too)."""
    from pyspark.sql import functions as F

    plan = _screen_plan(checks)
    if plan.by:
        per_group = rows.groupBy(*plan.by).agg(*plan.aggregates)
        sums = ["_rows", "_distinct", *plan.conditions]
        row = per_group.agg(*[F.coalesce(F.sum(c), F.lit(0)).alias(c) for c in sums]).first()
    else:
        row = rows.agg(*plan.aggregates).first()
    assert row is not None
    n = int(row["_rows"])
    types = {f.name: type(f.dataType).__name__ for f in rows.schema.fields}
    counts = {c.name: int(row[name]) for name, c in plan.conditions.items()}
    for check in checks:
        if check is plan.grouped:
            counts[check.name] = n - int(row["_distinct"])
        elif check.unique:
            hashed = F.xxhash64(*[F.col(c) for c in check.unique])
            found = rows.agg(F.count_distinct(hashed)).first()
            counts[check.name] = n - int(found[0]) if found is not None else n
        elif check.column_types is not None:
            column, allowed = check.column_types
            counts[check.name] = 0 if types.get(column) in allowed else 1
    return n, {c.name: counts[c.name] for c in checks if c.name in counts}


def _screened_report(
    group: FeatureGroup,
    checks: list[DerivedCheck],
    rows: int,
    types: Mapping[str, str],
    began: float,
    user_results: Sequence[ExpectationValidationResult] = (),
) -> ValidationReport:
    """The report of a batch whose derived checks the screen passed (and its user expectations, if any, Great
    Expectations): Great Expectations' objects for the derived checks are built only if someone reads them."""

    def great_expectations() -> tuple[ExpectationSuiteValidationResult, ExpectationSuite]:
        meta = {"features": {"group": group.name, "rows": rows, "evaluated_by": "one-pass screen"}}
        screened = [_screened_result(c, rows, types) for c in checks]
        return _suite_result(group.name, [*screened, *user_results], meta), _suite(group, checks)

    return ValidationReport(
        group=group.name,
        success=True,
        rows=rows,
        outcomes=[*map(_screened_outcome, checks), *map(_outcome, user_results)],
        evaluated_by="one-pass screen" + (" + great_expectations (user expectations)" if user_results else ""),
        seconds=time.perf_counter() - began,
        great_expectations=great_expectations,
    )


def _screened_outcome(check: DerivedCheck) -> Outcome:
    """What `_outcome` makes of `_screened_result(check, ...)`, without Great Expectations."""
    return Outcome(
        name=check.spec.description,
        expectation_type=check.spec.expectation_type,
        success=True,
        user=False,
        check=check.name,
        unexpected=None if check.column_types is not None else 0,
    )


def _screened_result(check: DerivedCheck, rows: int, types: Mapping[str, str]) -> ExpectationValidationResult:
    from great_expectations.core.expectation_validation_result import ExpectationValidationResult

    if check.column_types is not None:
        details: dict[str, Any] = {"observed_value": types.get(check.column_types[0])}
    elif check.spec.expectation_type == UNEXPECTED_ROWS:
        details = {"observed_value": 0}
    else:
        details = {"element_count": rows, "unexpected_count": 0, "unexpected_percent": 0.0}
        details["partial_unexpected_list"] = []
    return ExpectationValidationResult(
        success=True,
        expectation_config=check.expectation.configuration,
        result=details,
        meta={SCREENED: "evaluated in the one-pass Spark aggregation of features.quality"},
    )


def _suite_result(
    suite_name: str, results: list[ExpectationValidationResult], meta: dict[str, Any]
) -> ExpectationSuiteValidationResult:
    from great_expectations.core import ExpectationSuiteValidationResult

    passed = sum(1 for r in results if r.success)
    statistics = {
        "evaluated_expectations": len(results),
        "successful_expectations": passed,
        "unsuccessful_expectations": len(results) - passed,
        "success_percent": 100.0 * passed / len(results) if results else None,
    }
    return ExpectationSuiteValidationResult(
        success=passed == len(results), results=results, suite_name=suite_name, statistics=statistics, meta=meta
    )


# ---------------------------------------------------------------------------------------------------------
# Validation: the entry point of every engine


def validate_batch(
    group: FeatureGroup,
    rows: DataFrame,
    *,
    range_start: datetime | None = None,
    mode: str = "auto",
    table: bool = False,
) -> ValidationReport:
    """Validate a Spark DataFrame of the group's feature rows (join keys, window_end, one column per feature)
    against its suite. Persist `rows` first if it is expensive: it is read once (more when something fails).

    `range_start`: the start of the range the rows were computed for (see `derived_checks`).
    `mode`: "auto" (one-pass screen for the derived expectations, Great Expectations for the user's and for
    everything once anything fails) or "full" (everything in Great Expectations). `table=True` implies "full".
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    began = time.perf_counter()
    check_user_expectations(group, rows.columns)
    checks = derived_checks(group, range_start=range_start, table=table)
    user = user_expectations(group)
    if mode == "auto" and not table:
        n, counts = _screen(rows, checks)
        if not any(counts.values()):
            types = {f.name: type(f.dataType).__name__ for f in rows.schema.fields}
            if not user:
                return _screened_report(group, checks, n, types, began)
            checked = run_great_expectations(group, rows, user, "BOOLEAN_ONLY")
            if checked.success:
                return _screened_report(group, checks, n, types, began, checked.results)
        rows_seen: int | None = n
    else:
        rows_seen = None
    # Something failed (or full mode): Great Expectations evaluates the whole suite, with details.
    suite = _suite(group, checks)
    expectations = [c.expectation for c in checks] + user_expectations(group)
    result = run_great_expectations(group, rows, expectations, "SUMMARY")
    if rows_seen is None:
        rows_seen = _element_count(result)
        if rows_seen is None:
            rows_seen = rows.count()
    result.meta = {
        **(result.meta or {}),
        "features": {"group": group.name, "rows": rows_seen, "evaluated_by": "great_expectations"},
    }
    return _report(group, suite, result, rows_seen, "great_expectations", began)


def _element_count(result: ExpectationSuiteValidationResult) -> int | None:
    for r in result.results:
        count = (r.result or {}).get("element_count")
        if isinstance(count, int):
            return count
    return None


def policy(group: FeatureGroup, default: str, override: str | None = None) -> str:
    """What a failed validation does for this group: the override, else the group's, else the engine's."""
    chosen = override or group.on_invalid or default
    if chosen not in (FAIL, QUARANTINE):
        raise DefinitionError("on_invalid", f"unknown policy {chosen!r}", f'use "{FAIL}" or "{QUARANTINE}"')
    return chosen


def quarantine_batch(report: ValidationReport, rows: DataFrame, folder: str | Path) -> str:
    """Set a failed batch aside: its rows as Parquet in `folder`/rows and Great Expectations' result in
    `folder`/result.json. Returns the folder."""
    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    rows.write.mode("overwrite").parquet(str(target / "rows"))
    report.write_result(target / "result.json")
    return str(target)


def validation_root(repo_root: str | Path) -> Path:
    """Where a repo keeps validation results of failed batches and its Great Expectations project (Data Docs)."""
    return Path(repo_root) / VALIDATION_DIR


def quarantine_root(repo_root: str | Path, group: str) -> Path:
    """Where a repo sets aside a group's bad source records (records/) and failed batches (batches/)."""
    return Path(repo_root) / QUARANTINE_DIR / group


def handle_invalid(
    report: ValidationReport, rows: DataFrame, group: FeatureGroup, repo_root: str | Path, chosen: str, what: str
) -> str | None:
    """Act on a failed validation before anything is written, as `chosen` ("fail" or "quarantine") says.

    Both write Great Expectations' result and add it to the repo's Data Docs. "fail" then raises
    ValidationFailed; "quarantine" writes the batch into the group's quarantine folder and returns it.
    `what` names the rows for messages, e.g. "change points for [start, end)".
    """
    folder = None
    if chosen == QUARANTINE:
        folder = quarantine_batch(report, rows, quarantine_root(repo_root, group.name) / "batches" / report.run_id)
    else:
        report.write_result(validation_root(repo_root) / group.name / f"{report.run_id}.json")
    try:
        publish_docs(report, validation_root(repo_root))
    except Exception as exc:  # the data is what failed; a Data Docs problem must not hide that
        logger.warning("could not add the validation result to the Data Docs: %s", exc)
    if chosen == FAIL:
        docs = f"; Data Docs: {report.docs_path}" if report.docs_path else ""
        raise ValidationFailed(
            f"{group.name}: {report.rows:,} {what} failed validation, so nothing was written to the offline or "
            f"online store. Failed: {_failure_list(report)}. Great Expectations result: {report.result_path}{docs}. "
            'Fix the source data or the definitions and run again, or set on_invalid="quarantine" on the '
            "group (or --on-invalid quarantine) to set failing batches aside and carry on",
            report,
        )
    return folder


def _failure_list(report: ValidationReport) -> str:
    parts = []
    for o in report.failures:
        detail = o.error if o.error else (f"{o.unexpected:,} unexpected" if o.unexpected is not None else "failed")
        parts.append(f"{'user expectation ' if o.user else ''}{o.name!r} ({detail})")
    return "; ".join(parts).replace("\n", " ")


def validate_table(
    repo: Repo, groups: Sequence[str] | None = None, *, spark: Any = None, docs: bool = True
) -> list[ValidationReport]:
    """Validate the offline table of each named group (all by default) with Great Expectations, every
    expectation evaluated there, and (by default) add each result to the repo's Data Docs."""
    from features.engine.session import get_spark
    from features.offline import DATE, read_table

    selected = repo.select(list(groups or []))
    spark = spark or get_spark()
    reports = []
    for group in selected:
        path = repo.offline_path(group)
        table = read_table(spark, path)
        if table is None:
            raise ConfigError(
                f"--group {group.name}: there is no offline table at {path} yet; run `features backfill "
                f"--repo {repo.root} --group {group.name} --start ... --end ...` first"
            )
        rows = table.drop(DATE).persist()
        try:
            report = validate_batch(group, rows, table=True)
        finally:
            rows.unpersist()
        if docs:
            publish_docs(report, validation_root(repo.root))
        reports.append(report)
    return reports


# ---------------------------------------------------------------------------------------------------------
# Data Docs


def publish_docs(report: ValidationReport, root: str | Path) -> str:
    """Add the report's result and suite to the Great Expectations project under `root` (created on first
    use: `root`/gx) and rebuild its Data Docs; returns the path of the result's HTML page."""
    import great_expectations as gx
    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.data_context.types.base import ProgressBarsConfig
    from great_expectations.data_context.types.resource_identifiers import (
        ExpectationSuiteIdentifier,
        ValidationResultIdentifier,
    )

    with _LOCK:
        Path(root).mkdir(parents=True, exist_ok=True)
        context = gx.get_context(mode="file", project_root_dir=str(root))
        context.variables.progress_bars = ProgressBarsConfig(globally=False)
        suite = gx.ExpectationSuite(
            name=report.suite.name, expectations=[e.copy(update={"id": None}) for e in report.suite.expectations]
        )
        context.suites.add_or_update(suite)
        suite_id = ExpectationSuiteIdentifier(name=suite.name)
        run_time = datetime.now(UTC)
        result_id = ValidationResultIdentifier(
            expectation_suite_identifier=suite_id,
            run_id=RunIdentifier(run_name=report.run_id, run_time=run_time),
            batch_identifier=report.group,
        )
        report.result.suite_name = suite.name
        context.validation_results_store.store_validation_results(
            suite_validation_result=report.result,
            suite_validation_result_identifier=result_id,
            expectation_suite_identifier=suite_id,
        )
        context.build_data_docs(resource_identifiers=[result_id, suite_id])
        urls = context.get_docs_sites_urls(resource_identifier=result_id)
    url = next((u["site_url"] for u in urls if u.get("site_url")), None)
    if url is None:
        raise RuntimeError(f"Great Expectations built no Data Docs page under {root}")
    path = url.removeprefix("file://")
    report.docs_path = path
    return path


def docs_index(root: str | Path) -> str:
    """The Data Docs home page of the Great Expectations project under `root`."""
    return str(Path(root) / "gx" / "uncommitted" / "data_docs" / "local_site" / "index.html")
