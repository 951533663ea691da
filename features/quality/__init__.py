"""Data quality: every batch of feature rows is checked with Great Expectations 1.x before anything is written.

This is the only module that imports Great Expectations. For each FeatureGroup it derives an expectation suite
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

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from features.errors import ConfigError, DefinitionError, ValidationFailed
from features.quality.checks import (
    ORIGIN,
    UNEXPECTED_ROWS,
    DerivedCheck,
    check_user_expectations,
    config_name,
    derived_checks,
    suite_of,
    user_expectations,
)
from features.quality.checks import expectation_name as expectation_name  # re-exported: part of the quality API
from features.quality.checks import expectation_suite as expectation_suite
from features.quality.screen import Screen, screen_rows
from features.spec import FeatureGroup

if TYPE_CHECKING:
    import pandas as pd
    from great_expectations.core import ExpectationSuite, ExpectationSuiteValidationResult
    from great_expectations.core.expectation_validation_result import ExpectationValidationResult
    from pyspark.sql import DataFrame

    from features.repo import Repo

logger = logging.getLogger(__name__)

QUARANTINE_DIR = Path("data") / "quarantine"
VALIDATION_DIR = Path("data") / "validation"
# Policies for a batch that fails validation (FeatureGroup.on_invalid), and each engine's default.
FAIL, QUARANTINE = "fail", "quarantine"
BACKFILL_DEFAULT = FAIL
STREAM_DEFAULT = QUARANTINE
SCREENED = "features_one_pass"  # meta key of a result filled in from the one-pass screen
MODES = ("auto", "full")


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
        name=config_name(config) if config is not None else "?",
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
        return _suite_result(group.name, [*screened, *user_results], meta), suite_of(group, checks)

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
                return _screened_report(group, checks, n, types, began)
            checked = run_great_expectations(group, rows, user, "BOOLEAN_ONLY")
            if checked.success:
                return _screened_report(group, checks, n, types, began, checked.results)
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
    return _report(group, suite, result, rows_seen, "great_expectations", began)


def screen_batches(group: FeatureGroup, rows: DataFrame, by: str) -> dict[Any, Screen]:
    """Screen several batches of the group's feature rows in one Spark job: `rows` holds them all, and column
    `by` tells them apart. Each batch's screen is for `validate_batch(group, its_rows, screened=...)`."""
    check_user_expectations(group, rows.columns)
    return {value: found for (value,), found in screen_rows(rows, derived_checks(group), [by]).items()}


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
