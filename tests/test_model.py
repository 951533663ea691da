"""The model that serves itself (features.ml.model): an MLflow pyfunc reading its features from Feast online.

- `predict` fetches each key's current online values and predicts exactly what the wrapped classifier
  predicts on the reference values as of the backfill end (keys never seen: empty windows, 0 counts).
- Logged with a signature, registered in the MLflow model registry, loaded back by `models:/` URI (here; in a
  clean virtualenv from the model's own requirements: tests/test_model_serving.py).
- Served by `mlflow models serve --env-manager local` on 127.0.0.1 (a free port): the HTTP predictions are
  the in-process ones; a request without a needed column is refused.
- Mistakes name the column or the fix.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
from reference import reference_frame

from features import ConfigError, Entity, EventSource, Feature, FeatureGroup, Hop, Lifetime, agg
from features.ml import tracking
from features.ml.model import ENV_REPO, OUTPUT, feature_model, log_model, predict_http, serve
from features.ml.training import training_set
from features.pipelines.backfill import backfill
from features.repo import Repo
from features.spec.fingerprint import definition_hash

pytestmark = pytest.mark.spark

START = pd.Timestamp("2026-01-01", tz="UTC")
END = pd.Timestamp("2026-01-01 20:00", tz="UTC")  # events go on until midnight: windows are busy at END
SOURCE = EventSource("transactions", path="data/transactions", timestamp="event_ts")
GROUP = FeatureGroup(
    name="user_risk",
    entity=Entity("user", join_keys=["user_id"]),
    source=SOURCE,
    features=[
        Feature("failed_1h", agg.count(), window=Hop("1h", every="5m"), where="status = 'FAILED'"),
        Feature("amount_sum_1h", agg.sum("amount"), window=Hop("1h", every="5m")),
        Feature("amount_max_1h", agg.max("amount"), window=Hop("1h", every="5m")),
        Feature("txn_count_lifetime", agg.count(), window=Lifetime(every="1h")),
    ],
)
REFS = [f"user_risk:{f.name}" for f in GROUP.features]
FEATURES = [f.name for f in GROUP.features]
MODEL_NAME = "user_risk_model"


@pytest.fixture(scope="module")
def events() -> pd.DataFrame:
    from features.demo import generate_transactions

    return generate_transactions(1_500, 20, START, 1, seed=23)


@pytest.fixture(scope="module")
def repo(spark, tmp_path_factory: pytest.TempPathFactory, feast_repo_factory, events: pd.DataFrame) -> Repo:
    root = feast_repo_factory(tmp_path_factory.mktemp("model") / "repo", [GROUP], events)
    loaded = Repo.load(root)
    backfill(loaded, START, END, spark=spark, progress=False, track=False)
    return loaded


@pytest.fixture(scope="module")
def classifier(repo: Repo, events: pd.DataFrame):
    from sklearn.ensemble import HistGradientBoostingClassifier

    rows = events[events["event_ts"] < END][["user_id", "event_ts", "amount", "is_fraud"]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # rows on the day after END: outside the backfilled days
        frame = training_set(rows, REFS, repo, timestamp_column="event_ts", log_lineage=False)
    assert frame["is_fraud"].nunique() == 2
    return HistGradientBoostingClassifier(max_iter=30, random_state=0).fit(
        frame[["amount", *FEATURES]], frame["is_fraud"]
    )


@pytest.fixture(scope="module")
def rows(events: pd.DataFrame) -> pd.DataFrame:
    """Keys to score: recent users (busy windows), and one never seen; with the request-time amount."""
    recent = events[events["event_ts"] < END].sort_values("event_ts")["user_id"].drop_duplicates(keep="last")
    users = [*recent.tail(6).tolist(), "nobody"]
    return pd.DataFrame({"user_id": users, "amount": np.linspace(5.0, 900.0, len(users))})


@pytest.fixture(scope="module")
def registered(repo: Repo, classifier, rows: pd.DataFrame):
    """The wrapped classifier logged on a run in the repo's store and registered (version 1)."""
    previous = mlflow.get_tracking_uri() if mlflow.active_run() else None
    tracking.use(repo)
    with mlflow.start_run(run_name="user risk"):
        info = log_model(
            classifier, REFS, repo, input_example=rows, input_columns=["amount"], registered_model_name=MODEL_NAME
        )
    yield info
    mlflow.set_tracking_uri(previous)


def expected_probabilities(classifier, events: pd.DataFrame, rows: pd.DataFrame) -> np.ndarray:
    """The classifier on the reference values as of END, with the empty-window values of docs/semantics.md."""
    want = reference_frame(events, GROUP, [((user,), END) for user in rows["user_id"]])
    features = pd.DataFrame({"amount": rows["amount"].to_numpy()})
    for name in FEATURES:
        features[name] = pd.to_numeric(want[name]).astype("float64").to_numpy()
    return classifier.predict_proba(features)[:, 1]


