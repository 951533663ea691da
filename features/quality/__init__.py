"""Data quality: every batch of feature rows is checked with Great Expectations 1.x before anything is written
(validation.py, from the suite checks.py derives, screened in one pass by screen.py); what a failure does
(on_invalid.py); the result (report.py) and its Data Docs (data_docs.py); statistics of the rows (profiling.py)."""

from features.quality.checks import derived_checks, expectation_name, expectation_suite
from features.quality.data_docs import docs_index, publish_docs
from features.quality.on_invalid import (
    BACKFILL_DEFAULT,
    FAIL,
    QUARANTINE,
    STREAM_DEFAULT,
    handle_invalid,
    policy,
    quarantine_batch,
    quarantine_root,
    validation_root,
)
from features.quality.report import Outcome, ValidationReport, new_run_id
from features.quality.validation import MODES, run_great_expectations, screen_batches, validate_batch, validate_table

__all__ = [
    "BACKFILL_DEFAULT", "FAIL", "MODES", "QUARANTINE", "STREAM_DEFAULT", "Outcome", "ValidationReport",
    "derived_checks", "docs_index", "expectation_name", "expectation_suite", "handle_invalid", "new_run_id",
    "policy", "publish_docs", "quarantine_batch", "quarantine_root", "run_great_expectations", "screen_batches",
    "validate_batch", "validate_table", "validation_root",
]  # fmt: skip
