"""MLflow tracking (features.ml.tracking) on a real SQLite tracking store.

- Where runs go: the repo's own SQLite store by default, MLFLOW_TRACKING_URI when set; a store that cannot
  start is a ConfigError naming MLFLOW_TRACKING_URI; `enabled=False` records nothing and never imports MLflow.
- What a run holds: the definitions artifact and hashes, params, per-group metrics and validation results;
  a failing block ends the run FAILED with the error (and a ValidationFailed's report); nesting under an
  active run; `find_runs` finds runs by group, definition hash, feature and kind.
- A real backfill (Spark) is one tracked run with its counts and validation; `--no-tracking` and
  `track=False` record nothing; a backfill whose validation fails leaves a FAILED run with the failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import great_expectations as gx
import mlflow
import pandas as pd
import pytest
from great_expectations.core import ExpectationSuite, ExpectationSuiteValidationResult
from great_expectations.core.expectation_validation_result import ExpectationValidationResult
from groups import SOURCE
from groups import USER_ACTIVITY as GROUP
from mlflow import MlflowClient

from features import ConfigError, Entity, Feature, FeatureGroup, Hop, agg
from features.errors import ValidationFailed
from features.ml import tracking
from features.pipelines.backfill import BackfillResult, backfill
from features.quality import Outcome, ValidationReport
from features.repo import Repo
from features.spec.fingerprint import definition_hash, describe, feature_hashes

START = datetime(2026, 1, 1, tzinfo=UTC)
END = datetime(2026, 1, 2, tzinfo=UTC)
OTHER = FeatureGroup(
    name="user_failures",
    entity=Entity("user", join_keys=["user_id"]),
    source=SOURCE,
    features=[Feature("failed_1h", agg.count(), window=Hop("1h", every="5m"), where="status = 'FAILED'")],
)


@pytest.fixture(autouse=True)
def own_store(monkeypatch: pytest.MonkeyPatch):
    """Each test uses its repo's default store, and leaves MLflow's fluent API as it found it."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    monkeypatch.delenv("DATABRICKS_RUNTIME_VERSION", raising=False)
    yield
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(None)


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new SQLite tracking store, made once: creating one runs MLflow's schema migrations (seconds)."""
    path = tmp_path_factory.mktemp("store") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def repo(tmp_path: Path, empty_store: Path) -> Repo:
    """A repo as tracking sees it: a root, a project, groups (no Feast needed to track), and a copy of an
    empty store where its default store goes."""
    root = tmp_path / "repo"
    (root / "data").mkdir(parents=True)
    shutil.copy(empty_store, root / "data" / "mlflow.db")
    return Repo(root=root, config={"project": "trackme"}, groups={GROUP.name: GROUP, OTHER.name: OTHER})


def report(group: str, success: bool) -> ValidationReport:
    """A validation report made of Great Expectations' own result objects (as features.quality makes them)."""
    expectation = gx.expectations.ExpectColumnValuesToNotBeNull(column="user_id")
    result = ExpectationValidationResult(
        success=success, expectation_config=expectation.configuration, result={"unexpected_count": 0 if success else 3}
    )
    outcome = Outcome(
        name="not_null(user_id)",
        expectation_type="expect_column_values_to_not_be_null",
        success=success,
        user=False,
        check="not_null(user_id)",
        unexpected=0 if success else 3,
    )
    return ValidationReport(
        group=group,
        success=success,
        rows=42,
        outcomes=[outcome],
        evaluated_by="great_expectations",
        seconds=0.25,
        great_expectations=lambda: (
            ExpectationSuiteValidationResult(success=success, results=[result], suite_name=group),
            ExpectationSuite(name=group, expectations=[expectation]),
        ),
    )


def client_of(repo: Repo) -> MlflowClient:
    return MlflowClient(tracking_uri=tracking.tracking_uri(repo))


def artifact_json(client: MlflowClient, run_id: str, path: str) -> dict:
    local = client.download_artifacts(run_id, path)
    return json.loads(Path(local).read_text())


# ---------------------------------------------------------------------------------------------------------
# Where runs go


def test_default_store_is_sqlite_under_the_repo(repo: Repo):
    assert tracking.tracking_uri(repo) == f"sqlite:///{repo.root.resolve()}/data/mlflow.db"
    assert tracking.experiment_name(repo) == "features-trackme"
    with tracking.start_run(repo, kind="backfill", groups=[GROUP]) as run:
        pass
    experiment = client_of(repo).get_experiment(run.experiment_id)
    assert experiment.name == "features-trackme"
    assert experiment.artifact_location == (repo.root / "data" / "mlartifacts").resolve().as_uri()


