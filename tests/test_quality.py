"""Data quality (features.quality, Great Expectations 1.x): nothing bad reaches a store, nothing good is lost.

- The suite derived from the definitions (no Spark), the policy and expectation fields of a FeatureGroup.
- Feature rows corrupted in each way the suite covers: Great Expectations and the one-pass screen both reject
  exactly the corrupted check, and the screen passes a clean batch (including float rounding of averages).
- Source records that cannot be used land in the quarantine folder with their reason; the stores hold exactly
  the reference values of the good records.
- A batch failing a user expectation under "fail" leaves both stores untouched (the CLI prints one line naming
  it); under "quarantine" it is set aside with its Great Expectations result and later good batches are written.
- `features validate` names a failing user expectation in its output and in the Data Docs HTML.
"""

from __future__ import annotations

import json
import math
import warnings
from datetime import UTC, datetime
from pathlib import Path

import great_expectations as gx
import pandas as pd
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F
from reference import reference_frame

from features import DefinitionError, Entity, EventSource, Feature, FeatureGroup, Hop, Lifetime, agg
from features.errors import ValidationFailed
from features.pipelines.backfill import backfill
from features.repo import Repo
from features.spec import WINDOW_END, AggKind

MICROS = 1_000_000
USER = Entity("user", join_keys=["user_id"])
SOURCE = EventSource("transactions", path="data/transactions", timestamp="event_ts")

# A group with every kind of derived check.
ROWS_GROUP = FeatureGroup(
    "rows_group",
    USER,
    SOURCE,
    [
        Feature("n_1h", agg.count(), Hop("1h", every="5m")),
        Feature("merchants_1h", agg.approx_count_distinct("merchant_id"), Hop("1h", every="5m")),
        Feature("sum_1h", agg.sum("amount"), Hop("1h", every="5m")),
        Feature("avg_1h", agg.avg("amount"), Hop("1h", every="5m")),
        Feature("min_1h", agg.min("amount"), Hop("1h", every="5m")),
        Feature("max_1h", agg.max("amount"), Hop("1h", every="5m")),
        Feature("p90_1h", agg.approx_percentile("amount", 0.9), Hop("1h", every="5m")),
        Feature("sd_1h", agg.stddev("amount"), Hop("1h", every="5m")),
        Feature("avg_1d", agg.avg("amount"), Hop("1d", every="1h")),  # no min/max of its own window
        Feature("n_day", agg.count(), Hop("1d", every="1h")),
    ],
)


def checks_of(group: FeatureGroup, **kwargs) -> dict[str, object]:
    from features.quality import derived_checks

    return {c.name: c.expectation for c in derived_checks(group, **kwargs)}


# ---------------------------------------------------------------------------------------------------------
# Definitions and the derived suite (no Spark)


def test_suite_is_derived_from_the_definitions() -> None:
    checks = checks_of(ROWS_GROUP)
    types = {name: e.expectation_type for name, e in checks.items()}
    assert types["not_null(user_id)"] == "expect_column_values_to_not_be_null"
    assert types["not_null(window_end)"] == "expect_column_values_to_not_be_null"
    assert types["unique(user_id, window_end)"] == "expect_compound_columns_to_be_unique"
    assert checks["unique(user_id, window_end)"].column_list == ["user_id", "window_end"]
    assert types["aligned(window_end)"] == "unexpected_rows_expectation"
    # 1h is a multiple of 5m: one grid, 5 minutes.
    assert "pmod(unix_micros(`window_end`), 300000000) = 0" in checks["aligned(window_end)"].unexpected_rows_query
    assert "3600000000" not in checks["aligned(window_end)"].unexpected_rows_query
    for count in ("n_1h", "merchants_1h", "n_day"):
        assert types[f"integer({count})"] == "expect_column_values_to_be_in_type_list"
        assert types[f"not_null({count})"] == "expect_column_values_to_not_be_null"
        assert checks[f"non_negative({count})"].min_value == 0
    for finite in ("sum_1h", "avg_1h", "avg_1d", "p90_1h"):
        assert checks[f"finite({finite})"].min_value == -math.inf or checks[f"finite({finite})"].min_value < -1e300
        assert checks[f"finite({finite})"].max_value > 1e300
    assert checks["finite(sd_1h)"].min_value == 0
    assert "not_null(sum_1h)" in checks and "not_null(avg_1h)" not in checks  # an empty window averages to null
    # The average lies between the min and max of the same window; the 1d average has no such companions.
    assert types["within(avg_1h, min_1h, max_1h)"] == "unexpected_rows_expectation"
    assert not any(name.startswith("within(avg_1d") for name in checks)
    # A percentile lies between them too, up to its estimate's 1% accuracy.
    assert types["at_least(p90_1h, min_1h)"] == types["at_most(p90_1h, max_1h)"] == "unexpected_rows_expectation"
    # Every derived expectation says what it checks (that is its name in reports and Data Docs).
    assert all(e.description for e in checks.values())


