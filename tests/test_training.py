"""Training sets (features.training_set) through Feast's get_historical_features, against the reference.

- Every value of every feature equals the brute-force reference of docs/semantics.md at the row's time:
  at pane boundaries, before a key's first event and for keys never seen (0 for counts, sums and
  approx_count_distinct, null for the rest), with the caller's rows, columns and order kept.
- pandas in, pandas out; Spark in, Spark out; naive timestamps are UTC; a timestamp column of any name.
- The lineage (features, definition hashes, the rows' time range) lands on the active MLflow run and
  `find_runs` finds the run by feature; with no active run nothing is logged.
- Mistakes name the column, group or feature and the fix.
- The demo classifier (features.demo.train) learns from the windowed features: on a later, held-out time
  range its ROC AUC with them clearly beats the same model on the amount alone.
"""

from __future__ import annotations

import json
import math
import shutil
import warnings
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd
import pytest
from groups import SOURCE, user_transactions
from reference import reference_frame

from features import ConfigError, Entity, Feature, FeatureGroup, Hop, Lifetime, agg
from features.ml import tracking
from features.ml.training import resolve_features, training_set
from features.pipelines.backfill import backfill
from features.repo import Repo
from features.spec.fingerprint import definition_hash, feature_hashes

pytestmark = pytest.mark.spark

START = pd.Timestamp("2026-01-01", tz="UTC")
END = pd.Timestamp("2026-01-03 06:00", tz="UTC")
USER = user_transactions(
    Feature("merchants_exact_24h", agg.count_distinct("merchant_id"), window=Hop("24h", every="1h"))
)
CARD_MERCHANT = FeatureGroup(
    name="card_merchant",
    entity=Entity("card_merchant", join_keys=["card_id", "merchant_id"]),
    source=SOURCE,
    features=[
        Feature("txn_count_1h", agg.count(), window=Hop("1h", every="5m")),
        Feature("amount_sum_24h", agg.sum("amount"), window=Hop("24h", every="1h")),
        Feature("last_status", agg.last("status"), window=Lifetime(every="5m")),
    ],
)
NEVER_BACKFILLED = FeatureGroup(
    name="never_backfilled",
    entity=Entity("user", join_keys=["user_id"]),
    source=SOURCE,
    features=[Feature("n_1h", agg.count(), window=Hop("1h", every="5m"))],
)
GROUPS = [USER, CARD_MERCHANT]
KEYS = ["user_id", "card_id", "merchant_id"]


@pytest.fixture(scope="module")
def events() -> pd.DataFrame:
    from features.demo import generate_transactions

    return generate_transactions(2_500, 15, START, 2, seed=17)


@pytest.fixture(scope="module")
def repo(spark, tmp_path_factory: pytest.TempPathFactory, feast_repo_factory, events: pd.DataFrame) -> Repo:
    root = feast_repo_factory(tmp_path_factory.mktemp("training") / "repo", [*GROUPS, NEVER_BACKFILLED], events)
    loaded = Repo.load(root)
    backfill(loaded, START, END, [g.name for g in GROUPS], spark=spark, progress=False, track=False)
    return loaded


@pytest.fixture
def no_fluent_run(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    yield
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(None)


def entity_rows(events: pd.DataFrame, n: int = 60, seed: int = 3) -> pd.DataFrame:
    """Labelled rows of real (user, card, merchant) triples at telling times: the transaction's own time, the
    window end where its pane enters and 1us before, when its 1h windows have left, a day later; plus a key
    never seen and the range start (before most keys' first event). Shuffled: the order must be kept."""
    rng = np.random.default_rng(seed)
    picked = events.iloc[rng.choice(len(events), n, replace=False)]
    rows = []
    for txn in picked.itertuples(index=False):
        ts = pd.Timestamp(txn.event_ts)
        entry = ts.floor("5min") + pd.Timedelta(minutes=5)
        times = [
            ts,
            entry,
            entry - pd.Timedelta(microseconds=1),
            entry + pd.Timedelta(hours=1),
            ts + pd.Timedelta("1d"),
        ]
        rows += [(txn.user_id, txn.card_id, txn.merchant_id, t, txn.is_fraud, txn.amount) for t in times]
        rows.append((txn.user_id, txn.card_id, txn.merchant_id, START, 0, 1.0))
    rows.append(("nobody", "no-card", "no-merchant", START + pd.Timedelta("30h"), 0, 2.0))
    frame = pd.DataFrame(rows, columns=[*KEYS, "t", "label", "amount"])
    frame = frame[(frame["t"] >= START) & (frame["t"] < END)]
    return frame.sample(frac=1.0, random_state=seed).reset_index(drop=True)


def _null(value: Any) -> bool:
    if value is None or value is pd.NA or value is pd.NaT:
        return True
    return isinstance(value, float | np.floating) and math.isnan(value)


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray | list | tuple):
        return [_plain(v) for v in value]
    return value.item() if isinstance(value, np.generic) else value


