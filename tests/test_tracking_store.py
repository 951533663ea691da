"""A repo's MLflow SQLite store made from the empty one in the cache (features.ml.sqlite_store): the same schema
and Default experiment as a store MLflow makes itself, and a store that exists is never replaced."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient

from features.ml.sqlite_store import ensure_store


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "features" / "mlflow"


def tables(path: Path) -> dict[str, list[str]]:
    """Each table's and index's definition as its sorted lines: MLflow's own stores list a table's constraints in
    an order that changes from one process to the next."""
    with closing(sqlite3.connect(path)) as db:
        rows = db.execute("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL")
        return {name: sorted(line.strip().rstrip(",") for line in sql.splitlines()) for name, sql in rows}


def head(path: Path) -> list[tuple[str]]:
    with closing(sqlite3.connect(path)) as db:
        return db.execute("SELECT version_num FROM alembic_version").fetchall()


def test_a_copied_store_is_what_mlflow_makes(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    own = tmp_path / "own" / "mlflow.db"
    own.parent.mkdir()
    MlflowClient(tracking_uri=f"sqlite:///{own}").search_experiments()
    # MLflow puts the Default experiment's artifacts under the working folder: the empty store is made in one, the
    # repo's copied in another.
    for folder in ("first", "work"):
        (tmp_path / folder).mkdir()
    monkeypatch.chdir(tmp_path / "first")
    ensure_store(tmp_path / "first" / "mlflow.db")
    monkeypatch.chdir(tmp_path / "work")
    copied = tmp_path / "repo" / "data" / "mlflow.db"
    ensure_store(copied)
    assert [p.name for p in cache.iterdir()] == [f"empty-{mlflow.__version__}.db"]
    assert list(copied.parent.iterdir()) == [copied]  # no staged copy left behind
    assert tables(copied) == tables(own) and head(copied) == head(own)
    [default] = MlflowClient(tracking_uri=f"sqlite:///{copied}").search_experiments()
    assert (default.experiment_id, default.name) == ("0", "Default")
    assert default.artifact_location == str(tmp_path / "work" / "mlruns" / "0")  # this process's, not the cache's


def test_a_store_that_exists_is_kept(cache: Path, tmp_path: Path) -> None:
    store = tmp_path / "mlflow.db"
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    client.create_experiment("kept")
    ensure_store(store)
    assert "kept" in [e.name for e in client.search_experiments()]
    assert not cache.exists()  # nothing made when nothing is needed


def test_without_a_writable_cache_mlflow_makes_the_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cache").write_text("a file where the cache folder would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    store = tmp_path / "repo" / "mlflow.db"
    ensure_store(store)
    assert not store.exists()  # left to MLflow, which makes it on first use as it always did
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    assert [e.name for e in client.search_experiments()] == ["Default"]
