"""The package on a Spark Connect session (Databricks serverless and shared clusters; `SPARK_REMOTE`).

A real Spark Connect server runs in a JVM of its own (tests/connect_server.py) beside the classic test session.
On it: the preview (pandas and Spark in), a backfill of a mixed group to both stores, validation of feature
rows, a training set with request-time features, and `features backfill` with `SPARK_REMOTE` set, each compared
with the classic session's result or the brute-force reference; the stream stops with the one error that names
what Spark Connect lacks for it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pandas as pd
import pytest
from reference import reference_frame

import features
from features import Entity, EventSource, Feature, FeatureGroup, Hop, Lifetime, RequestFeature, Tumble, agg
from features.spec import WINDOW_END
from features.stores import offline

pytestmark = pytest.mark.spark

START = pd.Timestamp("2026-01-01", tz="UTC")
END = pd.Timestamp("2026-01-02 04:00", tz="UTC")
SOURCE = EventSource("transactions", path="data/transactions", timestamp="event_ts")
GROUP = FeatureGroup(
    name="user_mixed",
    entity=Entity("user", join_keys=["user_id"]),
    source=SOURCE,
    features=[
        Feature("failed_2h", agg.count(), window=Hop("2h", every="10m"), where="status = 'FAILED'"),
        Feature("amount_sum_1h", agg.sum("amount"), window=Hop("1h", every="10m")),
        Feature("amount_max_6h", agg.max("amount"), window=Hop("6h", every="1h")),
        Feature("merchants_6h", agg.approx_count_distinct("merchant_id"), window=Hop("6h", every="1h")),
        Feature("merchants_exact_6h", agg.count_distinct("merchant_id"), window=Hop("6h", every="1h")),
        Feature("last_amounts_1h", agg.last_k("amount", 2), window=Tumble("1h")),
        Feature("count_lifetime", agg.count(), window=Lifetime(every="1h")),
    ],
)
EXACT = [f.name for f in GROUP.features if f.name != "last_amounts_1h"]  # lists compare apart
REQUEST_FEATURES = [
    RequestFeature(
        "amount_vs_max_6h",
        lambda amount, amount_max_6h: amount / amount_max_6h,
        request={"amount": "double"},
        features=["user_mixed:amount_max_6h"],
        dtype="double",
    ),
    RequestFeature(  # a row function
        "over_max_6h",
        lambda amount, amount_max_6h: amount_max_6h is not None and amount > amount_max_6h,
        request={"amount": "double"},
        features=["user_mixed:amount_max_6h"],
        dtype="bool",
        row=True,
    ),
]


@pytest.fixture(autouse=True)
def connect_process(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """Each test runs as a process on a Connect cluster does: PySpark's functions (`F.col`, ...) build Connect
    columns when `SPARK_CONNECT_MODE_ENABLED` is set, which `builder.remote()` sets there. Classic results are
    module fixtures, computed before it is set."""
    for name in request.fixturenames:
        if name not in ("connect_process", "request", "monkeypatch"):
            request.getfixturevalue(name)  # every fixture first (the classic ones among them), then Connect mode
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")


@pytest.fixture(scope="module")
def events() -> pd.DataFrame:
    from features.demo import generate_transactions

    return generate_transactions(800, 6, START.to_pydatetime(), 1, seed=11)


@pytest.fixture(scope="module")
def classic_points(spark, events: pd.DataFrame) -> pd.DataFrame:
    """The preview on the classic session: what every Connect result is compared with."""
    return features.preview(GROUP, events, START, END, spark=spark)


def _offline(root: Path) -> pd.DataFrame:
    table = offline.read_pandas(str(root / "data" / "offline" / GROUP.name))
    return _normalized(table)


def _normalized(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame.copy()
    out[WINDOW_END] = pd.to_datetime(out[WINDOW_END], utc=True).astype("datetime64[us, UTC]")
    out["last_amounts_1h"] = out["last_amounts_1h"].map(lambda v: None if v is None else list(v))
    columns = [*GROUP.join_keys, WINDOW_END, *EXACT, "last_amounts_1h"]
    return out.sort_values(["user_id", WINDOW_END]).reset_index(drop=True)[columns]


def _values(column: pd.Series) -> list[float]:
    """Numbers, null as NaN (compared with nan_ok): float sums within 1e-9 of the reference's."""
    return [float("nan") if pd.isna(v) else float(v) for v in column]


def _lists(column: pd.Series) -> list[list[float] | None]:
    return [None if v is None or v is pd.NA else [float(x) for x in v] for v in column]