def test_the_newer_aggregations_derive_their_checks_from_their_operation() -> None:
    hop = Hop("1h", every="5m")
    group = FeatureGroup(
        "newer_checks",
        USER,
        SOURCE,
        [
            Feature("var_1h", agg.variance("amount"), hop),
            Feature("skew_1h", agg.skew("amount"), hop),
            Feature("kurt_1h", agg.kurtosis("amount"), hop),
            Feature("merchants_max5", agg.bounded_count_distinct("merchant_id", 5), hop),
            Feature("status_hist", agg.histogram("status"), hop),
            Feature("top2", agg.top_frequent("status", 2), hop),
            Feature("last_amounts", agg.top_k("amount", 3), hop),
        ],
    )
    checks = checks_of(group)
    assert checks["finite(var_1h)"].min_value == 0  # a variance is never negative
    assert checks["finite(skew_1h)"].min_value < -1e300 and checks["finite(kurt_1h)"].min_value < -1e300
    assert checks["integer(merchants_max5)"].type_list and checks["non_negative(merchants_max5)"].min_value == 0
    assert checks["at_most_k(merchants_max5)"].max_value == 5
    assert "not_null(status_hist)" in checks and "not_null(top2)" in checks  # an empty window is {}, not null
    assert not any("last_amounts" in name for name in checks)  # a list is null for an empty window


def test_companions_need_the_same_column_window_and_filter() -> None:
    group = FeatureGroup(
        "g",
        USER,
        SOURCE,
        [
            Feature("avg_1h", agg.avg("amount"), Hop("1h", every="5m")),
            Feature("max_1h_failed", agg.max("amount"), Hop("1h", every="5m"), where="status = 'FAILED'"),
            Feature("min_2h", agg.min("amount"), Hop("2h", every="5m")),
            Feature("max_fee_1h", agg.max("fee"), Hop("1h", every="5m")),
            Feature("lifetime", agg.count(), Lifetime(every="1h")),
        ],
    )
    assert not any(name.startswith(("within", "at_least", "at_most")) for name in checks_of(group))


def test_range_start_and_whole_tables_in_the_alignment_check() -> None:
    start = datetime(2026, 1, 1, 6, 3, tzinfo=UTC)
    query = checks_of(ROWS_GROUP, range_start=start)["aligned(window_end)"].unexpected_rows_query
    assert f"timestamp_micros({int(start.timestamp()) * MICROS})" in query
    table_query = checks_of(ROWS_GROUP, table=True)["aligned(window_end)"].unexpected_rows_query
    assert "lag(" in table_query and "row_number()" in table_query


def test_user_expectations_are_merged_into_the_suite_and_left_untouched() -> None:
    from features.quality import expectation_suite

    mine = gx.expectations.ExpectColumnValuesToBeBetween(column="sum_1h", max_value=10_000, description="spend cap")
    group = FeatureGroup("g", USER, SOURCE, list(ROWS_GROUP.features), expectations=[mine], on_invalid="quarantine")
    suite = expectation_suite(group)
    assert suite.expectations[-1].description == "spend cap"
    assert len(suite.expectations) == len(checks_of(ROWS_GROUP)) + 1
    assert mine.id is None and group.expectations == (mine,)  # the suite holds a copy
    assert group.on_invalid == "quarantine"


