"""A repo's MLflow SQLite store starts as a copy of an empty one, made once per MLflow version on this machine.

MLflow makes a new SQLite store by running every schema migration it ships: 1.9 s on a quiet machine and more on a
busy one, paid by the first tracked run of every repo (the demo's, a new team member's) and by every test repo.
The empty store is made the same way once, kept in the user's cache (features.cache) under MLflow's version, and
copied. Its Default experiment is taken out, since MLflow records the process's working folder in it: MLflow adds
it back when it first opens the copy, as it does for a store it makes."""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import tempfile
from contextlib import closing
from pathlib import Path

from features.cache import user_cache

logger = logging.getLogger(__name__)


def ensure_store(path: Path) -> None:
    """Make the SQLite store `path` from the empty one unless it exists. A store another process makes meanwhile
    is left as it is."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        template = _empty_store()
    except OSError as exc:  # e.g. a read-only home folder: MLflow makes the store itself, as without the cache
        logger.debug("the empty MLflow store could not be kept in the cache: %s", exc)
        return
    staged = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    shutil.copyfile(template, staged)
    try:
        os.link(staged, path)  # unlike a rename, never over a store that appeared since the check above
    except FileExistsError:
        pass
    except OSError as exc:  # a file system without hard links: MLflow makes the store itself
        logger.debug("the empty MLflow store could not be linked to %s: %s", path, exc)
    finally:
        staged.unlink()


def _empty_store() -> Path:
    import mlflow
    from mlflow import MlflowClient

    folder = user_cache("mlflow")
    template = folder / f"empty-{mlflow.__version__}.db"
    if template.exists():
        return template
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        made = Path(scratch) / "store.db"
        MlflowClient(tracking_uri=f"sqlite:///{made}").search_experiments(max_results=1)  # creates and migrates
        with closing(sqlite3.connect(made)) as db, db:
            db.execute("DELETE FROM experiments WHERE experiment_id = 0")
        os.replace(made, template)  # whole, or not at all, for processes making it at the same time
    return template
