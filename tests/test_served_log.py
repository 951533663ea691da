"""The served log (`features serve --log-served`): what a real server answered, read back from its Delta table row
by row; and `features monitor --served`, which flags, against a model's training days, exactly the feature whose
served values were shifted.

One server on a SQLite repo logs every request (--log-sample 1); it is stopped (which appends what its worker
holds) before the log is read. The online rows are drawn like the rows the recorded statistics of the training days
describe, except `amount_sum`, moved up by one standard deviation.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from feature_servers import Server, start_server, stop_server
from online_repos import T0, USER, make_repo, writer

from features.cli import main
from features.errors import ConfigError
from features.kernel.profile import profile_days
from features.repo import Repo, read_config
from features.stores.served_log import read_served
from features.stores.served_logging import ServedRequest, ServedWriter, served_rows
from features.stores.statistics import record_backfill, statistics_table

KEYS = [f"u{i:04d}" for i in range(1_000)]
TRAINING_START = datetime(2024, 1, 1, tzinfo=UTC)
TRAINING_DAYS = 3
SHIFTED = "amount_sum"
SERVICE = "fraud_v1"
STATUSES = np.array(["OK", "FAILED", "REVIEW"], dtype=object)


def drawn(n: int, seed: int, shift: float = 0.0) -> pd.DataFrame:
    """Rows of USER: every feature from a fixed distribution; `amount_sum` moved by `shift` standard deviations."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 4, n)
    return pd.DataFrame(
        {
            "txn_count": rng.poisson(5, n).astype("int64"),
            "amount_sum": rng.normal(100.0 + 20.0 * shift, 20.0, n),
            "amount_max": rng.gamma(2.0, 30.0, n),
            "merchants": rng.integers(1, 6, n).astype("int64"),
            "amount_p90": rng.normal(50.0, 5.0, n),
            "last_status": rng.choice(STATUSES, n, p=[0.7, 0.2, 0.1]),
            "last_ok": rng.random(n) < 0.8,
            "last_merchants": [rng.integers(1, 9, k).tolist() for k in sizes],
            "last_amounts": [rng.normal(30.0, 5.0, k).tolist() for k in sizes],
            "last_statuses": [rng.choice(STATUSES, k).tolist() for k in sizes],
            "last_oks": [(rng.random(k) < 0.5).tolist() for k in sizes],
        }
    )


@dataclass
class Served:
    root: Path
    answers: list[tuple[dict, dict[str, str], dict]]  # (body, headers, answer) of each request answered 200


def _post(server: Server, body: dict, headers: dict[str, str]) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("POST", "/get-online-features", json.dumps(body), {"Content-Type": "application/json", **headers})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    from feast import FeatureService, FeatureStore

    root = make_repo(tmp_path_factory.mktemp("served") / "repo", "sqlite", groups=(USER,))
    store = FeatureStore(repo_path=str(root))
    store.apply(
        [FeatureService(name=SERVICE, features=[store.get_feature_view(USER.name)[["txn_count", "amount_sum"]]])]
    )
    rows = drawn(len(KEYS), seed=2, shift=1.0)
    writer(root, USER).write(rows.assign(user_id=KEYS, window_end=T0))
    server = start_server(root, options=["--log-served", "--log-sample", "1"])
    features = [f"{USER.name}:{f.name}" for f in USER.features]
    requests = [
        ({"features": features, "entities": {"user_id": KEYS[i : i + 100]}}, {"X-Model": "fraud_model"})
        for i in range(0, len(KEYS), 100)
    ]
    requests += [
        ({"features": features[:2], "entities": {"user_id": ["u0001", "nobody"]}, "full_feature_names": True}, {}),
        ({"feature_service": SERVICE, "entities": {"user_id": ["u0002"]}}, {}),
    ]
    answers = []
    try:
        for body, headers in requests:
            status, answer = _post(server, body, headers)
            assert status == 200, answer
            answers.append((body, headers, answer))
        status, _ = _post(server, {"features": ["nope:x"], "entities": {"user_id": ["u1"]}}, {})
        assert status == 404  # refused: not logged
    finally:
        stop_server(server)
    yield Served(root, answers)


def test_the_served_log_holds_each_entity_row_as_answered(served: Served) -> None:
    from deltalake import DeltaTable

    # As docs/serving.md reads it
    logged = DeltaTable(str(served.root / "data" / "served")).to_pandas(filters=[("date", ">=", date(2024, 1, 1))])
    logged = logged.sort_values(["served_at", "row"])
    assert len(logged) == sum(len(next(iter(body["entities"].values()))) for body, _, _ in served.answers)
    by_request = [part.sort_values("row") for _, part in logged.groupby("request_id", sort=False)]
    by_request.sort(key=lambda part: part["served_at"].iloc[0])
    assert len(by_request) == len(served.answers)
    for (body, headers, answer), part in zip(served.answers, by_request, strict=True):
        keys = body["entities"]["user_id"]
        assert [json.loads(k) for k in part["entity_key"]] == [{"user_id": k} for k in keys]
        assert list(part["row"]) == list(range(len(keys)))
        assert set(part["model"].fillna("")) == {headers.get("X-Model", "")}
        assert set(part["feature_service"].fillna("")) == {body.get("feature_service", "")}
        assert set(part["date"]) == {part["served_at"].iloc[0].date()}
        names = answer["metadata"]["feature_names"]
        for i, text in enumerate(part["values"]):
            want = {
                f"{USER.name}:{name.removeprefix(USER.name + '__')}": result["values"][i]
                for name, result in zip(names, answer["results"], strict=True)
                if name != "user_id"
            }
            assert json.loads(text) == want
    assert json.loads(by_request[-2]["values"].iloc[1]) == {
        f"{USER.name}:txn_count": None,
        f"{USER.name}:amount_sum": None,
    }