def test_policy_and_expectations_are_checked_when_defined() -> None:
    with pytest.raises(DefinitionError) as info:
        FeatureGroup("g", USER, SOURCE, list(ROWS_GROUP.features), on_invalid="skip")
    assert info.value.field == "FeatureGroup('g').on_invalid" and "quarantine" in info.value.fix
    with pytest.raises(DefinitionError) as info:
        FeatureGroup("g", USER, SOURCE, list(ROWS_GROUP.features), expectations=["sum_1h < 10"])
    assert info.value.field == "FeatureGroup('g').expectations" and "gx.expectations" in info.value.fix
    typo = gx.expectations.ExpectColumnValuesToNotBeNull(column="sum_1hh")
    with pytest.raises(DefinitionError) as info:
        FeatureGroup("g", USER, SOURCE, list(ROWS_GROUP.features), expectations=[typo])
    assert "'sum_1hh'" in info.value.problem and "sum_1h" in info.value.fix
    assert EventSource("s", path="p", timestamp="ts", max_future="2h").max_future_s == 7200
    assert EventSource("s", path="p", timestamp="ts", max_future=None).max_future_s is None
    with pytest.raises(DefinitionError) as info:
        EventSource("s", path="p", timestamp="ts", max_future="soon")
    assert info.value.field == "EventSource('s').max_future"


# ---------------------------------------------------------------------------------------------------------
# Corrupted feature rows: Great Expectations and the one-pass screen agree


USERS = 12  # each corruption below hits one row of its own user


def clean_rows(spark):
    """Change points of ROWS_GROUP that satisfy every check, for USERS users of two patterns each (u<i>, v<i>);
    in the v pattern the average of three 0.1 values rounds above their max, 0.1 (as Spark computes it)."""
    t = [datetime(2026, 1, 1, 0, m, tzinfo=UTC) for m in (5, 10, 15)]
    tenth_avg = (0.1 + 0.1 + 0.1) / 3
    assert tenth_avg > 0.1
    values = []
    for i in range(USERS):
        values += [
            (f"u{i}", t[0], 1, 1, 10.0, 10.0, 10.0, 10.0, 10.0, None, 10.0, 1),
            (f"u{i}", t[1], 4, 2, 10.3, 2.575, 0.1, 10.0, 10.0, 4.95, 2.575, 4),
            (f"v{i}", t[0], 3, 1, 0.30000000000000004, tenth_avg, 0.1, 0.1, 0.1, 0.0, tenth_avg, 3),
            (f"v{i}", t[2], 0, 0, 0.0, None, None, None, None, None, tenth_avg, 3),
        ]
    schema = (
        "user_id string, window_end timestamp, n_1h bigint, merchants_1h bigint, sum_1h double, avg_1h double, "
        "min_1h double, max_1h double, p90_1h double, sd_1h double, avg_1d double, n_day bigint"
    )
    return spark.createDataFrame(values, schema)


def corrupt(rows, user: int, column: str, value):
    """`value` in `column` of user u<user>'s row at 00:10."""
    target = (F.col("user_id") == f"u{user}") & (F.minute(WINDOW_END) == 10)
    return rows.withColumn(column, F.when(target, value).otherwise(F.col(column)))


# name -> (corrupt the rows, using user i; the checks that must fail)
CORRUPTIONS = {
    "null key": (lambda r, i: corrupt(r, i, "user_id", F.lit(None)), {"not_null(user_id)"}),
    "duplicate row": (
        lambda r, i: r.unionByName(r.where((F.col("user_id") == f"u{i}") & (F.minute(WINDOW_END) == 10))),
        {"unique(user_id, window_end)"},
    ),
    "off the grid": (
        lambda r, i: corrupt(r, i, WINDOW_END, F.col(WINDOW_END) + F.expr("INTERVAL 2 MINUTES")),
        {"aligned(window_end)"},
    ),
    "negative count": (lambda r, i: corrupt(r, i, "n_1h", F.lit(-1)), {"non_negative(n_1h)"}),
    "null count": (lambda r, i: corrupt(r, i, "merchants_1h", F.lit(None)), {"not_null(merchants_1h)"}),
    "count is not an integer": (
        lambda r, i: r.withColumn("n_day", F.col("n_day").cast("double")),
        {"integer(n_day)"},
    ),
    "NaN sum": (lambda r, i: corrupt(r, i, "sum_1h", F.lit(float("nan"))), {"finite(sum_1h)"}),
    "infinite average": (lambda r, i: corrupt(r, i, "avg_1d", F.lit(float("inf"))), {"finite(avg_1d)"}),
    "average above max": (lambda r, i: corrupt(r, i, "avg_1h", F.lit(10.5)), {"within(avg_1h, min_1h, max_1h)"}),
    "percentile below min": (lambda r, i: corrupt(r, i, "p90_1h", F.lit(0.05)), {"at_least(p90_1h, min_1h)"}),
    "negative stddev": (lambda r, i: corrupt(r, i, "sd_1h", F.lit(-0.5)), {"finite(sd_1h)"}),
}
assert len(CORRUPTIONS) <= USERS


