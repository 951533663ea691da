"""Request-time features give one value everywhere (issue 67 items 3-5): a training set from pandas rows and from
Spark rows, the logged model's inputs at `predict` and the feature server's answer, on the same rows, each equal to
a brute-force reference (the stored values of tests/reference.py at the row's time, the functions' definitions
applied row by row in plain Python). A function that fails is named with its first failing row on every path; a
request field of the wrong type is the caller's mistake, named with its fix.
"""

from __future__ import annotations

import json
import math
import os
import uuid
import warnings
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from reference import reference_frame

from features import ConfigError, Entity, EventSource, Feature, FeatureGroup, Hop, Lifetime, agg
from features.errors import DataError, RequestFieldError
from features.ml.training import training_set
from features.pipelines.backfill import backfill
from features.repo import Repo

pytestmark = pytest.mark.spark

START = pd.Timestamp("2026-01-01", tz="UTC")
END = pd.Timestamp("2026-01-01 20:00", tz="UTC")
GROUP = FeatureGroup(
    name="user_req",
    entity=Entity("user", join_keys=["user_id"]),
    source=EventSource("transactions", path="data/transactions", timestamp="event_ts"),
    features=[
        Feature("count_1h", agg.count(), window=Hop("1h", every="5m")),
        Feature("amount_max_1h", agg.max("amount"), window=Hop("1h", every="5m")),
        Feature("last_seen", agg.last_event_time(), window=Lifetime(every="5m")),
        Feature("merchants_1h", agg.distinct_values("merchant_id"), window=Hop("1h", every="5m")),
    ],
)
# The repo's request-time features, in a module of the repo (as a user writes them): the training set, the model
# and the server all take them from there.
DEFINITIONS = """
import math

import pandas as pd

from features import RequestFeature

ratio = RequestFeature(
    "amount_vs_max_1h",
    lambda amount, amount_max_1h: amount / amount_max_1h.where(amount_max_1h != 0),
    request={"amount": "double"},
    features=["user_req:amount_max_1h"],
    dtype="double",
)


def since(request_time, last_seen):
    return (request_time - last_seen).dt.total_seconds()


seconds_since_last = RequestFeature(
    "seconds_since_last", since, features={"last_seen": "user_req:last_seen"}, dtype="double"
)


def root_of(amount):
    return math.sqrt(amount)  # fails on a negative amount: the definitions' owner's bug, not the client's


fragile = RequestFeature("fragile", root_of, request={"amount": "double"}, dtype="double", row=True)

new_merchant = RequestFeature(
    "new_merchant",
    lambda merchant_id, merchants: merchant_id not in (merchants or []),
    request={"merchant_id": "string"},
    features={"merchants": "user_req:merchants_1h"},
    dtype="bool",
    row=True,
)
"""
NAMES = ["amount_vs_max_1h", "seconds_since_last", "new_merchant"]


@pytest.fixture(scope="module")
def events() -> pd.DataFrame:
    from features.demo import generate_transactions

    return generate_transactions(1_200, 15, START, 1, seed=67)


@pytest.fixture(scope="module")
def repo(spark, tmp_path_factory: pytest.TempPathFactory, feast_repo_factory, events: pd.DataFrame) -> Repo:
    root = feast_repo_factory(tmp_path_factory.mktemp("request") / "repo", [GROUP], events)
    (root / f"request_defs_{uuid.uuid4().hex[:12]}.py").write_text(DEFINITIONS)
    loaded = Repo.load(root)
    assert sorted(loaded.request_features) == sorted([*NAMES, "fragile"])
    backfill(loaded, START, END, spark=spark, progress=False, track=False)
    return loaded


@pytest.fixture(scope="module")
def labels(events: pd.DataFrame) -> pd.DataFrame:
    """Label rows at events' times (before END) and a few of a user never seen, one without an amount."""
    picked = events[events["event_ts"] < END].sample(60, random_state=3)
    rows = picked[["user_id", "event_ts", "amount", "merchant_id"]].reset_index(drop=True)
    nobody = pd.DataFrame(
        {
            "user_id": ["nobody", "nobody"],
            "event_ts": pd.Series([START + pd.Timedelta("3h"), END - pd.Timedelta("1s")], dtype=rows["event_ts"].dtype),
            "amount": [12.5, 3.0],
            "merchant_id": ["m1", "m2"],
        }
    )
    rows = pd.concat([rows, nobody], ignore_index=True)
    rows.loc[5, "amount"] = np.nan  # a field missing from the request
    return rows