def _assert_reference_values(rows: pd.DataFrame, events: pd.DataFrame) -> None:
    """Every 7th change point (keys, window end, features) holds the reference values at its window end. Results
    compared with the classic session's are checked so too: both can be wrong alike."""
    sample = _normalized(rows).iloc[::7]
    assert len(sample) > 10
    lookups = [((k,), t) for k, t in zip(sample["user_id"], sample[WINDOW_END], strict=True)]
    want = reference_frame(events, GROUP, lookups)
    for name in EXACT:
        assert _values(sample[name]) == pytest.approx(_values(want[name]), rel=1e-9, nan_ok=True), name
    assert _lists(sample["last_amounts_1h"]) == _lists(want["last_amounts_1h"])


def test_preview_on_connect_equals_classic_and_reference(
    spark_connect,
    classic_points: pd.DataFrame,
    events: pd.DataFrame,
) -> None:
    got = features.preview(GROUP, events, START, END, spark=spark_connect)
    assert isinstance(got, pd.DataFrame) and len(got) > 100
    pd.testing.assert_frame_equal(_normalized(got), _normalized(classic_points))
    assert got[WINDOW_END].min() >= START and got[WINDOW_END].max() < END
    _assert_reference_values(got, events)
    # A Spark DataFrame in gives a DataFrame of the same session out.
    frame = features.preview(GROUP, spark_connect.createDataFrame(events), START.isoformat(), END.to_pydatetime())
    assert type(frame).__module__.startswith("pyspark.sql.connect")
    assert frame.count() == len(got)