def same(got: Any, want: Any) -> bool:
    if _null(want) or _null(got):
        return _null(want) and _null(got)
    got, want = _plain(got), _plain(want)
    if isinstance(want, float):
        return math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-7)
    return got == want


def assert_reference(frame: pd.DataFrame, rows: pd.DataFrame, events: pd.DataFrame, full_names: bool) -> None:
    problems = []
    for group in GROUPS:
        lookups = [(tuple(r[k] for k in group.join_keys), r["t"]) for _, r in rows.iterrows()]
        want = reference_frame(events, group, lookups)
        for feature in group.features:
            column = f"{group.name}__{feature.name}" if full_names else feature.name
            for i, (g, w) in enumerate(zip(frame[column], want[feature.name], strict=True)):
                if not same(g, w):
                    problems.append(f"{column} row {i} key={lookups[i][0]} t={lookups[i][1]}: got {g!r}, want {w!r}")
    assert not problems, f"{len(problems)} mismatches, e.g.:\n" + "\n".join(problems[:15])


# ---------------------------------------------------------------------------------------------------------
# Values


def test_values_are_the_reference_values_at_each_rows_time(repo: Repo, events: pd.DataFrame):
    rows = entity_rows(events)
    frame = training_set(
        rows, ["user_transactions", CARD_MERCHANT], repo, timestamp_column="t", full_feature_names=True
    )
    assert len(frame) == len(rows)
    pd.testing.assert_frame_equal(frame[rows.columns], rows)  # the caller's rows, columns and order, as given
    features = [f"{g.name}__{f.name}" for g in GROUPS for f in g.features]
    assert list(frame.columns) == [*rows.columns, *features]
    assert_reference(frame, rows, events, full_names=True)
    # Never null where an empty window means 0, and typed as integers where they count.
    for column in (
        "user_transactions__failed_count_24h",
        "user_transactions__merchants_24h",
        "card_merchant__txn_count_1h",
    ):
        assert frame[column].dtype == np.int64
    assert frame["user_transactions__amount_sum_1h"].dtype == np.float64
    nobody = frame[frame["user_id"] == "nobody"].iloc[0]
    assert nobody["user_transactions__txn_count_lifetime"] == 0 and nobody["card_merchant__amount_sum_24h"] == 0.0
    assert _null(nobody["user_transactions__amount_max_24h"]) and _null(nobody["card_merchant__last_status"])
    assert frame.attrs["features.lineage"]["entity_rows"]["rows"] == len(rows)


def test_short_names_naive_times_and_the_default_timestamp_column(repo: Repo, events: pd.DataFrame):
    rows = entity_rows(events, n=15, seed=8).rename(columns={"t": "event_timestamp"})
    naive = rows.assign(event_timestamp=rows["event_timestamp"].dt.tz_localize(None))
    refs = ["user_transactions:failed_count_24h", "user_transactions:amount_max_24h", "card_merchant:txn_count_1h"]
    frame = training_set(naive, refs, repo.root)
    assert list(frame.columns) == [*naive.columns, "failed_count_24h", "amount_max_24h", "txn_count_1h"]
    aware = training_set(rows, refs, repo.root)
    pd.testing.assert_frame_equal(frame.drop(columns="event_timestamp"), aware.drop(columns="event_timestamp"))


def test_spark_rows_give_a_spark_frame_with_the_same_values(spark, repo: Repo, events: pd.DataFrame):
    rows = entity_rows(events, n=10, seed=5)
    refs = ["user_transactions:failed_count_24h", "user_transactions:last_amounts_1h", "card_merchant:last_status"]
    expected = training_set(rows, refs, repo, timestamp_column="t")
    result = training_set(spark.createDataFrame(rows), refs, repo, timestamp_column="t")
    assert not isinstance(result, pd.DataFrame)
    got = result.toPandas()
    assert list(got.columns) == list(expected.columns)
    for column in ("failed_count_24h", "last_amounts_1h", "last_status"):
        assert all(same(g, w) for g, w in zip(got[column], expected[column], strict=True)), column
    as_pandas = training_set(spark.createDataFrame(rows), refs, repo, timestamp_column="t", spark=False)
    assert isinstance(as_pandas, pd.DataFrame) and len(as_pandas) == len(rows)