def brute_force(
    events: pd.DataFrame, rows: pd.DataFrame, times: pd.Series, stored_at: pd.Timestamp | None = None
) -> pd.DataFrame:
    """Each row's request-time features from the reference's stored values at its time (or all at `stored_at`:
    the online values), row by row."""
    at = times if stored_at is None else [stored_at] * len(rows)
    stored = reference_frame(events, GROUP, [((u,), t) for u, t in zip(rows["user_id"], at, strict=True)])
    out = []
    for i, row in enumerate(rows.to_dict("records")):
        biggest, last = stored["amount_max_1h"].iloc[i], stored["last_seen"].iloc[i]
        amount = None if pd.isna(row["amount"]) else row["amount"]
        merchants = stored["merchants_1h"].iloc[i]
        out.append(
            {
                "amount_vs_max_1h": None if amount is None or biggest is None or biggest == 0 else amount / biggest,
                "seconds_since_last": None if last is None else (pd.Timestamp(times.iloc[i]) - last).total_seconds(),
                "new_merchant": row["merchant_id"] not in merchants,
            }
        )
    return pd.DataFrame(out)


def assert_same(got: pd.DataFrame, want: pd.DataFrame) -> None:
    for name in NAMES:
        for i, (a, b) in enumerate(zip(got[name].tolist(), want[name].tolist(), strict=True)):
            if b is None or (isinstance(b, float) and math.isnan(b)):
                assert a is None or a is pd.NA or (isinstance(a, float) and math.isnan(a)), (name, i, a)
            elif isinstance(b, float):
                assert a == pytest.approx(b, rel=1e-12), (name, i, a, b)
            else:
                assert a == b, (name, i, a, b)


# ---------------------------------------------------------------------------------------------------------
# Training sets


def test_a_pandas_training_set_equals_the_reference(repo: Repo, events, labels) -> None:
    frame = training_set(
        labels, ["user_req:count_1h"], repo, timestamp_column="event_ts", request_features=NAMES, log_lineage=False
    )
    # The stored inputs not asked for are looked up, used and left out.
    assert list(frame.columns) == [*labels.columns, "count_1h", *NAMES]
    assert str(frame["amount_vs_max_1h"].dtype) == "float64" and str(frame["new_merchant"].dtype) == "boolean"
    assert_same(frame, brute_force(events, labels, labels["event_ts"]))
    assert frame["new_merchant"].iloc[-2:].tolist() == [True, True]  # nobody: no merchant seen
    assert frame["seconds_since_last"].iloc[-2:].isna().all()


def test_a_spark_training_set_equals_the_reference_computed_in_spark(spark, repo: Repo, events, labels) -> None:
    rows = spark.createDataFrame(labels)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        frame = training_set(
            rows, ["user_req:count_1h"], repo, timestamp_column="event_ts", request_features=NAMES, log_lineage=False
        )
    assert not [w for w in caught if "UDF" in str(w.message)]  # PySpark's about how its UDF was declared
    assert dict(frame.dtypes)["new_merchant"] == "boolean" and dict(frame.dtypes)["amount_vs_max_1h"] == "double"
    plan = frame._jdf.queryExecution().executedPlan().toString().lower()
    assert plan.count("arrowevalpython") == 1 and "mapinpandas" not in plan  # in the workers, once per row
    got = frame.toPandas()
    assert list(got.columns) == [*labels.columns, "count_1h", *NAMES]
    assert_same(got, brute_force(events, labels, labels["event_ts"]))


def test_a_pinned_version_and_a_spark_result_give_the_same_values(spark, repo: Repo, events, labels) -> None:
    from features.stores.offline import current_version

    asked = {"timestamp_column": "event_ts", "request_features": NAMES, "log_lineage": False}
    version = current_version(repo.offline_path(GROUP))
    want = brute_force(events, labels, labels["event_ts"])
    pinned = training_set(labels, ["user_req:count_1h"], repo, as_of_version=version, **asked)  # joined in Spark
    assert list(pinned.columns) == [*labels.columns, "count_1h", *NAMES]
    assert_same(pinned, want)
    as_spark = training_set(labels, ["user_req:count_1h"], repo, spark=spark, **asked)
    assert dict(as_spark.dtypes)["new_merchant"] == "boolean"
    assert_same(as_spark.toPandas(), want)


def test_the_request_time_is_a_named_column_if_given(repo: Repo, events, labels) -> None:
    rows = labels.assign(asked_at=labels["event_ts"] + pd.Timedelta("90s"))
    frame = training_set(
        rows,
        ["user_req:count_1h"],
        repo,
        timestamp_column="event_ts",
        request_features=["seconds_since_last"],
        request_time_column="asked_at",
        log_lineage=False,
    )
    want = brute_force(events, labels, labels["event_ts"])
    got = frame["seconds_since_last"].to_numpy(dtype=float)
    np.testing.assert_allclose(got, want["seconds_since_last"].to_numpy(dtype=float) + 90, equal_nan=True)


