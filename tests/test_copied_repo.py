"""A repo copied or moved to another path works as it is (features.stores.feast_paths, features.ml.sqlite_store).

One repo is applied, backfilled (with its MLflow run) and read back; then copied with shutil.copytree and the
original renamed away, so that nothing can read or write the original's path any more. On the copy, read from
another working directory: `features plan` shows no changes, Feast's point-in-time and online reads return what the
original returned, and MLflow runs, new and earlier, keep their artifacts in the copy. A registry written the way
earlier versions wrote it (absolute paths) shows its paths as changes in the plan, without failing, until `features
apply` records them relative.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import warnings
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from groups import SOURCE
from groups import USER_ACTIVITY as USERS
from mlflow import MlflowClient

from features import Entity, Feature, FeatureGroup, Hop, agg
from features.cli import main
from features.ml import tracking
from features.ml.sqlite_store import relocate
from features.repo import Repo
from features.stores.feast_paths import in_repo, infra_in_repo

START = pd.Timestamp("2026-01-01", tz="UTC")
END = pd.Timestamp("2026-01-02 06:00", tz="UTC")
CARDS = FeatureGroup(
    name="card_activity",
    entity=Entity("card", join_keys=["card_id"]),
    source=SOURCE,
    features=[Feature("card_count_1h", agg.count(), window=Hop("1h", every="5m"))],
)
GROUPS = [USERS, CARDS]
REFS = [f"{USERS.name}:{f.name}" for f in USERS.features]
ARTIFACTS = Path("data") / "mlartifacts"


@dataclass(frozen=True)
class Moved:
    copy: Path  # the copy, where everything is read now
    original: Path  # where the repo was made and applied: nothing is there any more
    historical: pd.DataFrame  # what the original returned, before it was moved
    online: pd.DataFrame
    run_id: str  # the original's backfill run


@pytest.fixture(autouse=True)
def own_store(monkeypatch: pytest.MonkeyPatch):
    """Each test uses its repo's default MLflow store, and leaves MLflow's fluent API as it found it."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    yield
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(None)


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory that is neither repo's, nor holds anything a relative path could find."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder


def lookups(events: pd.DataFrame) -> pd.DataFrame:
    """Point-in-time lookups: users at times through the range, some between their events."""
    users = sorted(events["user_id"].unique())[:6]
    times = pd.date_range(START + pd.Timedelta("2h"), END, periods=5)
    rows = [(u, t) for u in users for t in times]
    return pd.DataFrame({"user_id": [u for u, _ in rows], "event_timestamp": [t for _, t in rows]})


def historical(root: Path, entity_df: pd.DataFrame) -> pd.DataFrame:
    from feast import FeatureStore

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = FeatureStore(repo_path=str(root)).get_historical_features(entity_df=entity_df, features=REFS).to_df()
    return out.sort_values(["user_id", "event_timestamp"]).reset_index(drop=True)


def online(root: Path, users: list[str]) -> pd.DataFrame:
    from feast import FeatureStore

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = [{"user_id": u} for u in users]
        return FeatureStore(repo_path=str(root)).get_online_features(features=REFS, entity_rows=rows).to_df()


def move(root: Path, to: Path) -> Path:
    """Copy the repo to `to` and rename the original away: its path no longer exists."""
    shutil.copytree(root, to)
    root.rename(root.with_name(root.name + "-renamed"))
    assert not root.exists()
    return to


