"""A validation's result: `ValidationReport`, Great Expectations' own result objects and the same in plain values
(`Outcome`), built from what Great Expectations evaluated or, for a batch the one-pass screen passed, on first
use from what the screen found (features.quality.screen)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from features.quality.checks import ORIGIN, UNEXPECTED_ROWS, DerivedCheck, config_name, suite_of
from features.spec import FeatureGroup

if TYPE_CHECKING:
    import pandas as pd
    from great_expectations.core import ExpectationSuite, ExpectationSuiteValidationResult
    from great_expectations.core.expectation_validation_result import ExpectationValidationResult

SCREENED = "features_one_pass"  # meta key of a result filled in from the one-pass screen


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
        return f"{head}, {len(self.failures)} failed: {failure_list(self)}"

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


def outcome_of(result: ExpectationValidationResult) -> Outcome:
    """One of Great Expectations' results in plain values."""
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


def suite_report(
    group: FeatureGroup,
    suite: ExpectationSuite,
    result: ExpectationSuiteValidationResult,
    rows: int,
    evaluated_by: str,
    began: float,
) -> ValidationReport:
    """A report of what Great Expectations evaluated."""
    outcomes = [outcome_of(r) for r in result.results]
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


def failure_list(report: ValidationReport) -> str:
    """The failed expectations of `report` on one line, each with what failed."""
    parts = []
    for o in report.failures:
        detail = o.error if o.error else (f"{o.unexpected:,} unexpected" if o.unexpected is not None else "failed")
        parts.append(f"{'user expectation ' if o.user else ''}{o.name!r} ({detail})")
    return "; ".join(parts).replace("\n", " ")


def screened_report(
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
        outcomes=[*map(_screened_outcome, checks), *map(outcome_of, user_results)],
        evaluated_by="one-pass screen" + (" + great_expectations (user expectations)" if user_results else ""),
        seconds=time.perf_counter() - began,
        great_expectations=great_expectations,
    )


def _screened_outcome(check: DerivedCheck) -> Outcome:
    """What `outcome_of` makes of `_screened_result(check, ...)`, without Great Expectations."""
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