def test_training_set_mistakes_name_the_field_and_the_fix(repo: Repo, labels) -> None:
    asked = {"timestamp_column": "event_ts", "log_lineage": False}
    with pytest.raises(ConfigError, match=r"request_features: 'nope' is no request-time feature .*Fix: name one"):
        training_set(labels, ["user_req:count_1h"], repo, request_features=["nope"], **asked)
    with pytest.raises(ConfigError, match=r"entity_rows: no column 'amount', the request field .*Fix: add it"):
        training_set(labels.drop(columns="amount"), ["user_req"], repo, request_features=NAMES, **asked)
    with pytest.raises(ConfigError, match=r"request_time_column: the rows have no column 'when'. Fix"):
        training_set(labels, ["user_req"], repo, request_features=NAMES, request_time_column="when", **asked)
    wrong = labels.assign(amount=labels["amount"].astype(str))
    with pytest.raises(RequestFieldError, match=r"^amount.0: '.*' is not a float64 .*Fix: send a number"):
        training_set(wrong, ["user_req:count_1h"], repo, request_features=NAMES, **asked)


def test_a_failing_function_is_named_with_its_first_failing_row_in_training_sets(spark, repo: Repo, labels) -> None:
    from features import RequestFeature

    def strict(amount, amount_max_1h):
        if amount_max_1h.isna().any():
            raise ValueError("no history")
        return amount / amount_max_1h

    failing = RequestFeature(
        "strict_ratio", strict, request={"amount": "double"}, features=["user_req:amount_max_1h"], dtype="double"
    )
    asked = {"timestamp_column": "event_ts", "log_lineage": False, "request_features": [failing]}
    plain = training_set(labels, ["user_req:amount_max_1h"], repo, timestamp_column="event_ts", log_lineage=False)
    first = int(np.flatnonzero(plain["amount_max_1h"].isna())[0])  # the first row without history
    with pytest.raises(DataError, match=rf"strict_ratio: the request-time feature failed at row {first} .*no history"):
        training_set(labels, ["user_req:count_1h"], repo, **asked)
    with pytest.raises(Exception, match=r"strict_ratio: the request-time feature failed at row \d+ .*no history"):
        training_set(spark.createDataFrame(labels), ["user_req:count_1h"], repo, **asked).collect()


def test_every_output_type_is_the_same_from_spark_rows_as_from_pandas_rows(spark, repo: Repo, labels) -> None:
    """Spark's workers hand the answer back as Arrow: each type a request-time feature may declare, nulls and empty
    lists included, comes out as the pandas rows give it."""
    from features import RequestFeature

    amount = {"amount": "double"}
    merchant = {"merchant_id": "string"}
    kinds = [
        RequestFeature("as_int", lambda amount: amount.round().astype("Int64"), request=amount, dtype="int64"),
        RequestFeature("as_text", lambda merchant_id: merchant_id.str.upper(), request=merchant, dtype="string"),
        RequestFeature("an_hour_on", lambda request_time: request_time + pd.Timedelta("1h"), dtype="timestamp"),
        RequestFeature(
            "ints",
            lambda amount: None if amount is None else [round(amount), 1],
            request=amount,
            dtype="int64_list",
            row=True,
        ),
        RequestFeature(
            "floats",
            lambda amount: [] if amount is None else [amount, amount / 2],
            request=amount,
            row=True,
            dtype="float64_list",
        ),
        RequestFeature(
            "texts",
            lambda merchant_id, merchants: sorted({*(merchants or []), merchant_id}),
            request=merchant,
            features={"merchants": "user_req:merchants_1h"},
            dtype="string_list",
            row=True,
        ),
    ]
    asked = {"timestamp_column": "event_ts", "request_features": kinds, "log_lineage": False}
    want = training_set(labels, ["user_req:count_1h"], repo, **asked)
    got = training_set(spark.createDataFrame(labels), ["user_req:count_1h"], repo, **asked).toPandas()
    assert list(got.columns) == list(want.columns)

    def plain(value):
        if value is None or value is pd.NA or value is pd.NaT or (isinstance(value, float) and math.isnan(value)):
            return None
        if isinstance(value, pd.Timestamp | datetime):
            stamp = pd.Timestamp(value)
            return stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")
        if isinstance(value, list | tuple | np.ndarray):
            return [plain(v) for v in value]
        return value.item() if isinstance(value, np.generic) else value

    for kind in kinds:
        mine, theirs = [plain(v) for v in got[kind.name]], [plain(v) for v in want[kind.name]]
        assert mine == theirs, kind.name
        assert any(v is not None for v in mine), kind.name
    assert None in [plain(v) for v in want["as_int"]] and [] in [plain(v) for v in want["floats"]]