def screened(rows) -> set[str]:
    """The checks the one-pass screen rejects."""
    from features.quality.checks import derived_checks
    from features.quality.screen import screen_rows

    counts = screen_rows(rows, derived_checks(ROWS_GROUP))[()].rejected
    return {name for name, n in counts.items() if n}


@pytest.mark.spark
def test_clean_rows_pass_in_one_spark_job(spark) -> None:
    from features.quality import validate_batch
    from features.quality.report import outcome_of

    rows = clean_rows(spark).persist()
    report = validate_batch(ROWS_GROUP, rows)
    assert report.success, report.summary()
    assert report.rows == 4 * USERS and report.evaluated_by == "one-pass screen"
    assert len(report.outcomes) == len(checks_of(ROWS_GROUP))
    assert report._built is None  # Great Expectations' objects wait until someone reads them
    assert report.result.success and report.result.statistics["unsuccessful_expectations"] == 0
    assert [outcome_of(r) for r in report.result.results] == report.outcomes  # the same outcomes, made without them
    full = validate_batch(ROWS_GROUP, rows, mode="full")  # Great Expectations agrees, expectation by expectation
    assert full.success, full.summary()
    assert full.evaluated_by == "great_expectations" and len(full.outcomes) == len(report.outcomes)
    rows.unpersist()


@pytest.mark.spark
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_screen_counts_duplicate_window_ends_exactly(spark, seed: int) -> None:
    """The screen's uniqueness count (window ends as bits per hash of the key and block of slots) against a
    brute-force count: ends on the grid over many blocks, repeated ends, null ends and null keys."""
    import numpy as np

    from features.quality.checks import derived_checks
    from features.quality.screen import screen_rows

    rng = np.random.default_rng(seed)
    n = 3000
    keys = rng.choice(["a", "b", "c", "d", None], size=n, p=[0.3, 0.3, 0.2, 0.15, 0.05])
    # 5 minutes is the grid's slot; 3000 slots span 47 blocks of 64; before 1970 too.
    ends = pd.Timestamp("1969-12-31 12:00", tz="UTC") + pd.to_timedelta(rng.integers(0, 3000, n) * 5, unit="min")
    frame = pd.DataFrame({"user_id": keys, WINDOW_END: ends})
    frame.loc[rng.choice(n, 20, replace=False), WINDOW_END] = pd.NaT
    rows = spark.createDataFrame(frame, "user_id string, window_end timestamp")
    for feat in ROWS_GROUP.features:
        rows = rows.withColumn(feat.name, F.lit(None).cast("bigint" if feat.name.startswith("n") else "double"))
    checks = [c for c in derived_checks(ROWS_GROUP) if c.unique]
    counts = screen_rows(rows, checks)[()].rejected
    valid = frame.dropna(subset=[WINDOW_END]).astype({"user_id": object}).fillna({"user_id": "<null>"})
    assert counts["unique(user_id, window_end)"] == n - len(valid.drop_duplicates())


@pytest.mark.spark
@pytest.mark.parametrize("corruption", list(CORRUPTIONS), ids=list(CORRUPTIONS))
def test_each_corruption_fails_exactly_its_check(spark, corruption: str) -> None:
    make, expected = CORRUPTIONS[corruption]
    assert screened(make(clean_rows(spark), 0)) == expected