def plan_lines(root: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    capsys.readouterr()
    assert main(["plan", "--repo", str(root)]) == 0
    return capsys.readouterr().out.strip().splitlines()


def registered_paths(root: Path) -> list[str]:
    """Every path the registry records: the data sources', the views' batch sources', the SQLite tables'."""
    from feast.protos.feast.core.Registry_pb2 import Registry

    registry = Registry()
    registry.ParseFromString((root / "data" / "registry.db").read_bytes())
    return (
        [s.file_options.uri for s in registry.data_sources]
        + [v.spec.batch_source.file_options.uri for v in registry.feature_views]
        + [o.sqlite_table.path for o in registry.infra.infra_objects]
    )


@pytest.fixture(scope="module")
def events() -> pd.DataFrame:
    from features.demo import generate_transactions

    return generate_transactions(400, 12, START, 1, seed=11)


@pytest.fixture(scope="module")
def moved(spark, tmp_path_factory: pytest.TempPathFactory, feast_repo_factory, events: pd.DataFrame) -> Moved:
    from features.pipelines.backfill import backfill

    base = tmp_path_factory.mktemp("copied")
    original = feast_repo_factory(base / "original" / "repo", GROUPS, events, n_files=1)
    with pytest.MonkeyPatch.context() as env:
        env.delenv("MLFLOW_TRACKING_URI", raising=False)
        env.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
        backfill(Repo.load(original), START.to_pydatetime(), END.to_pydatetime(), spark=spark, progress=False)
        [run] = tracking.find_runs(original, kind="backfill")["run_id"]
    entity_df = lookups(events)
    expected = historical(original, entity_df)
    assert expected["txn_count_lifetime"].notna().any(), "the lookups find no values: the test would prove nothing"
    expected_online = online(original, sorted(entity_df["user_id"].unique()))
    assert expected_online["txn_count_lifetime"].notna().all()
    copy = move(original, base / "copy" / "repo")
    return Moved(copy, original, expected, expected_online, run)


# ---------------------------------------------------------------------------------------------------------
# The copy, with the original gone


@pytest.mark.spark
def test_plan_on_the_copy_shows_no_changes(moved: Moved, elsewhere: Path, capsys: pytest.CaptureFixture[str]):
    lines = plan_lines(moved.copy, capsys)
    assert lines[0].startswith("no changes"), lines
    assert all(not Path(p).is_absolute() for p in registered_paths(moved.copy))
    assert not moved.original.exists()  # Feast opened no table of the original's (it would make its folder)
    assert not any(elsewhere.iterdir())  # nor one relative to the working directory


@pytest.mark.spark
def test_point_in_time_reads_on_the_copy(moved: Moved, elsewhere: Path):
    entity_df = moved.historical[["user_id", "event_timestamp"]]
    pd.testing.assert_frame_equal(historical(moved.copy, entity_df), moved.historical)
    pd.testing.assert_frame_equal(online(moved.copy, list(moved.online["user_id"])), moved.online)
    assert not moved.original.exists() and not any(elsewhere.iterdir())


@pytest.mark.spark
def test_mlflow_runs_in_the_copy_keep_their_artifacts_in_the_copy(moved: Moved, elsewhere: Path):
    repo = Repo.load(moved.copy)
    with tracking.start_run(repo, kind="backfill", groups=[USERS]) as run:
        pass
    client = MlflowClient(tracking_uri=tracking.tracking_uri(repo))
    artifacts = (moved.copy / ARTIFACTS).as_uri()
    assert client.get_experiment(run.experiment_id).artifact_location == artifacts
    for run_id in (run.run_id, moved.run_id):  # the new run, and the one the original made before it was moved
        assert client.get_run(run_id).info.artifact_uri.startswith(artifacts + "/"), run_id
        local = Path(client.download_artifacts(run_id, tracking.DEFINITIONS_ARTIFACT, str(elsewhere)))
        assert USERS.name in local.read_text()
    assert (moved.copy / ARTIFACTS / run.run_id / "artifacts" / tracking.DEFINITIONS_ARTIFACT).is_file()
    assert not moved.original.exists()


# ---------------------------------------------------------------------------------------------------------
# A registry an earlier version wrote


def apply_as_earlier_versions_did(root: Path) -> None:
    """`features apply` as versions before relative paths ran it: Feast given the repo's absolute path (so the
    SQLite tables it records are absolute), each FileSource with its table's absolute path."""
    import os

    from feast.repo_config import load_repo_config
    from feast.repo_operations import _get_store_and_registry, apply_total_with_repo_instance

    from features.stores.feast_objects import to_feast
    from features.stores.feast_repo import repo_contents

    repo = Repo.load(root)
    config = load_repo_config(repo.root, repo.root / "feature_store.yaml")
    absolute = {g.name: str(root / "data" / "offline" / g.name) for g in GROUPS}
    ours = [o for g in GROUPS for o in to_feast(g, repo_root=root, offline_path=absolute[g.name])]
    before = os.getcwd()
    os.chdir(root)
    try:
        contents = repo_contents(repo, config)
        by_name = {o.name: o for o in ours}
        contents = contents._replace(
            data_sources=[by_name.get(s.name, s) for s in contents.data_sources],
            feature_views=[by_name.get(v.name, v) for v in contents.feature_views],
        )
        store, registry = _get_store_and_registry(config)
        apply_total_with_repo_instance(store, config.project, registry, contents, True)
    finally:
        os.chdir(before)


@pytest.mark.spark
def test_a_registry_of_an_earlier_version_migrates_with_the_next_apply(
    tmp_path: Path, feast_repo_factory, events: pd.DataFrame, capsys: pytest.CaptureFixture[str]
):
    original = feast_repo_factory(tmp_path / "original" / "repo", GROUPS, events, n_files=1)
    apply_as_earlier_versions_did(original)
    assert all(Path(p).is_absolute() for p in registered_paths(original))
    copy = move(original, tmp_path / "copy" / "repo")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with pytest.MonkeyPatch.context() as cwd:
        cwd.chdir(elsewhere)
        changes = plan_lines(copy, capsys)
        # Only the paths differ: the data sources' file options, and the views' batch sources that hold them.
        assert sorted(changes) == [
            "feast update: data source card_activity_offline (meta, file_options)",
            "feast update: data source user_activity_offline (meta, file_options)",
            "feast update: feature view card_activity (batch_source)",
            "feast update: feature view user_activity (batch_source)",
        ], changes
        assert main(["apply", "--repo", str(copy)]) == 0
        assert plan_lines(copy, capsys)[0].startswith("no changes")
    assert registered_paths(copy) and all(not Path(p).is_absolute() for p in registered_paths(copy))
    assert not original.exists() and not any(elsewhere.iterdir())


# ---------------------------------------------------------------------------------------------------------
# The MLflow store alone


def artifact_locations(store: Path) -> list[str]:
    with closing(sqlite3.connect(store)) as db:
        return [
            *(r[0] for r in db.execute("SELECT artifact_location FROM experiments ORDER BY experiment_id")),
            *(r[0] for r in db.execute("SELECT artifact_uri FROM runs ORDER BY start_time")),
        ]


def test_relocate_moves_what_is_under_the_earlier_root_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)  # MLflow's Default experiment goes under the working directory: not the checkout
    made = tmp_path / "made here" / "repo"  # a space: the URIs hold it quoted
    store = made / "data" / "mlflow.db"
    store.parent.mkdir(parents=True)
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    ours = client.create_experiment("features-x", artifact_location=(made / ARTIFACTS).as_uri())
    theirs = client.create_experiment("shared", artifact_location=(tmp_path / "team" / "artifacts").as_uri())
    for experiment in (ours, theirs):
        client.log_dict(client.create_run(experiment).info.run_id, {"n": 1}, "d.json")
    before = artifact_locations(store)
    assert sum(location.startswith(made.as_uri()) for location in before) == 2  # ours and its run

    assert relocate(store, made, ARTIFACTS) == []  # where it was made: nothing to do
    assert artifact_locations(store) == before

    moved = move(made, tmp_path / "moved" / "repo")
    store = moved / "data" / "mlflow.db"
    assert relocate(store, moved, ARTIFACTS) == [str(made)]
    assert artifact_locations(store) == [location.replace(made.as_uri(), moved.as_uri()) for location in before]
    assert relocate(store, moved, ARTIFACTS) == []
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    [run] = client.search_runs([ours])
    assert json.loads(Path(client.download_artifacts(run.info.run_id, "d.json", str(tmp_path))).read_text()) == {"n": 1}