# ---------------------------------------------------------------------------------------------------------
# The logged model: online values (as of END, the backfill's end) and its input rows

ASKED_AT = END + pd.Timedelta("7m")


@pytest.fixture(scope="module")
def classifier(repo: Repo, events, labels):
    from sklearn.ensemble import HistGradientBoostingClassifier

    rows = labels.assign(is_fraud=np.arange(len(labels)) % 2)
    frame = training_set(
        rows, ["user_req:count_1h"], repo, timestamp_column="event_ts", request_features=NAMES, log_lineage=False
    )
    columns = ["amount", "count_1h", *NAMES]
    fitted = frame[columns].astype("float64")
    return HistGradientBoostingClassifier(max_iter=5, random_state=0).fit(fitted, frame["is_fraud"])


def model_rows(labels: pd.DataFrame) -> pd.DataFrame:
    """The label rows as requests at ASKED_AT: keys and request fields, the request time given."""
    return labels.drop(columns="event_ts").assign(request_time=ASKED_AT)


def test_the_model_computes_them_from_its_input_rows_and_the_online_values(repo: Repo, classifier, events, labels):
    from features.ml.model import feature_model

    model = feature_model(classifier, ["user_req:count_1h"], repo, input_columns=["amount"], request_features=NAMES)
    rows = model_rows(labels)
    frame = model.feature_frame(rows)
    assert list(frame.columns) == ["amount", "count_1h", *NAMES]  # the inputs no one asked for are left out
    want = brute_force(events, labels, pd.Series([ASKED_AT] * len(labels)), stored_at=END)
    assert_same(frame, want)
    assert frame["seconds_since_last"].notna().sum() > 10
    with pytest.raises(ConfigError, match=r"model input: no column 'merchant_id'.*the request fields amount, merchant"):
        model.feature_frame(rows.drop(columns="merchant_id"))
    with pytest.raises(RequestFieldError, match=r"^merchant_id.0: 7 is not a string .*Fix: send a string"):
        model.feature_frame(rows.assign(merchant_id=7))


LOAD_AND_PREDICT = """
import json, sys
import mlflow.pyfunc, pandas as pd
model = mlflow.pyfunc.load_model(sys.argv[1])
rows = pd.read_json(sys.argv[2], orient="split")
rows["request_time"] = pd.to_datetime(rows["request_time"])
print(json.dumps([float(p) for p in model.predict(rows)]))
"""