def test_mlflow_tracking_uri_wins(repo: Repo, tmp_path: Path, empty_store: Path, monkeypatch: pytest.MonkeyPatch):
    shutil.copy(empty_store, tmp_path / "elsewhere.db")
    elsewhere = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", elsewhere)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "team-features")
    with tracking.start_run(repo, kind="stream", groups=[GROUP]) as run:
        pass
    assert run.tracking_uri == elsewhere
    assert client_of(repo).search_experiments(filter_string="name = 'features-trackme'") == []
    found = MlflowClient(tracking_uri=elsewhere).get_run(run.run_id)
    assert found.data.tags["features.kind"] == "stream"
    assert MlflowClient(tracking_uri=elsewhere).get_experiment(found.info.experiment_id).name == "team-features"


@pytest.mark.parametrize("kind", ["unwritable", "scheme"])
def test_a_store_that_cannot_start_is_a_config_error_naming_the_variable(
    repo: Repo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
):
    (tmp_path / "a_file").write_text("not a folder")
    uri = f"sqlite:///{tmp_path / 'a_file' / 'mlflow.db'}" if kind == "unwritable" else "nosuchscheme://somewhere"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    ran = False
    with pytest.raises(ConfigError) as caught, tracking.start_run(repo, kind="backfill", groups=[GROUP]):
        ran = True
    message = str(caught.value)
    assert message.startswith("MLFLOW_TRACKING_URI:"), message
    assert uri in message and "--no-tracking" in message and "unset it" in message
    assert not ran