# ---------------------------------------------------------------------------------------------------------
# How the registry's paths are read


def test_a_relative_file_source_path_resolves_against_the_repo(tmp_path: Path):
    from feast import FileSource

    def source(path: str) -> FileSource:
        return FileSource(name="s", path=path, timestamp_field="window_end")

    assert in_repo(source("data/offline/g"), str(tmp_path)).path == str(tmp_path / "data" / "offline" / "g")
    for kept in (str(tmp_path / "g"), "s3://bucket/g", "dbfs:/Volumes/g", "file:///tmp/g"):
        assert in_repo(source(kept), str(tmp_path)).path == kept
    for no_repo in (None, "None", ""):  # Feast's ibis stores pass str(None) for a config without a repo path
        assert in_repo(source("data/offline/g"), no_repo).path == "data/offline/g"
    relative = source("data/offline/g")
    in_repo(relative, str(tmp_path))
    assert relative.path == "data/offline/g"  # the registry's object is left as it is


def test_the_infra_section_is_read_as_this_repos(tmp_path: Path):
    from feast.protos.feast.core.InfraObject_pb2 import Infra

    def infra(*paths: str) -> Infra:
        recorded = Infra()
        for i, path in enumerate(paths):
            table = recorded.infra_objects.add().sqlite_table
            table.path, table.name = path, f"t{i}"
        return recorded

    def paths(recorded: Infra) -> list[str]:
        return [o.sqlite_table.path for o in recorded.infra_objects]

    recorded = infra("data/online_store.db", "/earlier/root/data/online_store.db", "/shared/online.db", "data/old.db")
    here = tmp_path / "repo"
    assert paths(infra_in_repo(recorded, here, "data/online_store.db")) == [
        str(here / "data" / "online_store.db"),  # relative: against the repo
        str(here / "data" / "online_store.db"),  # an earlier version's record of the same file elsewhere
        "/shared/online.db",  # another file: as recorded
        str(here / "data" / "old.db"),
    ]
    assert paths(infra_in_repo(infra("/earlier/root/data/online_store.db"), here, "/shared/online.db")) == [
        "/earlier/root/data/online_store.db"  # an absolute online store path in feature_store.yaml: nothing to map
    ]