def test_the_logged_model_loads_where_the_definitions_cannot_be_imported(
    repo: Repo, classifier, labels, tmp_path: Path
) -> None:
    """The functions travel in the model by value: loaded in another process, away from the repo's modules."""
    import subprocess
    import sys

    import mlflow

    from features.ml import tracking
    from features.ml.model import log_model

    rows = model_rows(labels)
    rows["request_time"] = rows["request_time"].dt.tz_localize(None)  # MLflow takes naive times: UTC
    previous = mlflow.get_tracking_uri() if mlflow.active_run() else None
    tracking.use(repo)
    try:
        with mlflow.start_run(run_name="request-time"):
            info = log_model(
                classifier,
                ["user_req:count_1h"],
                repo,
                input_example=rows,
                input_columns=["amount"],
                request_features=NAMES,
            )
        model_dir = Path(mlflow.artifacts.download_artifacts(info.model_uri, dst_path=str(tmp_path / "model")))
    finally:
        mlflow.set_tracking_uri(previous)
    loaded = mlflow.pyfunc.load_model(str(model_dir))
    assert "request_time" in loaded.metadata.get_input_schema().input_names()  # MLflow drops unsigned columns
    here = loaded.predict(rows).to_numpy()
    wrapped = loaded.unwrap_python_model()
    np.testing.assert_allclose(here, classifier.predict_proba(wrapped.feature_frame(rows))[:, 1], rtol=1e-12)
    rows_file = tmp_path / "rows.json"
    rows_file.write_text(rows.to_json(orient="split", index=False, date_unit="us"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"FEATURES_REPO": str(repo.root)}
    done = subprocess.run(
        [sys.executable, "-c", LOAD_AND_PREDICT, str(model_dir), str(rows_file)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    np.testing.assert_allclose(json.loads(done.stdout.strip().splitlines()[-1]), here, rtol=1e-12)


# ---------------------------------------------------------------------------------------------------------
# The feature server


def test_the_server_answers_them_beside_the_stored_ones(repo: Repo, events, labels) -> None:
    from feature_servers import start_server, stop_server

    rows = model_rows(labels)
    amounts = [None if pd.isna(a) else float(a) for a in rows["amount"]]
    body = {
        "features": ["user_req:count_1h"],
        "entities": {"user_id": rows["user_id"].tolist()},
        "request_features": NAMES,
        "request": {
            "amount": amounts,
            "merchant_id": rows["merchant_id"].tolist(),
            "request_time": [ASKED_AT.isoformat()] * len(rows),
        },
    }
    server = start_server(repo.root)
    try:
        status, answer = server.post("/get-online-features", body)
        assert status == 200, answer
        names = answer["metadata"]["feature_names"]
        assert names == ["user_id", "count_1h", *NAMES]  # the inputs no one asked for are left out
        got = pd.DataFrame({n: r["values"] for n, r in zip(names, answer["results"], strict=True)})
        want = brute_force(events, labels, pd.Series([ASKED_AT] * len(labels)), stored_at=END)
        assert_same(got, want)

        def refused(change: dict, status: int = 400) -> dict:
            answered, problem = server.post("/get-online-features", {**body, **change})
            assert answered == status, problem
            assert set(problem) == {"error", "fix"}
            return problem

        problem = refused({"request_features": ["nope"]}, 404)
        assert problem["error"] == "request_features: no request-time feature named 'nope'"
        assert "'amount_vs_max_1h'" in problem["fix"]
        problem = refused({"request": {"amount": amounts}})
        assert problem["error"] == "request: no values for the request field 'merchant_id'"
        problem = refused({"request": {**body["request"], "merchant_id": [7] * len(rows)}})
        assert problem["error"].startswith("request.merchant_id.0: 7 is not a string")
        assert problem["fix"] == "send a string for 'merchant_id'"
        problem = refused({"request": {**body["request"], "amount": amounts[:3]}})
        assert problem["error"] == f"request.amount: 3 values for {len(rows)} entity rows"
        problem = refused({"request": {**body["request"], "tip": [1] * len(rows)}})
        assert problem["error"].startswith("request.tip: no requested request-time feature reads this field")
        # A function that fails is no mistake of the client: 500, naming the feature and its first failing row.
        negative = [5.0, -4.0] + [1.0] * (len(rows) - 2)
        problem = refused({"request_features": ["fragile"], "request": {"amount": negative}}, 500)
        assert problem["error"].startswith("fragile: the request-time feature failed at row 1 (amount=-4.0)")
        # Without request-time features the request is Feast's as before.
        status, plain = server.post(
            "/get-online-features", {"features": body["features"], "entities": body["entities"]}
        )
        assert status == 200 and plain["metadata"]["feature_names"] == ["user_id", "count_1h"]
    finally:
        stop_server(server)


# ---------------------------------------------------------------------------------------------------------
# Feast: `features apply` registers each as an OnDemandFeatureView


def test_feast_gives_the_same_values_online_and_in_training_sets(repo: Repo, events, labels) -> None:
    from feast import FeatureStore

    from features.pipelines.registration import apply

    apply(str(repo.root))
    store = FeatureStore(repo_path=str(repo.root))
    assert sorted(v.name for v in store.list_on_demand_feature_views()) == sorted([*NAMES, "fragile"])
    refs = [f"{name}:{name}" for name in NAMES]
    rows = model_rows(labels)  # a Feast client sends the request time with the fields
    entity_rows = [
        {k: None if k == "amount" and pd.isna(v) else v for k, v in row.items()}
        | {"request_time": ASKED_AT.to_pydatetime()}
        for row in rows.to_dict("records")
    ]
    online = store.get_online_features(features=refs, entity_rows=entity_rows).to_df()
    assert_same(online, brute_force(events, labels, pd.Series([ASKED_AT] * len(labels)), stored_at=END))
    # Feast's point-in-time join, the request time a column of the rows (Feast returns them in an order of its own)
    entity_df = labels.rename(columns={"event_ts": "event_timestamp"}).assign(row=range(len(labels)))
    entity_df["request_time"] = entity_df["event_timestamp"]
    historical = store.get_historical_features(entity_df=entity_df, features=refs).to_df()
    historical = historical.sort_values("row").reset_index(drop=True)
    assert_same(historical, brute_force(events, labels, labels["event_ts"]))
