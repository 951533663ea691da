"""Validation: every batch of feature rows is checked with Great Expectations 1.x before anything is written.

This package is the only one that imports Great Expectations. For each FeatureGroup it derives an expectation suite
from the definitions (`expectation_suite`), adds the user's own expectations (`FeatureGroup.expectations`),
and validates a Spark DataFrame of change-point rows with `validate_batch`, which every engine calls (the batch
backfill, the stream once per micro-batch). The derived suite is defined in features.quality.checks.

Cost: Great Expectations resolves each expectation with several Spark jobs of its own, so a suite of 20
expectations is dozens of jobs per batch. By default (`mode="auto"`) the derived expectations are instead
evaluated together in one Spark aggregation (features.quality.screen): each of them is a row condition (the same Spark
SQL that Great Expectations runs), a uniqueness count or a schema check. When all pass, their Great
Expectations results are filled in from that pass (marked so in their `meta`); when any fails, the whole suite
runs in Great Expectations on the same DataFrame, and its result is the one reported. User expectations always
run in Great Expectations. `mode="full"` runs everything there. bench/quality.py measures both against the
batch they validate.

What happens on failure is the caller's policy (`FeatureGroup.on_invalid`): "fail" writes the result JSON and
raises `ValidationFailed`; "quarantine" also writes the failed batch, aside from the stores
(`quarantine_batch`). `publish_docs` adds a result to the repo's Great Expectations Data Docs (HTML).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from features.errors import ConfigError
from features.quality.checks import check_user_expectations, derived_checks, suite_of, user_expectations
from features.quality.data_docs import GX_LOCK, publish_docs
from features.quality.on_invalid import validation_root
from features.quality.report import ValidationReport, screened_report, suite_report
from features.quality.screen import Screen, screen_rows
from features.spec import FeatureGroup

if TYPE_CHECKING:
    from great_expectations.core import ExpectationSuiteValidationResult
    from pyspark.sql import DataFrame

    from features.repo import Repo

MODES = ("auto", "full")

# ---------------------------------------------------------------------------------------------------------
# Running Great Expectations on Spark

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

    with GX_LOCK:
        context = _context(rows.sparkSession)
        suite = gx.ExpectationSuite(name=group.name, expectations=list(expectations))
        return _batch(context, group.name, rows).validate(suite, result_format=result_format)


def validate_batch(
    group: FeatureGroup,
    rows: DataFrame,
    *,
    range_start: datetime | None = None,
    mode: str = "auto",
    table: bool = False,
    screened: Screen | None = None,
) -> ValidationReport:
    """Validate a Spark DataFrame of the group's feature rows (join keys, window_end, one column per feature)
    against its suite. Persist `rows` first if it is expensive: it is read once (more when something fails).

    `range_start`: the start of the range the rows were computed for (see `derived_checks`).
    `mode`: "auto" (one-pass screen for the derived expectations, Great Expectations for the user's and for
    everything once anything fails) or "full" (everything in Great Expectations). `table=True` implies "full".
    `screened`: what `screen_batches` found in these rows, screened in one job with other batches.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if screened is not None and (mode != "auto" or table or range_start is not None):
        raise ValueError("screened rows are validated in mode='auto', without range_start or table")
    began = time.perf_counter()
    check_user_expectations(group, rows.columns)
    checks = derived_checks(group, range_start=range_start, table=table)
    user = user_expectations(group)
    if mode == "auto" and not table:
        found = screened or screen_rows(rows, checks)[()]
        n, types = found.rows, found.types
        if not any(found.rejected.values()):
            if not user:
                return screened_report(group, checks, n, types, began)
            checked = run_great_expectations(group, rows, user, "BOOLEAN_ONLY")
            if checked.success:
                return screened_report(group, checks, n, types, began, checked.results)
        rows_seen: int | None = n
    else:
        rows_seen = None
    # Something failed (or full mode): Great Expectations evaluates the whole suite, with details.
    suite = suite_of(group, checks)
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
    return suite_report(group, suite, result, rows_seen, "great_expectations", began)


def screen_batches(group: FeatureGroup, rows: DataFrame, by: Sequence[str]) -> dict[tuple[Any, ...], Screen]:
    """Screen several batches of the group's feature rows in one Spark job: `rows` holds them all, and the values
    of the columns `by` tell them apart (the keys, a tuple of them each). Each batch's screen is for
    `validate_batch(group, its_rows, screened=...)`."""
    check_user_expectations(group, rows.columns)
    return screen_rows(rows, derived_checks(group), by)


def _element_count(result: ExpectationSuiteValidationResult) -> int | None:
    for r in result.results:
        count = (r.result or {}).get("element_count")
        if isinstance(count, int):
            return count
    return None


def validate_table(
    repo: Repo, groups: Sequence[str] | None = None, *, spark: Any = None, docs: bool = True
) -> list[ValidationReport]:
    """Validate the offline table of each named group (all by default) with Great Expectations, every
    expectation evaluated there, and (by default) add each result to the repo's Data Docs."""
    from features.engine.session import get_spark
    from features.stores.offline import DATE, read_table

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