def test_a_run_made_in_the_background_raises_a_store_that_cannot_start_when_awaited(
    repo: Repo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    uri = "nosuchscheme://somewhere"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with (
        pytest.raises(ConfigError, match=r"^MLFLOW_TRACKING_URI: .*nosuchscheme") as caught,
        tracking.start_run(repo, kind="backfill", groups=[GROUP], background=True) as run,
    ):
        run.ready()
    assert any("could not record this failure" in note for note in caught.value.__notes__)


def test_tracking_off_records_nothing_and_never_imports_mlflow(tmp_path: Path):
    code = """
import sys
from pathlib import Path
from features import Entity, EventSource, Feature, FeatureGroup, Hop, agg
from features.ml import tracking
from features.repo import Repo
source = EventSource("transactions", path="data/transactions", timestamp="event_ts")
user = Entity("user", join_keys=["user_id"])
GROUP = FeatureGroup("g", user, source, [Feature("n", agg.count(), Hop("1h", every="5m"))])
repo = Repo(root=Path(sys.argv[1]), config={"project": "p"}, groups={GROUP.name: GROUP})
with tracking.start_run(repo, kind="backfill", groups=[GROUP], params={"a": 1}, enabled=False) as run:
    run.log_metrics({"rows_in": 3})
    run.log_params({"b": 2})
    assert run.run_id is None and not run.enabled
print("mlflow" in sys.modules)
"""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env, check=False, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"
    assert not (tmp_path / "data").exists()


# ---------------------------------------------------------------------------------------------------------
# What a run holds


@pytest.mark.parametrize("background", [False, True])
def test_a_run_holds_definitions_params_metrics_and_validation(repo: Repo, background: bool):
    result = BackfillResult(
        group=GROUP.name,
        start=START,
        end=END,
        rows_in=1000,
        rows_out=321,
        online_rows=17,
        seconds=4.5,
        quarantined={"null_timestamp": 2, "bad value!": 1},
        quarantine_path="/quarantine/records/x",
        validation=report(GROUP.name, success=True),
    )
    params = {"start": START, "end": END, "online": True}
    with tracking.start_run(repo, "backfill", [GROUP, OTHER], params, background=background) as run:
        run.log_result(result)
        run.log_metrics({"late": 5}, step=3, group=OTHER.name)
    client = client_of(repo)
    stored = client.get_run(run.run_id)
    assert stored.info.status == "FINISHED"
    tags, logged, metrics = stored.data.tags, stored.data.params, stored.data.metrics
    assert tags["features.kind"] == "backfill"
    assert tags["features.groups"] == "user_activity,user_failures"
    assert tags["features.project"] == "trackme"
    assert tags["features.definition_hash.user_activity"] == definition_hash(GROUP)
    assert tags["features.definition_hash.user_failures"] == definition_hash(OTHER)
    assert tags["features.feature.user_activity.amount_sum_1h"] == feature_hashes(GROUP)["amount_sum_1h"]
    assert tags["user_activity.quarantine_path"] == "/quarantine/records/x"
    assert logged["start"] == START.isoformat() and logged["end"] == END.isoformat()
    assert logged["definition_hash.user_activity"] == definition_hash(GROUP)
    assert metrics["user_activity.rows_in"] == 1000
    assert metrics["user_activity.rows_out"] == 321
    assert metrics["user_activity.online_rows"] == 17
    assert metrics["user_activity.seconds"] == 4.5
    assert metrics["user_activity.records_quarantined"] == 3
    assert metrics["user_activity.quarantined.null_timestamp"] == 2
    assert metrics["user_activity.quarantined.bad value_"] == 1
    assert metrics["user_activity.batch_quarantined"] == 0
    assert metrics["user_activity.validation.success"] == 1
    assert metrics["user_activity.validation.expectations"] == 1
    assert metrics["user_activity.validation.failed"] == 0
    assert metrics["user_activity.validation.rows"] == 42
    late = client.get_metric_history(run.run_id, "user_failures.late")
    assert [(m.value, m.step) for m in late] == [(5, 3)]

    definitions = artifact_json(client, run.run_id, "features/definitions.json")
    assert definitions["user_activity"]["definition"] == json.loads(json.dumps(describe(GROUP)))
    assert definitions["user_activity"]["definition_hash"] == definition_hash(GROUP)
    assert definitions["user_failures"]["feature_hashes"] == feature_hashes(OTHER)
    validation = artifact_json(client, run.run_id, f"validation/user_activity/{result.validation.run_id}.json")
    assert validation["success"] is True
    assert validation["outcomes"][0]["expectation"] == "not_null(user_id)"
    assert validation["result"]["results"][0]["expectation_config"]["type"] == "expect_column_values_to_not_be_null"


def test_a_failing_block_ends_the_run_failed_with_the_error_and_the_report(repo: Repo):
    failed = report(GROUP.name, success=False)
    with (
        pytest.raises(ValidationFailed, match="3 null keys"),
        tracking.start_run(repo, kind="backfill", groups=[GROUP]) as run,
    ):
        raise ValidationFailed("user_activity: 3 null keys", failed)
    stored = client_of(repo).get_run(run.run_id)
    assert stored.info.status == "FAILED"
    assert stored.data.tags["features.error"] == "ValidationFailed: user_activity: 3 null keys"
    assert stored.data.metrics["user_activity.validation.success"] == 0
    assert stored.data.metrics["user_activity.validation.failed"] == 1


@pytest.mark.parametrize("background", [False, True])
def test_a_run_started_inside_an_active_run_is_its_child(repo: Repo, background: bool):
    """The active run is the caller thread's, also for a run made in a thread of its own."""
    tracking.use(repo)
    assert "MLFLOW_TRACKING_URI" not in os.environ  # `use` leaves the environment (other repos) alone
    with (
        mlflow.start_run(run_name="notebook") as parent,
        tracking.start_run(repo, kind="backfill", groups=[GROUP], background=background) as child,
    ):
        pass
    stored = client_of(repo).get_run(child.run_id)
    assert stored.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert stored.info.experiment_id == parent.info.experiment_id


def test_find_runs_by_group_hash_feature_and_kind(repo: Repo):
    with tracking.start_run(repo, kind="backfill", groups=[GROUP]) as first:
        pass
    with tracking.start_run(repo, kind="stream", groups=[OTHER]) as second:
        pass
    assert list(tracking.find_runs(repo, group="user_activity")["run_id"]) == [first.run_id]
    found = tracking.find_runs(repo, group="user_activity", definition_hash=definition_hash(GROUP))
    assert list(found["run_id"]) == [first.run_id]
    assert tracking.find_runs(repo, group="user_activity", definition_hash="0" * 16).empty
    assert list(tracking.find_runs(repo, feature="user_failures:failed_1h")["run_id"]) == [second.run_id]
    assert list(tracking.find_runs(repo, kind="stream")["run_id"]) == [second.run_id]
    both = tracking.find_runs(repo)
    assert list(both["run_id"]) == [second.run_id, first.run_id]  # newest first
    assert isinstance(both["start_time"].iloc[0], pd.Timestamp)


def test_unknown_kind_is_refused(repo: Repo):
    with pytest.raises(ValueError, match="kind must be one of"), tracking.start_run(repo, kind="batch", groups=[]):
        pass


# ---------------------------------------------------------------------------------------------------------
# A real backfill


@pytest.fixture(scope="module")
def backfill_repo(tmp_path_factory: pytest.TempPathFactory, feast_repo_factory) -> Path:
    from features.demo import generate_transactions

    events = generate_transactions(600, 8, START, 1, seed=11)
    failing = FeatureGroup(
        name="never_any",
        entity=Entity("user", join_keys=["user_id"]),
        source=SOURCE,
        features=[Feature("n_1h", agg.count(), window=Hop("1h", every="5m"))],
        expectations=[gx.expectations.ExpectColumnValuesToBeBetween(column="n_1h", max_value=0)],
    )
    return feast_repo_factory(tmp_path_factory.mktemp("tracked") / "repo", [GROUP, failing], events)


@pytest.mark.spark
def test_a_backfill_is_one_tracked_run_with_its_counts_and_validation(spark, backfill_repo: Path):
    repo = Repo.load(backfill_repo)
    before = len(tracking.find_runs(repo))
    (result,) = backfill(repo, START, END, [GROUP.name], spark=spark, progress=False)
    runs = tracking.find_runs(repo, kind="backfill")
    assert len(runs) == before + 1
    run = client_of(repo).get_run(runs["run_id"].iloc[0])
    assert run.info.status == "FINISHED"
    assert run.data.params["start"] == START.isoformat() and run.data.params["end"] == END.isoformat()
    assert run.data.tags["features.definition_hash.user_activity"] == definition_hash(GROUP)
    metrics = run.data.metrics
    assert metrics["user_activity.rows_in"] == result.rows_in > 0
    assert metrics["user_activity.rows_out"] == result.rows_out > 0
    assert metrics["user_activity.online_rows"] == result.online_rows == 8
    assert metrics["user_activity.validation.success"] == 1
    assert metrics["user_activity.validation.expectations"] == len(result.validation.outcomes) > 3
    artifacts = [a.path for a in client_of(repo).list_artifacts(run.info.run_id, "validation/user_activity")]
    assert artifacts == [f"validation/user_activity/{result.validation.run_id}.json"]


@pytest.mark.spark
def test_a_backfill_whose_tracking_cannot_start_writes_nothing(
    spark, backfill_repo: Path, monkeypatch: pytest.MonkeyPatch
):
    """The run is made while the backfill computes; its error stops the backfill before it writes."""
    from features.stores import offline

    repo = Repo.load(backfill_repo)
    table = repo.offline_path(GROUP)
    if offline.current_version(table) is None:  # run alone: a table to leave alone
        backfill(repo, START, END, [GROUP.name], spark=spark, progress=False, track=False)
    version = offline.current_version(table)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuchscheme://somewhere")
    with pytest.raises(ConfigError, match=r"^MLFLOW_TRACKING_URI: .*--no-tracking"):
        backfill(repo, START, END, [GROUP.name], spark=spark, progress=False)
    assert offline.current_version(table) == version


@pytest.mark.spark
def test_tracking_off_leaves_no_run(spark, backfill_repo: Path):
    from features.cli import main

    repo = Repo.load(backfill_repo)
    before = len(tracking.find_runs(repo))
    backfill(repo, START, END, [GROUP.name], spark=spark, progress=False, track=False)
    args = ["backfill", "--repo", str(backfill_repo), "--start", "2026-01-01", "--end", "2026-01-02"]
    assert main([*args, "--group", GROUP.name, "--no-tracking"]) == 0
    assert len(tracking.find_runs(repo)) == before


@pytest.mark.spark
def test_a_backfill_failing_validation_leaves_a_failed_run_with_the_failure(spark, backfill_repo: Path):
    repo = Repo.load(backfill_repo)
    with pytest.raises(ValidationFailed):
        backfill(repo, START, END, ["never_any"], spark=spark, progress=False)
    (run_id,) = tracking.find_runs(repo, group="never_any")["run_id"]
    run = client_of(repo).get_run(run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags["features.error"].startswith("ValidationFailed:")
    assert run.data.metrics["never_any.validation.success"] == 0
    assert run.data.metrics["never_any.validation.failed"] >= 1
