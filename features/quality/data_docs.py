"""Great Expectations' Data Docs: each failed or checked result added to the repo's Great Expectations project
(`validation_root`/gx), its HTML pages rebuilt."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from features.quality.report import ValidationReport

GX_LOCK = threading.RLock()  # a Data Context is not thread-safe, and Spark checks share a temp view name


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

    with GX_LOCK:
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