def _training_statistics(repo: Repo) -> None:
    """The statistics a backfill of the training days records: USER's rows drawn unshifted, 1,000 a day."""
    profiles = {}
    for day in range(TRAINING_DAYS):
        rows = drawn(len(KEYS), seed=10 + day)
        rows["window_end"] = pd.Timestamp(TRAINING_START + timedelta(days=day, hours=12))
        table = pa.Table.from_pandas(rows, preserve_index=False)
        profiles.update(profile_days(table, "window_end", [f.name for f in USER.features]))
    end = TRAINING_START + timedelta(days=TRAINING_DAYS)
    record_backfill(statistics_table(repo.root, USER.name), profiles, {}, TRAINING_START, end)


def test_monitor_flags_exactly_the_feature_served_shifted_from_the_training_days(served: Served, capsys) -> None:
    import mlflow

    from features.ml.tracking import training_run
    from features.pipelines.monitor import monitor

    repo = Repo(served.root, read_config(served.root / "feature_store.yaml"), {USER.name: USER})
    _training_statistics(repo)
    with training_run(repo, "train") as run:
        mlflow.set_tags(
            {
                "features.training.start": "2024-01-01T00:00:00+00:00",
                "features.training.end": "2024-01-03T23:00:00+00:00",
            }
        )
    model = f"runs:/{run.info.run_id}"

    report = monitor(repo, reference_model=model, served=True)
    assert report.reference == (date(2024, 1, 1), date(2024, 1, 4)) and report.compared == "served values"
    judged = [d for d in report.drift if d.psi is not None]
    assert {d.feature for d in judged} == {f.name for f in USER.features}
    assert {d.feature for d in report.drifted} == {SHIFTED}
    assert report.drifted[0].mean > report.drifted[0].reference_mean + 15

    with pytest.raises(ConfigError, match=r"--served: no served values were logged .* on 2100-01-01 or later"):
        monitor(repo, reference_model=model, served=True, start="2100-01-01")


def _request(keys: list[str]) -> ServedRequest:
    body = {"features": [f"{USER.name}:txn_count"], "entities": {"user_id": keys}}
    answer = {
        "metadata": {"feature_names": ["user_id", "txn_count"]},
        "results": [{"values": keys}, {"values": list(range(len(keys)))}],
    }
    return ServedRequest(datetime.now(UTC), None, json.dumps(body).encode(), json.dumps(answer).encode())


def test_a_request_time_feature_is_logged_under_its_name() -> None:
    """The answer's extra results (features.stores.serving_request_time) are logged under their names; stored
    features asked under full names or through a feature service under their references."""
    body = {
        "feature_service": SERVICE,
        "full_feature_names": True,
        "entities": {"user_id": ["u1"]},
        "request_features": ["amount_ratio"],
        "request": {"amount": [3.0]},
    }
    answer = {
        "metadata": {"feature_names": ["user_id", "scored__txn_count", "amount_ratio"]},
        "results": [{"values": ["u1"]}, {"values": [4]}, {"values": [0.75]}],
    }
    request = ServedRequest(datetime.now(UTC), "m", json.dumps(body).encode(), json.dumps(answer).encode())
    [row] = served_rows(request, lambda name: [("scored", USER.name, "txn_count")] if name == SERVICE else [])
    assert json.loads(row["values"]) == {f"{USER.name}:txn_count": 4, "amount_ratio": 0.75}
    assert (row["feature_service"], row["model"], row["entity_key"]) == (SERVICE, "m", '{"user_id": "u1"}')


def test_the_writer_holds_a_bounded_queue_and_never_raises(tmp_path: Path, monkeypatch, caplog) -> None:
    """A request beyond the writer's byte budget is dropped and counted; one it cannot append is logged and
    dropped: the server never waits for the log, nor fails for it."""
    from features.stores import served_logging

    small, large = _request(["u1", "u2"]), _request([f"u{i}" for i in range(1_000)])
    monkeypatch.setattr(served_logging, "QUEUE_BYTES", len(small.body) + len(small.answer) + 100)
    table = str(tmp_path / "served")
    kept = ServedWriter(table, lambda name: [])
    kept.offer(large)
    kept.offer(small)
    kept.close()
    assert kept.dropped == 1
    assert read_served(table).column("entity_key").to_pylist() == ['{"user_id": "u1"}', '{"user_id": "u2"}']

    (tmp_path / "not_a_table").write_text("")
    failing = ServedWriter(str(tmp_path / "not_a_table"), lambda name: [])
    failing.offer(small)
    failing.close()
    assert "served log: 2 rows not appended" in caplog.text


def test_serve_log_flags_are_checked(capsys) -> None:
    assert main(["serve", "--log-sample", "0.5"]) == 2
    assert "--log-sample: given without --log-served" in capsys.readouterr().err
    assert main(["serve", "--log-served", "--log-sample", "1.5"]) == 2
    assert "--log-sample: 1.5 is not a share of requests" in capsys.readouterr().err
