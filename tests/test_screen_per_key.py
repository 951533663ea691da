"""The validation screen from a per-key aggregation that its caller made (the backfill adds each key's newest
row to it, so that the staged rows are read once): it flags exactly what the screen over the rows flags, for
a clean batch and for the corruptions of tests/test_quality.py."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F
from test_quality import CORRUPTIONS, ROWS_GROUP, clean_rows

from features.quality import _screen, derived_checks, screen_aggregates, validate_batch
from features.spec import WINDOW_END

pytestmark = pytest.mark.spark


def per_key(rows):
    by, aggregates = screen_aggregates(ROWS_GROUP)
    assert by == list(ROWS_GROUP.join_keys)
    return rows.groupBy(*by).agg(*aggregates, F.max(WINDOW_END).alias("_newest"))  # plus a column of its own


@pytest.mark.parametrize("corrupted", [False, True], ids=["clean", "every-corruption"])
def test_screen_from_per_key_aggregates_agrees(spark, corrupted: bool) -> None:
    rows = clean_rows(spark)
    expected: set[str] = set()
    if corrupted:  # each corruption on a user of its own
        for i, (make, checks) in enumerate(CORRUPTIONS.values()):
            rows, expected = make(rows, i), expected | checks
    rows = rows.persist()
    checks = derived_checks(ROWS_GROUP)
    n, counts = _screen(rows, checks, per_key(rows))
    assert (n, counts) == _screen(rows, checks)
    assert {name for name, count in counts.items() if count} == expected
    rows.unpersist()


def test_validate_batch_with_per_key_aggregates(spark) -> None:
    rows = clean_rows(spark)
    report = validate_batch(ROWS_GROUP, rows, screened=per_key(rows))
    assert report.success and report.evaluated_by == "one-pass screen" and report.rows == rows.count()