@pytest.mark.spark
def test_batches_screened_in_one_job_are_each_screened_as_alone(spark) -> None:
    """screen_batches (the stream's final and eager rows in one job): each batch gets what the screen finds in
    it alone, and validate_batch takes that as its screen."""
    from features.quality import screen_batches, validate_batch

    clean = clean_rows(spark)
    batches = {name: make(clean, 0) for name, (make, _) in list(CORRUPTIONS.items())[:3]}
    batches["clean"] = clean
    together = None
    for name, rows in batches.items():
        tagged = rows.withColumn("batch", F.lit(name))
        together = tagged if together is None else together.unionByName(tagged)
    found = {name: screen for (name,), screen in screen_batches(ROWS_GROUP, together, ["batch"]).items()}
    assert set(found) == set(batches)
    for name, rows in batches.items():
        assert {c for c, n in found[name].rejected.items() if n} == screened(rows), name
        assert found[name].rows == rows.count()
    report = validate_batch(ROWS_GROUP, clean, screened=found["clean"])
    assert report.success and report.rows == clean.count() and report.evaluated_by == "one-pass screen"
    with pytest.raises(ValueError, match="screened rows"):
        validate_batch(ROWS_GROUP, clean, screened=found["clean"], mode="full")


@pytest.mark.spark
def test_great_expectations_rejects_every_corruption_and_agrees_with_the_screen(spark) -> None:
    from features.quality import validate_batch

    rows = clean_rows(spark)
    for i, (make, _) in enumerate(CORRUPTIONS.values()):
        rows = make(rows, i)
    rows = rows.persist()
    expected = set().union(*(checks for _, checks in CORRUPTIONS.values()))
    report = validate_batch(ROWS_GROUP, rows)  # the screen flags them, then Great Expectations runs the suite
    assert not report.success and report.evaluated_by == "great_expectations"
    assert {o.check for o in report.failures} == expected == screened(rows), report.summary()
    assert all(not o.user and o.error is None for o in report.failures)
    unexpected = {o.check: o.unexpected for o in report.failures}
    assert unexpected["unique(user_id, window_end)"] == 2  # both copies of the duplicated row
    assert unexpected["not_null(user_id)"] == 1 and unexpected["within(avg_1h, min_1h, max_1h)"] == 1
    # The result is Great Expectations' own object, serializable as JSON, and a table for notebooks.
    assert json.loads(json.dumps(report.to_json_dict(), default=str))["success"] is False
    table = report.to_pandas()
    assert (~table["success"]).sum() == len(expected)
    rows.unpersist()


# ---------------------------------------------------------------------------------------------------------
# End to end: a Feast repo, a JSON source with bad records, backfills under both policies

START = pd.Timestamp("2026-01-01", tz="UTC")
NOW = datetime(2026, 1, 10, tzinfo=UTC)
JSON_SOURCE = EventSource(
    "transactions",
    path="data/transactions",
    format="json",
    timestamp="event_ts",
    schema={
        "txn_id": "string",
        "user_id": "string",
        "card_id": "string",
        "merchant_id": "string",
        "amount": "double",
        "status": "string",
        "event_ts": "timestamp",
        "is_fraud": "int64",
    },
)
SPEND_CAP = gx.expectations.ExpectColumnValuesToBeBetween(
    column="amount_sum_1h", max_value=50_000, description="hourly spend stays under 50k"
)
FEATURES = [
    Feature("txn_count_1h", agg.count(), Hop("1h", every="5m")),
    Feature("amount_sum_1h", agg.sum("amount"), Hop("1h", every="5m")),
    Feature("amount_avg_1h", agg.avg("amount"), Hop("1h", every="5m")),
    Feature("amount_max_1h", agg.max("amount"), Hop("1h", every="5m")),
    Feature("failed_24h", agg.count(), Hop("24h", every="1h"), where="status = 'FAILED'"),
    Feature("txn_count_lifetime", agg.count(), Lifetime(every="1h")),
]


def spend_group(**kwargs) -> FeatureGroup:
    return FeatureGroup("user_spend", USER, JSON_SOURCE, FEATURES, **kwargs)