# ---------------------------------------------------------------------------------------------------------
# Spark rows: joined in Spark (features.engine.pit), the same values as Feast's


def random_rows(events: pd.DataFrame, n: int, seed: int) -> pd.DataFrame:
    """Random labelled rows at telling times: a transaction's own time, exactly on a window end of 5 minutes or
    of 1 hour and 1us before it, the range start (before a key's first row), anywhere in the range; keys never
    seen, a composite key with a merchant the card never used; some rows twice. Shuffled."""
    rng = np.random.default_rng(seed)
    picked = events.iloc[rng.choice(len(events), n)]
    span_us = int((END - START) / pd.Timedelta(microseconds=1))
    rows = []
    for txn in picked.itertuples(index=False):
        ts = pd.Timestamp(txn.event_ts)
        five, hour = ts.floor("5min") + pd.Timedelta(minutes=5), ts.floor("1h") + pd.Timedelta(hours=1)
        anywhere = START + pd.Timedelta(microseconds=int(rng.integers(span_us)))
        choices = [ts, five, five - pd.Timedelta(microseconds=1), hour, hour - pd.Timedelta(microseconds=1), START]
        t = choices[int(rng.integers(len(choices)))] if rng.random() < 0.8 else anywhere
        merchant = txn.merchant_id if rng.random() < 0.9 else "m-never"
        rows.append((txn.user_id, txn.card_id, merchant, t, int(txn.is_fraud), float(txn.amount)))
    rows += [("nobody", "no-card", "no-merchant", START + pd.Timedelta("30h"), 0, 2.0)]
    rows += [rows[int(i)] for i in rng.choice(len(rows), max(2, n // 10))]  # duplicate label rows
    frame = pd.DataFrame(rows, columns=[*KEYS, "t", "label", "amount"])
    frame = frame[(frame["t"] >= START) & (frame["t"] < END)]
    return frame.sample(frac=1.0, random_state=seed).reset_index(drop=True)


def spark_frame(session, rows: pd.DataFrame):
    """`rows` as a Spark DataFrame of `session`, in their order, the time column a UTC timestamp."""
    return session.createDataFrame(rows.assign(t=rows["t"].dt.tz_convert("UTC").dt.tz_localize(None)))


def assert_same_values(got: pd.DataFrame, want: pd.DataFrame, columns: list[str]) -> None:
    problems = []
    for column in columns:
        for i, (g, w) in enumerate(zip(got[column], want[column], strict=True)):
            if not same(g, w):
                problems.append(f"{column} row {i}: got {g!r}, want {w!r}")
    assert not problems, f"{len(problems)} differences, e.g.:\n" + "\n".join(problems[:15])


def assert_rows_kept(got: pd.DataFrame, rows: pd.DataFrame) -> None:
    """The caller's rows in their order, every column kept (times compare as UTC instants)."""
    assert len(got) == len(rows)
    plain = [c for c in rows.columns if c != "t"]
    pd.testing.assert_frame_equal(got[plain].reset_index(drop=True), rows[plain], check_dtype=False)
    times = pd.to_datetime(got["t"])
    times = times.dt.tz_localize("UTC") if times.dt.tz is None else times.dt.tz_convert("UTC")
    assert (times.dt.as_unit("us") == rows["t"].dt.tz_convert("UTC").dt.as_unit("us")).all()


ALL_FEATURES = [f"{g.name}__{f.name}" for g in GROUPS for f in g.features]


def test_spark_join_equals_feast_and_the_reference_on_random_rows(spark, repo: Repo, events: pd.DataFrame):
    for seed in (1, 2):
        rows = random_rows(events, 70, seed)
        want = training_set(rows, GROUPS, repo, timestamp_column="t", full_feature_names=True, log_lineage=False)
        result = training_set(
            spark_frame(spark, rows), GROUPS, repo, timestamp_column="t", full_feature_names=True, log_lineage=False
        )
        assert not isinstance(result, pd.DataFrame)
        got = result.toPandas()
        assert list(got.columns) == [*rows.columns, *ALL_FEATURES]
        assert_rows_kept(got, rows)
        assert_same_values(got, want, ALL_FEATURES)
        assert_reference(got, rows, events, full_names=True)
        # Never null where an empty window means 0, and typed as integers where they count.
        fields = {f.name: f.dataType.simpleString() for f in result.schema.fields}
        assert fields["user_transactions__merchants_exact_24h"] == "bigint"
        assert fields["card_merchant__amount_sum_24h"] == "double"
        assert not got["user_transactions__merchants_exact_24h"].isna().any()


def test_spark_join_in_small_buckets_and_with_a_look_back(spark, repo: Repo, events: pd.DataFrame):
    """Label rows on the last day only: each key's value carried in from an earlier day's partition (the
    look-back) and, with buckets of 1h or 7min, from an earlier bucket, as Feast finds it."""
    from features.engine import pit

    rows = random_rows(events, 60, 4)
    last_day = pd.Timestamp("2026-01-03", tz="UTC")
    rows = rows.assign(t=last_day + (rows["t"] - START) % pd.Timedelta("6h"))
    refs = resolve_features(repo, GROUPS)
    want = training_set(rows, GROUPS, repo, timestamp_column="t", full_feature_names=True, log_lineage=False)
    assert want["card_merchant__last_status"].notna().sum() > 10  # values that only the look-back finds
    for bucket in (pd.Timedelta("1d"), pd.Timedelta("1h"), pd.Timedelta("7min")):
        joined = pit.join_features(
            spark_frame(spark, rows),
            refs,
            repo,
            "t",
            start=rows["t"].min().to_pydatetime(),
            end=rows["t"].max().to_pydatetime(),
            full_feature_names=True,
            bucket=bucket.to_pytimedelta(),
        )
        got = joined.toPandas()
        assert_rows_kept(got, rows)
        assert_same_values(got, want, ALL_FEATURES)


def test_spark_join_takes_naive_times_dates_and_iso_strings(spark, repo: Repo, events: pd.DataFrame):
    rows = random_rows(events, 20, 5)
    refs = ["user_transactions:failed_count_24h", "user_transactions:last_amounts_1h", "card_merchant:last_status"]
    want = training_set(rows, refs, repo, timestamp_column="t", log_lineage=False)
    columns = ["failed_count_24h", "last_amounts_1h", "last_status"]
    naive = spark_frame(spark, rows).withColumn("t", spark_functions().col("t").cast("timestamp_ntz"))
    iso = rows.assign(t=rows["t"].dt.tz_convert("Europe/Paris").map(lambda t: t.isoformat()))
    for frame in (naive, spark.createDataFrame(iso)):
        got = training_set(frame, refs, repo, timestamp_column="t", log_lineage=False).toPandas()
        assert_same_values(got, want, columns)
    # A date is its UTC midnight.
    days = rows.assign(t=rows["t"].dt.floor("1d"))
    at_midnight = training_set(days, refs, repo, timestamp_column="t", log_lineage=False)
    dated = spark.createDataFrame(days.assign(t=days["t"].dt.date))
    assert_same_values(training_set(dated, refs, repo, timestamp_column="t").toPandas(), at_midnight, columns)
    # spark=False: the Spark join, collected, typed as the pandas path types it.
    as_pandas = training_set(spark_frame(spark, rows), refs, repo, timestamp_column="t", spark=False)
    assert isinstance(as_pandas, pd.DataFrame)
    assert_same_values(as_pandas, want, columns)
    assert as_pandas["failed_count_24h"].dtype == want["failed_count_24h"].dtype == np.int64


def spark_functions():
    from pyspark.sql import functions

    return functions


def test_spark_join_lineage_is_the_pandas_paths(spark, repo: Repo, events: pd.DataFrame, no_fluent_run):
    rows = random_rows(events, 10, 6)
    refs = ["user_transactions:failed_count_24h", "card_merchant:txn_count_1h"]
    tracking.use(repo)
    with mlflow.start_run(run_name="pandas") as by_pandas:
        training_set(rows, refs, repo, timestamp_column="t")
    with mlflow.start_run(run_name="spark") as by_spark:
        training_set(spark_frame(spark, rows), refs, repo, timestamp_column="t")
    client = mlflow.MlflowClient()
    tags = [client.get_run(r.info.run_id).data.tags for r in (by_pandas, by_spark)]
    logged = {k: v for k, v in tags[0].items() if k.startswith("features.")}
    assert logged and logged == {k: v for k, v in tags[1].items() if k.startswith("features.")}
    assert tags[1]["features.training.rows"] == str(len(rows))
    assert tags[1]["features.training.start"] == rows["t"].min().isoformat()
    spark_json = Path(client.download_artifacts(by_spark.info.run_id, "features/training_set.json")).read_text()
    pandas_json = Path(client.download_artifacts(by_pandas.info.run_id, "features/training_set.json")).read_text()
    assert json.loads(spark_json) == json.loads(pandas_json)


def test_spark_join_mistakes_name_the_field_and_the_fix(spark, repo: Repo, events: pd.DataFrame):
    rows = random_rows(events, 4, 7)
    frame = spark_frame(spark, rows)
    fn = spark_functions()
    with pytest.raises(ConfigError, match=r"entity_rows: no column 'card_id', 'merchant_id', .* of card_merchant"):
        training_set(frame.drop("card_id", "merchant_id"), ["card_merchant"], repo, timestamp_column="t")
    with pytest.raises(ConfigError, match=r"timestamp_column: entity_rows have no column 'event_timestamp'; pass"):
        training_set(frame, ["user_transactions"], repo)
    untimed = frame.withColumn("t", fn.lit(None).cast("timestamp"))
    with pytest.raises(ConfigError, match=rf"entity_rows.t: {len(rows)} rows have no timestamp; drop or fill them"):
        training_set(untimed, ["user_transactions"], repo, timestamp_column="t")
    with pytest.raises(ConfigError, match=r"entity_rows.t: not timestamps \(Spark type double\); pass a timestamp"):
        training_set(frame.withColumn("t", fn.lit(1.5)), ["user_transactions"], repo, timestamp_column="t")
    with pytest.raises(ConfigError, match=rf"entity_rows.t: {len(rows)} values are not timestamps; pass datetimes"):
        training_set(frame.withColumn("t", fn.lit("yesterday")), ["user_transactions"], repo, timestamp_column="t")
    with pytest.raises(ConfigError, match=r"entity_rows.user_id: type double, .* by string; cast the column"):
        training_set(frame.withColumn("user_id", fn.lit(1.0)), ["user_transactions"], repo, timestamp_column="t")
    with pytest.raises(ConfigError, match=r"group 'never_backfilled' has no offline rows .*`features backfill --repo"):
        training_set(frame, ["never_backfilled"], repo, timestamp_column="t")
    early = frame.withColumn("t", fn.lit(START - pd.Timedelta(days=3)).cast("timestamp"))
    with pytest.warns(UserWarning, match=rf"{len(rows)} entity rows lie outside the days of group 'user_trans"):
        training_set(early, ["user_transactions:failed_count_24h"], repo, timestamp_column="t")


def test_spark_join_on_spark_connect(spark_connect, repo: Repo, events: pd.DataFrame):
    """Rows of a Spark Connect session are joined in that session (no SparkContext, RDD or JVM there)."""
    rows = random_rows(events, 40, 8)
    want = training_set(rows, GROUPS, repo, timestamp_column="t", full_feature_names=True, log_lineage=False)
    result = training_set(
        spark_frame(spark_connect, rows),
        GROUPS,
        repo,
        timestamp_column="t",
        full_feature_names=True,
        log_lineage=False,
    )
    assert type(result).__module__.startswith("pyspark.sql.connect")
    got = result.toPandas()
    assert_rows_kept(got, rows)
    assert_same_values(got, want, ALL_FEATURES)


# ---------------------------------------------------------------------------------------------------------
# Lineage


def test_lineage_is_logged_on_the_active_run_and_found_later(repo: Repo, events: pd.DataFrame, no_fluent_run):
    rows = entity_rows(events, n=10, seed=6)
    refs = ["user_transactions:failed_count_24h", "card_merchant:txn_count_1h"]
    tracking.use(repo)
    with mlflow.start_run(run_name="train") as run:
        training_set(rows, refs, repo, timestamp_column="t")
        later = rows.assign(t=rows["t"] + pd.Timedelta(hours=1))
        training_set(later, ["user_transactions:amount_sum_1h"], repo, timestamp_column="t")
    client = mlflow.MlflowClient()
    stored = client.get_run(run.info.run_id)
    tags = stored.data.tags
    assert tags["features.training.features"] == ",".join([*refs, "user_transactions:amount_sum_1h"])
    assert tags["features.definition_hash.user_transactions"] == definition_hash(USER)
    assert tags["features.definition_hash.card_merchant"] == definition_hash(CARD_MERCHANT)
    assert tags["features.feature.user_transactions.failed_count_24h"] == feature_hashes(USER)["failed_count_24h"]
    assert tags["features.training.start"] == rows["t"].min().isoformat()
    assert tags["features.training.end"] == later["t"].max().isoformat()
    assert tags["features.training.rows"] == str(2 * len(rows))
    first = json.loads(Path(client.download_artifacts(run.info.run_id, "features/training_set.json")).read_text())
    assert first["features"] == refs
    assert first["entity_rows"]["end"] == rows["t"].max().isoformat()
    assert first["definitions"]["card_merchant"]["entity"]["join_keys"] == ["card_id", "merchant_id"]
    assert first["offline_dates"]["user_transactions"] == ["2026-01-01", "2026-01-03"]
    second = json.loads(Path(client.download_artifacts(run.info.run_id, "features/training_set_2.json")).read_text())
    assert second["features"] == ["user_transactions:amount_sum_1h"]
    found = tracking.find_runs(repo, feature="card_merchant:txn_count_1h")
    assert run.info.run_id in set(found["run_id"])
    found = tracking.find_runs(repo, group="user_transactions", definition_hash=definition_hash(USER))
    assert run.info.run_id in set(found["run_id"])


def test_a_training_set_reads_the_tables_as_of_a_version_or_a_time(
    spark, feast_repo, events: pd.DataFrame, no_fluent_run
):
    """Each backfill is a commit of the offline table: a training set as of the first one sees the values before
    the late events the second added, and the versions logged with a set rebuild it exactly."""
    from features.demo import write_events

    first_events = events[events["event_ts"] < START + pd.Timedelta("1d")]
    root = feast_repo([CARD_MERCHANT, USER], first_events)
    loaded = Repo.load(root)
    day = (START.to_pydatetime(), (START + pd.Timedelta("1d")).to_pydatetime())
    backfill(loaded, *day, [CARD_MERCHANT.name], spark=spark, progress=False, track=False)
    between = datetime.now(UTC)
    late = first_events.sample(n=40, random_state=5).assign(
        event_ts=lambda f: f["event_ts"] + pd.Timedelta(minutes=7), txn_id=lambda f: f["txn_id"] + "-late"
    )
    write_events(late, root / "data" / "transactions", start_index=100)
    backfill(loaded, *day, [CARD_MERCHANT.name], spark=spark, progress=False, track=False)
    both = pd.concat([first_events, late], ignore_index=True)
    rows = entity_rows(first_events, n=20, seed=8)
    rows = rows[rows["t"] < START + pd.Timedelta("1d")].reset_index(drop=True)
    refs = ["card_merchant:txn_count_1h", "card_merchant:amount_sum_24h"]
    lookups = [((r.card_id, r.merchant_id), r.t) for r in rows.itertuples()]

    def assert_values(frame: pd.DataFrame, source: pd.DataFrame) -> None:
        want = reference_frame(source, CARD_MERCHANT, lookups)
        for column in ("txn_count_1h", "amount_sum_24h"):
            bad = [i for i, (g, w) in enumerate(zip(frame[column], want[column], strict=True)) if not same(g, w)]
            assert not bad, f"{column}: rows {bad[:5]} differ from the reference"

    tracking.use(loaded)
    with mlflow.start_run() as run:
        newest = training_set(rows, refs, loaded, timestamp_column="t")
    assert_values(newest, both)
    client = mlflow.MlflowClient()
    logged = json.loads(Path(client.download_artifacts(run.info.run_id, tracking.TRAINING_ARTIFACT)).read_text())
    assert logged["table_versions"] == {"card_merchant": 1}
    assert client.get_run(run.info.run_id).data.tags["features.table_version.card_merchant"] == "1"
    assert not reference_frame(first_events, CARD_MERCHANT, lookups)["txn_count_1h"].equals(newest["txn_count_1h"])

    before = training_set(rows, refs, loaded, timestamp_column="t", as_of_version=0, log_lineage=False)
    assert_values(before, first_events)
    pd.testing.assert_frame_equal(before[rows.columns], rows)  # the caller's rows kept, as the Feast path keeps them
    at_time = training_set(rows, refs, loaded, timestamp_column="t", as_of=between, log_lineage=False)
    pd.testing.assert_frame_equal(at_time, before)
    again = training_set(
        spark_frame(spark, rows), refs, loaded, timestamp_column="t", as_of_version=logged["table_versions"]
    )
    pd.testing.assert_frame_equal(
        again.toPandas()[["txn_count_1h", "amount_sum_24h"]],
        newest[["txn_count_1h", "amount_sum_24h"]],
        check_dtype=False,
    )

    with pytest.raises(ConfigError, match=r"as_of_version=0 is one table's version, and the features come from"):
        two = ["card_merchant:txn_count_1h", "user_transactions:amount_sum_1h"]
        training_set(rows, two, loaded, timestamp_column="t", as_of_version=0)
    with pytest.raises(ConfigError, match=r"version 7 of the offline table .* cannot be read .* Fix: ask for"):
        training_set(rows, refs, loaded, timestamp_column="t", as_of_version=7)
    with pytest.raises(ConfigError, match=r"as_of_version names groups no requested feature is from: \['users'\]"):
        training_set(rows, refs, loaded, timestamp_column="t", as_of_version={"card_merchant": 0, "users": 1})
    with pytest.raises(ConfigError, match=r"pass as_of_version or as_of, not both"):
        training_set(rows, refs, loaded, timestamp_column="t", as_of_version=0, as_of=between)
    with pytest.raises(ConfigError, match=r"group 'card_merchant' had no offline table at 2020-01-01"):
        training_set(rows, refs, loaded, timestamp_column="t", as_of=datetime(2020, 1, 1))


def test_no_active_run_logs_nothing(repo: Repo, events: pd.DataFrame, no_fluent_run):
    tracking.use(repo)
    before = len(tracking.find_runs(repo))
    frame = training_set(entity_rows(events, n=3), ["user_transactions:failed_count_24h"], repo, timestamp_column="t")
    assert len(tracking.find_runs(repo)) == before
    assert frame.attrs["features.lineage"]["features"] == ["user_transactions:failed_count_24h"]


def test_a_pandas_training_set_carries_its_lineage_pinned_or_not(spark, repo: Repo, events: pd.DataFrame):
    """Read at a pinned version (joined in Spark), or from Spark rows asked for as pandas, a pandas training set
    holds the lineage the Feast path's holds, with the versions read."""
    rows = random_rows(events, 10, 9)
    refs = ["user_transactions:failed_count_24h", "card_merchant:txn_count_1h"]
    lineage = training_set(rows, refs, repo, timestamp_column="t", log_lineage=False).attrs["features.lineage"]
    assert set(lineage["table_versions"]) == {"user_transactions", "card_merchant"}
    versions = lineage["table_versions"]
    pinned = training_set(rows, refs, repo, timestamp_column="t", as_of_version=versions, log_lineage=False)
    assert pinned.attrs["features.lineage"] == lineage
    at_time = training_set(rows, refs, repo, timestamp_column="t", as_of=datetime.now(UTC), log_lineage=False)
    assert at_time.attrs["features.lineage"] == lineage
    collected = training_set(spark_frame(spark, rows), refs, repo, timestamp_column="t", spark=False, log_lineage=False)
    assert collected.attrs["features.lineage"] == lineage


# ---------------------------------------------------------------------------------------------------------
# Mistakes


def test_mistakes_name_the_field_and_the_fix(repo: Repo, events: pd.DataFrame):
    rows = entity_rows(events, n=3)
    with pytest.raises(ConfigError, match=r"entity_rows: no column 'card_id', 'merchant_id', .* of card_merchant"):
        training_set(rows.drop(columns=["card_id", "merchant_id"]), ["card_merchant"], repo, timestamp_column="t")
    with pytest.raises(ConfigError, match=r"timestamp_column: entity_rows have no column 'event_timestamp'; pass"):
        training_set(rows, ["user_transactions"], repo)
    with pytest.raises(ConfigError, match=r"features: 'users:x' names no feature group .* card_merchant, "):
        training_set(rows, ["users:x"], repo, timestamp_column="t")
    with pytest.raises(ConfigError, match=r"features: user_transactions:nope is not a feature .* it has failed_count"):
        training_set(rows, ["user_transactions:nope"], repo, timestamp_column="t")
    with pytest.raises(ConfigError, match=r"features: no features requested"):
        training_set(rows, [], repo, timestamp_column="t")
    with pytest.raises(ConfigError, match=r"user_transactions:last_status and card_merchant:last_status would both be"):
        training_set(rows, ["user_transactions", "card_merchant"], repo, timestamp_column="t")
    with pytest.raises(ConfigError, match=r"'last_status' would be overwritten .* full_feature_names=True"):
        training_set(rows.assign(last_status="x"), ["card_merchant"], repo, timestamp_column="t")
    untimed = rows.copy()
    untimed.loc[1, "t"] = pd.NaT
    with pytest.raises(ConfigError, match=r"entity_rows.t: 1 rows have no timestamp; drop or fill them"):
        training_set(untimed, ["user_transactions"], repo, timestamp_column="t")
    with pytest.raises(ConfigError, match=r"a column 'event_timestamp' besides the timestamp column 't'"):
        training_set(rows.assign(event_timestamp=rows["t"]), ["user_transactions"], repo, timestamp_column="t")
    with pytest.raises(ConfigError, match=r"group 'never_backfilled' has no offline rows .*`features backfill --repo"):
        training_set(rows, ["never_backfilled"], repo, timestamp_column="t")


def test_rows_outside_the_backfilled_days_warn(repo: Repo, events: pd.DataFrame):
    rows = entity_rows(events, n=2)
    rows.loc[0, "t"] = START - pd.Timedelta(days=3)
    with pytest.warns(UserWarning, match=r"1 entity rows lie outside the days of group 'user_transactions'"):
        training_set(rows, ["user_transactions:failed_count_24h"], repo, timestamp_column="t")


def test_rows_on_days_computed_before_a_feature_changed_warn(repo: Repo, events: pd.DataFrame):
    """The manifest keeps each day's hash per feature (written by the schedule's backfills): a day computed with an
    earlier definition of a feature, or before it was added, has no history of it."""
    from features.spec.fingerprint import feature_hashes
    from features.stores.manifest import manifest_path, update

    group = next(g for g in GROUPS if g.name == "user_transactions")
    table = repo.offline_path(group)
    rows = entity_rows(events, n=4)
    rows.loc[0, "t"] = START + pd.Timedelta(hours=1)
    try:
        with update(table, group.name) as manifest:
            earlier = {**feature_hashes(group), "failed_count_24h": "an earlier definition"}
            manifest.record(START.date(), "earlier", earlier, 10)
        with pytest.warns(
            UserWarning, match=r"user_transactions:failed_count_24h has no history on 1 day.s. from 20.*--only-changed"
        ):
            training_set(rows, ["user_transactions:failed_count_24h"], repo, timestamp_column="t")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            training_set(rows, ["user_transactions:amount_sum_1h"], repo, timestamp_column="t")
        assert not [w for w in caught if "no history" in str(w.message)]
    finally:
        manifest_path(table).unlink()


# ---------------------------------------------------------------------------------------------------------
# The demo model learns from the windowed features

# Three days of 20,000 transactions: about nine fraud bursts, two or three of them in the held-out last day.
DEMO = {"events": 20_000, "users": 200, "days": 3}


@pytest.mark.slow
def test_the_demo_classifier_beats_the_amount_alone_on_a_later_range(spark, tmp_path: Path):
    from features.demo import train as demo

    example = Path(__file__).resolve().parents[1] / "feature_repo"
    root = tmp_path / "feature_repo"
    shutil.copytree(example, root, ignore=shutil.ignore_patterns("data", "__pycache__", ".ipynb_checkpoints"))
    repo = Repo.load(root)
    transactions, _ = demo.prepare(repo, **DEMO, start=datetime(2026, 1, 1, tzinfo=UTC), seed=demo.SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        rows = demo.labelled_rows(transactions)
        frame = training_set(rows, demo.FEATURES, repo, request_features=demo.REQUEST_FEATURES, log_lineage=False)
    result = demo.compare(frame)
    assert set(demo.REQUEST_FEATURES) <= set(result.columns)
    assert result.test_fraud >= 10 and result.train_fraud >= 20, result.metrics()
    assert result.train_rows > 3 * result.test_rows / 2  # trained on the earlier two thirds, minus the warm-up
    assert frame.loc[frame["event_timestamp"] >= result.cutoff, "event_timestamp"].min() >= result.cutoff
    assert result.auc_with >= 0.85, result.metrics()
    assert result.auc_with - result.auc_without >= 0.15, result.metrics()