def test_backfill_on_connect_writes_both_stores(
    spark_connect,
    feast_repo,
    events: pd.DataFrame,
    classic_points: pd.DataFrame,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from features.pipelines.backfill import backfill

    root = feast_repo([GROUP], events)
    [result] = backfill(features.load_repo(root), START, END, spark=spark_connect, progress=True, track=False)
    assert result.rows_in == len(events) and result.validation is not None and result.validation.success
    # The progress bar counted the tasks that Connect's progress handler reported (done/total, total > 0).
    assert re.search(rf"backfill {GROUP.name}:.*\b\d+/[1-9]\d*\b", capsys.readouterr().err)
    offline = _offline(root)
    pd.testing.assert_frame_equal(offline, _normalized(classic_points))
    _assert_reference_values(offline, events)
    # Two features computed again beside the table's values of the others (a cogroup of events and table rows on
    # the Connect session): the same table.
    [again] = backfill(
        features.load_repo(root), START, END, spark=spark_connect, track=False, features=["amount_max_6h", "failed_2h"]
    )
    assert again.only == ("failed_2h", "amount_max_6h")
    pd.testing.assert_frame_equal(_offline(root), offline)
    keys = sorted(events["user_id"].unique())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        online = features.online_features(root, GROUP.name, keys)
    want = reference_frame(events, GROUP, [((k,), END) for k in keys])
    for name in EXACT:
        assert _values(online[name]) == pytest.approx(_values(want[name]), rel=1e-9, nan_ok=True), name
    # A training set from Spark rows on the Connect session: a DataFrame of that session, Feast's values.
    # With request-time features (an Arrow UDF on the Connect session): the pandas rows' values.
    rows = events[["user_id", "event_ts", "amount", "is_fraud"]].iloc[::40]
    rows = rows.rename(columns={"event_ts": "event_timestamp"})
    asked = {"request_features": REQUEST_FEATURES}
    expected = features.training_set(rows, [GROUP.name], root, **asked)
    frame = features.training_set(spark_connect.createDataFrame(rows), [GROUP.name], root, **asked)
    assert type(frame).__module__.startswith("pyspark.sql.connect")
    got = frame.toPandas()
    for name in [*EXACT, "amount_vs_max_6h"]:
        assert _values(got[name]) == pytest.approx(_values(expected[name]), rel=1e-9, nan_ok=True), name
    assert got["over_max_6h"].tolist() == expected["over_max_6h"].tolist()
    assert got["over_max_6h"].notna().all() and expected["amount_vs_max_6h"].notna().sum() > 10
    # Each training row holds the values as of its time (a sample: the reference is slow).
    got = got.sort_values(["user_id", "event_timestamp"]).reset_index(drop=True).iloc[::3]
    lookups = [((k,), pd.Timestamp(t)) for k, t in zip(got["user_id"], got["event_timestamp"], strict=True)]
    want = reference_frame(events, GROUP, lookups)
    for name in EXACT:
        assert _values(got[name]) == pytest.approx(_values(want[name]), rel=1e-9, nan_ok=True), name


def test_cli_backfill_with_spark_remote(connect_url: str, feast_repo, events, classic_points) -> None:
    root = feast_repo([GROUP], events)
    env = dict(os.environ, SPARK_REMOTE=connect_url)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "features.cli",
            "backfill",
            "--repo",
            str(root),
            "--start",
            START.isoformat(),
            "--end",
            END.isoformat(),
            "--no-tracking",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "change points out" in done.stdout
    offline = _offline(root)
    pd.testing.assert_frame_equal(offline, _normalized(classic_points))
    _assert_reference_values(offline, events)


def test_validation_runs_great_expectations_on_connect(spark_connect, events: pd.DataFrame) -> None:
    """A user expectation always runs in Great Expectations: here on the Connect DataFrame, and it fails."""
    import great_expectations as gx

    from features import quality

    limit = gx.expectations.ExpectColumnValuesToBeBetween(column="amount_sum_1h", max_value=100, description="small")
    strict = FeatureGroup(GROUP.name, GROUP.entity, SOURCE, GROUP.features, expectations=[limit])
    rows = features.preview(strict, spark_connect.createDataFrame(events), START, END)
    report = quality.validate_batch(strict, rows, range_start=START.to_pydatetime())
    assert not report.success
    # It failed for its values, on the Connect rows: no error, one unexpected value per row above 100.
    [failed] = report.failures
    assert failed.name == "small" and failed.user and failed.error is None, report.summary()
    assert failed.unexpected == rows.where("amount_sum_1h > 100").count() > 0, report.summary()
    assert len(report.outcomes) > 1  # the derived expectations ran too, and passed


def test_great_expectations_checks_rows_on_their_own_session(
    spark,
    spark_connect,
    events: pd.DataFrame,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a Connect and a classic session in one process, Great Expectations' SQL checks (a temp view, then
    spark.sql) run on the session of the rows they check, whichever ran first."""
    from features import quality

    on_connect = features.preview(GROUP, spark_connect.createDataFrame(events), START, END)
    assert quality.validate_batch(GROUP, on_connect, range_start=START.to_pydatetime(), mode="full").success
    monkeypatch.delenv("SPARK_CONNECT_MODE_ENABLED")
    # Other columns than the Connect session's temp view has: a check run there could not resolve them.
    spending = [
        Feature("amount_avg_1h", agg.avg("amount"), window=Hop("1h", every="10m")),
        Feature("amount_max_1h", agg.max("amount"), window=Hop("1h", every="10m")),
    ]
    other = FeatureGroup("spending", GROUP.entity, SOURCE, spending)
    classic = features.preview(other, spark.createDataFrame(events), START, END, spark=spark)
    report = quality.validate_batch(other, classic, range_start=START.to_pydatetime(), mode="full")
    assert report.success, report.summary()


def test_stream_on_connect_stops_with_the_limitation(spark_connect, feast_repo, events) -> None:
    from features.errors import EnvironmentProblem
    from features.pipelines.stream import stream

    root = feast_repo([GROUP], events, apply=False)
    with pytest.raises(EnvironmentProblem, match=r"cannot run on a Spark Connect session.*foreachBatch"):
        stream(features.load_repo(root), spark=spark_connect, online=False, progress=False, tracking=False)
    assert not (root / "data" / "checkpoints").exists()


def test_notebook_01_runs_on_connect(connect_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Notebook 01 top to bottom in a kernel whose session is Spark Connect's (`SPARK_REMOTE`, as a job or a
    Databricks notebook gets it)."""
    import shutil

    import nbformat
    from kernels import ipc_config
    from nbclient import NotebookClient

    checkout = Path(__file__).resolve().parents[1]
    ignored = shutil.ignore_patterns("data", ".features", "__pycache__", ".ipynb_checkpoints")
    shutil.copytree(checkout / "feature_repo", tmp_path / "feature_repo", ignore=ignored)
    (tmp_path / "notebooks").mkdir()
    notebook = nbformat.read(checkout / "notebooks" / "01_define_and_explore.ipynb", as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell("print('session:', type(spark).__module__)"))
    monkeypatch.setenv("SPARK_REMOTE", connect_url)  # the kernel inherits this process's environment
    folder = str(tmp_path / "notebooks")
    client = NotebookClient(
        notebook,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": folder}},
        config=ipc_config(tmp_path),
    )
    client.execute()
    printed = "".join(o.get("text", "") for cell in notebook.cells for o in cell.get("outputs", []))
    assert "session: pyspark.sql.connect.session" in printed
    assert "same as the repository's definition: True" in printed and "change points for" in printed