def events_for(days: int, seed: int) -> pd.DataFrame:
    from features.demo import generate_transactions

    return generate_transactions(400 * days, 8, START, days, seed=seed, null_amount_rate=0.0)


BAD_LINES = [
    ('{"txn_id": "bad1", "user_id": "u000001", "amount": 5.0, "event_ts": "2026-01-01T10:00:00Z"', "unparseable_json"),
    ("this is not json", "unparseable_json"),
    (
        '{"txn_id": "bad3", "user_id": "u000001", "amount": "lots", "status": "APPROVED", '
        '"event_ts": "2026-01-01T10:00:00Z"}',
        "wrong_type: amount",
    ),
    (
        '{"txn_id": "bad4", "user_id": "u000002", "amount": 7.0, "status": "APPROVED", "event_ts": "yesterday"}',
        "wrong_type: event_ts",
    ),
    (
        '{"txn_id": "bad5", "amount": 9.0, "status": "APPROVED", "event_ts": "2026-01-01T11:00:00Z"}',
        "missing_key: user_id",
    ),
    ('{"txn_id": "bad6", "user_id": "u000003", "amount": 9.0, "status": "APPROVED"}', "missing_timestamp"),
    (
        '{"txn_id": "bad7", "user_id": "u000003", "amount": 9.0, "status": "APPROVED", '
        '"event_ts": "2099-01-01T00:00:00Z"}',
        "future_timestamp",
    ),
    (
        # a default value, not an event: it would count in every Lifetime value and make a 1970 partition
        '{"txn_id": "bad8", "user_id": "u000003", "amount": 9.0, "status": "APPROVED", '
        '"event_ts": "1970-01-01T00:00:00Z"}',
        "past_timestamp",
    ),
]


def write_source(root: Path, events: pd.DataFrame, bad_lines: list[str]) -> None:
    from features.demo import write_events

    folder = root / "data" / "transactions"
    for old in folder.glob("*.json"):
        old.unlink()
    write_events(events, folder, format="json", n_files=2)
    if bad_lines:
        (folder / "part-00002.json").write_text("\n".join(bad_lines) + "\n")


def run(spark, root: Path, start: pd.Timestamp, end: pd.Timestamp, **kwargs):
    return backfill(
        Repo.load(root), start.to_pydatetime(), end.to_pydatetime(), spark=spark, progress=False, now=NOW, **kwargs
    )


def store_of(root: Path):
    from feast import FeatureStore

    return FeatureStore(repo_path=str(root))


def online_values(root: Path, group: FeatureGroup, users: list[str]) -> pd.DataFrame:
    refs = [f"{group.name}:{f.name}" for f in group.features]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        values = store_of(root).get_online_features(features=refs, entity_rows=[{"user_id": u} for u in users])
    return values.to_df()[["user_id", *(f.name for f in group.features)]]


def offline_rows(root: Path, group: FeatureGroup) -> pd.DataFrame:
    from features.stores import offline

    path = str(root / "data" / "offline" / group.name)
    if not offline.exists(path):
        return pd.DataFrame()
    table = offline.read_pandas(path)
    return table.sort_values(["user_id", WINDOW_END], ignore_index=True)


def assert_values(group: FeatureGroup, got: pd.DataFrame, want: pd.DataFrame, what: str) -> None:
    """Feast's values equal the reference (null where there is no row yet: an empty window for counts/sums)."""
    problems = []
    for feat in group.features:
        for i, (g, w) in enumerate(zip(got[feat.name], want[feat.name], strict=True)):
            g = None if g is None or (isinstance(g, float) and math.isnan(g)) else g
            if g is None and feat.aggregation.kind.empty_is_zero:
                g = 0
            if w is None or g is None:
                ok = w is None and g is None
            elif isinstance(w, float) or feat.aggregation.kind is AggKind.AVG:
                ok = math.isclose(g, w, rel_tol=1e-9, abs_tol=1e-9)
            else:
                ok = g == w
            if not ok:
                problems.append(f"{feat.name} {want.loc[i, 'user_id']} t={want.loc[i, 't']}: got {g!r}, want {w!r}")
    assert not problems, f"{what}: {len(problems)} mismatches:\n" + "\n".join(problems[:10])


