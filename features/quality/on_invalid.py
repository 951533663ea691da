"""What a failed validation does (`FeatureGroup.on_invalid`): "fail" writes Great Expectations' result and raises
`ValidationFailed`; "quarantine" also writes the failed batch, aside from the stores. Where a repo keeps them."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from features.errors import DefinitionError, ValidationFailed
from features.quality.data_docs import publish_docs
from features.quality.report import ValidationReport, failure_list
from features.spec import FeatureGroup

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

logger = logging.getLogger(__name__)

QUARANTINE_DIR = Path("data") / "quarantine"
VALIDATION_DIR = Path("data") / "validation"
# Policies for a batch that fails validation (FeatureGroup.on_invalid), and each engine's default.
FAIL, QUARANTINE = "fail", "quarantine"
BACKFILL_DEFAULT = FAIL
STREAM_DEFAULT = QUARANTINE


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
            f"online store. Failed: {failure_list(report)}. Great Expectations result: {report.result_path}{docs}. "
            'Fix the source data or the definitions and run again, or set on_invalid="quarantine" on the '
            "group (or --on-invalid quarantine) to set failing batches aside and carry on",
            report,
        )
    return folder