# ---------------------------------------------------------------------------------------------------------


def test_predict_reads_the_online_store_and_fills_empty_windows(repo: Repo, classifier, events, rows):
    model = feature_model(classifier, REFS, repo, input_columns=["amount"])
    frame = model.feature_frame(rows)
    assert list(frame.columns) == ["amount", *FEATURES]
    want = reference_frame(events, GROUP, [((user,), END) for user in rows["user_id"]])
    for name in FEATURES:
        got, expected = pd.to_numeric(frame[name]).to_numpy(float), pd.to_numeric(want[name]).to_numpy(float)
        np.testing.assert_allclose(got, expected, rtol=1e-9, equal_nan=True, err_msg=name)
    nobody = frame.iloc[-1]
    assert nobody["failed_1h"] == 0 and nobody["amount_sum_1h"] == 0.0 and nobody["txn_count_lifetime"] == 0
    assert np.isnan(nobody["amount_max_1h"])
    assert frame["failed_1h"].dtype == np.int64
    assert frame["txn_count_lifetime"].iloc[:-1].min() > 0  # real users had history online

    predicted = model.predict(None, rows)
    assert predicted.name == OUTPUT and len(predicted) == len(rows)
    np.testing.assert_allclose(predicted.to_numpy(), expected_probabilities(classifier, events, rows), rtol=1e-9)


def test_logged_with_a_signature_registered_and_loaded_back(registered, classifier, events, rows):
    info = registered
    assert info.registered_model_version == 1
    assert info.signature.inputs.input_names() == ["user_id", "amount"]
    assert [spec.type.name for spec in info.signature.inputs.inputs] == ["string", "double"]
    assert info.signature.outputs is not None
    assert info.metadata["features"] == REFS
    assert info.metadata["definition_hashes"] == {"user_risk": definition_hash(GROUP)}
    assert info.metadata["features_wheel"].startswith("code/windowed_features-")  # see tests/test_model_serving.py
    versions = mlflow.MlflowClient().search_model_versions(f"name = '{MODEL_NAME}'")
    assert [str(v.version) for v in versions] == ["1"]
    loaded = mlflow.pyfunc.load_model(f"models:/{MODEL_NAME}/1")
    predicted = loaded.predict(rows)
    np.testing.assert_allclose(
        np.asarray(predicted, dtype=float), expected_probabilities(classifier, events, rows), rtol=1e-9
    )


@pytest.mark.slow
def test_served_by_mlflow_models_serve_over_http(repo: Repo, registered, classifier, events, rows):
    with serve(f"models:/{MODEL_NAME}/1", tracking_uri=tracking.tracking_uri(repo)) as url:
        assert url.startswith("http://127.0.0.1:")
        served = predict_http(url, rows)
        np.testing.assert_allclose(served.to_numpy(), expected_probabilities(classifier, events, rows), rtol=1e-9)
        with pytest.raises(ConfigError, match=r"/invocations answered 400: .*amount"):
            predict_http(url, rows[["user_id"]])


@pytest.mark.slow
def test_a_model_the_server_cannot_load_is_an_error_with_its_output(repo: Repo, registered):
    with (
        pytest.raises(ConfigError, match=r"(?s)mlflow models serve exited with status 1:\n.*no_such_model"),
        serve("models:/no_such_model/1", tracking_uri=tracking.tracking_uri(repo), timeout_s=120),
    ):
        pass


def test_mistakes_name_the_column_and_the_fix(repo: Repo, classifier, rows, monkeypatch: pytest.MonkeyPatch, tmp_path):
    with pytest.raises(ConfigError, match=r"model: object has no predict_proba; wrap a fitted classifier"):
        feature_model(object(), REFS, repo)
    model = feature_model(classifier, REFS, repo, input_columns=["amount"])
    with pytest.raises(ConfigError, match=r"model input: no column 'amount'; the model needs the join keys user_id"):
        model.predict(None, rows[["user_id"]])
    with pytest.raises(ConfigError, match=r"input_example: no column 'amount'; pass rows with the join keys"):
        log_model(classifier, REFS, repo, input_example=rows[["user_id"]], input_columns=["amount"])
    monkeypatch.setenv(ENV_REPO, str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match=r"nowhere has no feature_store.yaml"):
        feature_model(classifier, REFS, repo, input_columns=["amount"]).predict(None, rows)


def test_served_repo_follows_features_repo(repo: Repo, classifier, rows, monkeypatch: pytest.MonkeyPatch):
    model = feature_model(classifier, REFS, Path(repo.root), input_columns=["amount"])
    monkeypatch.setenv(ENV_REPO, str(repo.root))
    model.repo = "/a/path/that/moved"  # as if logged on another machine
    assert len(model.predict(None, rows)) == len(rows)