def historical_values(root: Path, group: FeatureGroup, lookups: pd.DataFrame) -> pd.DataFrame:
    entity_df = lookups[["user_id"]].copy()
    entity_df["event_timestamp"] = lookups["t"].astype("datetime64[us, UTC]").to_numpy()
    entity_df["row_id"] = range(len(lookups))
    refs = [f"{group.name}:{f.name}" for f in group.features]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = store_of(root).get_historical_features(entity_df=entity_df, features=refs).to_df()
    return out.sort_values("row_id").reset_index(drop=True)


def lookups(events: pd.DataFrame, times: list[pd.Timestamp]) -> list[tuple[tuple, pd.Timestamp]]:
    users = sorted(events["user_id"].unique())
    return [((u,), t) for u in users for t in times]


@pytest.mark.spark
def test_bad_source_records_are_quarantined_and_good_ones_all_count(spark, feast_repo) -> None:
    group = spend_group()
    events = events_for(1, seed=11)
    root = feast_repo([group])
    write_source(root, events, [line for line, _ in BAD_LINES])
    end = START + pd.Timedelta(days=1, hours=2)
    [result] = run(spark, root, START, end)

    # Every bad record is in the quarantine folder once, with its reason, and counted.
    want_reasons = pd.Series([reason for _, reason in BAD_LINES]).value_counts().to_dict()
    assert dict(result.quarantined) == want_reasons
    assert result.records_quarantined == len(BAD_LINES)
    assert "bad source records quarantined" in result.summary() and result.quarantine_path in result.summary()
    folder = Path(result.quarantine_path)
    assert folder.is_relative_to(root / "data" / "quarantine" / group.name / "records")
    quarantined = pd.concat([pq.read_table(p).to_pandas() for p in folder.glob("*.parquet")], ignore_index=True)
    assert sorted(quarantined["reason"]) == sorted(reason for _, reason in BAD_LINES)
    assert set(quarantined.columns) >= {"reason", "source_file", "raw_record", "user_id", "event_ts"}
    unparseable = quarantined[quarantined["reason"] == "unparseable_json"]
    assert "this is not json" in set(unparseable["raw_record"])
    assert (quarantined["source_file"].str.endswith("part-00002.json")).all()

    # Every good record counts, and nothing else: both stores hold the reference values of the good records.
    assert result.rows_in == len(events)
    assert result.validation is not None and result.validation.success
    users = sorted(events["user_id"].unique())
    want = reference_frame(events, group, lookups(events, [end]))
    assert_values(group, online_values(root, group, users), want, "online")
    times = [START + pd.Timedelta(minutes=m) for m in (7, 65, 301, 600, 613, 1000, 1439)]
    want = reference_frame(events, group, lookups(events, times))
    assert_values(group, historical_values(root, group, want), want, "offline (Feast point-in-time)")


@pytest.fixture(scope="module")
def spike_events() -> pd.DataFrame:
    """Three days of ordinary transactions, and on day 2 one huge legitimate-looking charge."""
    events = events_for(3, seed=12)
    spike = events.iloc[[0]].copy()
    spike["txn_id"] = "spike"
    spike["amount"] = 1_000_000.0
    spike["event_ts"] = pd.Timestamp("2026-01-02 12:00", tz="UTC")
    return pd.concat([events, spike], ignore_index=True)


DAY = pd.Timedelta(days=1)


@pytest.mark.spark
def test_failing_batch_under_fail_leaves_both_stores_untouched(spark, feast_repo, spike_events, capsys) -> None:
    from features.cli import main

    group = spend_group(expectations=[SPEND_CAP])  # on_invalid unset: a backfill fails
    root = feast_repo([group])
    write_source(root, spike_events, [])
    [first] = run(spark, root, START, START + DAY)
    assert first.validation is not None and first.validation.success and first.rows_out > 0
    users = sorted(spike_events["user_id"].unique())
    table_before, online_before = offline_rows(root, group), online_values(root, group, users)

    # The library raises ValidationFailed naming the expectation; the CLI prints one line and exits 1.
    with pytest.raises(ValidationFailed) as info:
        run(spark, root, START + DAY, START + 2 * DAY)
    message = str(info.value)
    assert "'hourly spend stays under 50k'" in message and "nothing was written" in message
    report = info.value.report
    assert [o.name for o in report.failures] == ["hourly spend stays under 50k"] and report.failures[0].user
    assert Path(report.result_path).is_file() and json.loads(Path(report.result_path).read_text())["success"] is False
    assert report.result_path in message
    code = main(["backfill", "--repo", str(root), "--start", "2026-01-02", "--end", "2026-01-03"])
    err = capsys.readouterr().err
    assert code == 1
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ") and "hourly spend stays under 50k" in err

    pd.testing.assert_frame_equal(offline_rows(root, group), table_before)
    pd.testing.assert_frame_equal(online_values(root, group, users), online_before)
    assert not (root / "data" / "quarantine" / group.name / "batches").exists()


@pytest.mark.spark
def test_failing_batch_under_quarantine_is_set_aside_and_good_batches_go_on(spark, feast_repo, spike_events) -> None:
    group = spend_group(expectations=[SPEND_CAP], on_invalid="quarantine")
    root = feast_repo([group])
    write_source(root, spike_events, [])
    results = [run(spark, root, START + i * DAY, START + (i + 1) * DAY)[0] for i in range(3)]
    good1, bad, good3 = results
    assert good1.batch_quarantined is None and good3.batch_quarantined is None
    assert bad.rows_out == 0 and bad.online_rows == 0
    assert "failed validation" in bad.summary() and "hourly spend stays under 50k" in bad.summary()
    folder = Path(bad.batch_quarantined)
    assert folder.parent == root / "data" / "quarantine" / group.name / "batches"
    saved = json.loads((folder / "result.json").read_text())
    failed = [r for r in saved["results"] if not r["success"]]
    assert [r["expectation_config"]["description"] for r in failed] == ["hourly spend stays under 50k"]
    rows = pd.concat([pq.read_table(p).to_pandas() for p in (folder / "rows").glob("*.parquet")])
    assert rows["amount_sum_1h"].max() >= 1_000_000 and len(rows) == bad.validation.rows

    # The stores hold the two good batches, and nothing of the quarantined one.
    table = offline_rows(root, group)
    days = pd.to_datetime(table[WINDOW_END], utc=True).dt.floor("D")
    assert set(days) == {START, START + 2 * DAY}
    times = [START + pd.Timedelta(hours=h) for h in (1, 9.5, 23.99)] + [
        START + 2 * DAY + pd.Timedelta(hours=h) for h in (0, 7.25, 23.5)
    ]
    want = reference_frame(spike_events, group, lookups(spike_events, times))
    assert_values(group, historical_values(root, group, want), want, "offline")
    users = sorted(spike_events["user_id"].unique())
    want = reference_frame(spike_events, group, lookups(spike_events, [START + 3 * DAY]))
    assert_values(group, online_values(root, group, users), want, "online")


@pytest.mark.spark
def test_validate_command_names_a_failing_user_expectation_in_output_and_data_docs(
    spark, feast_repo, spike_events, capsys
) -> None:
    from conftest import definitions_code

    from features.cli import main

    root = feast_repo([spend_group()])
    write_source(root, spike_events, [])
    run(spark, root, START + DAY, START + 2 * DAY)  # no expectation of the user's yet: written
    # The user then adds an expectation that the stored table breaks.
    [module] = root.glob("test_definitions_*.py")
    module.unlink()
    (root / "test_definitions_with_cap.py").write_text(definitions_code([spend_group(expectations=[SPEND_CAP])]))

    code = main(["validate", "--repo", str(root)])
    out = capsys.readouterr().out
    assert code == 1
    assert "FAILED user expectation 'hourly spend stays under 50k'" in out
    docs = out.split("Data Docs: ", 1)[1].split()[0]
    assert Path(docs).is_file() and Path(docs).is_relative_to(root / "data" / "validation")
    html = Path(docs).read_text()
    assert "hourly spend stays under 50k" in html
    # Only the user's expectation failed: the derived suite holds on the whole table.
    assert out.count("FAILED") == 1
