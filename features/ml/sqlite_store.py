"""A repo's MLflow SQLite store starts as a copy of an empty one, made once per MLflow version on this machine.

MLflow makes a new SQLite store by running every schema migration it ships: 1.9 s on a quiet machine and more on a
busy one, paid by the first tracked run of every repo (the demo's, a new team member's) and by every test repo.
The empty store is made the same way once, kept in the user's cache (features.cache) under MLflow's version, and
copied. Its Default experiment is taken out, since MLflow records the process's working folder in it: MLflow adds
it back when it first opens the copy, as it does for a store it makes.

MLflow records artifact locations as absolute URIs (it resolves a relative one against the working folder when it
creates the experiment), so a store copied or moved with its repo would keep writing into the original folder.
`relocate` points a store's locations under another repo root at the repo it is in now, each time the repo's own
store is opened (features.ml.tracking.client_for): the experiments' (`<root>/data/mlartifacts`), and those of the
runs, logged models, model versions and traces under that root. Stores of earlier versions are relocated the same
way, the first time they are opened at their new path."""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import tempfile
from contextlib import closing
from pathlib import Path
from urllib.parse import unquote, urlparse

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


# Every column that holds an artifact location of the store (table, column, and which rows): a value under an earlier
# root is moved, whatever else a column holds (a `models:/` source, another folder) is not.
_LOCATIONS = (
    ("experiments", "artifact_location", ""),
    ("runs", "artifact_uri", ""),
    ("logged_models", "artifact_location", ""),
    ("model_versions", "source", ""),
    ("model_versions", "storage_location", ""),
    ("trace_tags", "value", "key = 'mlflow.artifactLocation' AND "),
)


def relocate(path: Path, root: Path, artifacts: Path) -> list[str]:
    """Point the store `path` at the repo `root`: an experiment whose artifact location is `<other root>/<artifacts>`
    (as features creates them) was made at another path of the repo, and every location under that root, as URI or
    as path, moves under `root`. Returns the earlier roots (none when the store is where it was made). One
    transaction; an older store without some of the tables is relocated in the ones it has."""
    with closing(sqlite3.connect(path, timeout=30)) as db:
        if "artifact_location" not in _columns(db, "experiments"):
            return []  # a store MLflow is still making (without the cached empty one): nothing recorded yet
        rows = db.execute("SELECT DISTINCT artifact_location FROM experiments WHERE artifact_location IS NOT NULL")
        earlier = sorted({r for (location,) in rows if (r := _root_of(location, artifacts)) not in (None, root)})
        if not earlier:
            return []
        columns = {table: _columns(db, table) for table, _, _ in _LOCATIONS}
        with db:
            for old in earlier:
                for before, after in ((old.as_uri(), root.as_uri()), (str(old), str(root))):
                    for table, column, rows_with in _LOCATIONS:
                        if column in columns[table]:
                            _move(db, table, column, rows_with, before + "/", after + "/")
    logger.info("MLflow store %s moved from %s to %s", path, ", ".join(map(str, earlier)), root)
    return [str(old) for old in earlier]


def _root_of(location: str, artifacts: Path) -> Path | None:
    """The repo root of an artifact location `file://<root>/<artifacts>`, or None for any other location."""
    parsed = urlparse(location)
    if parsed.scheme != "file" or parsed.netloc not in ("", "localhost"):
        return None
    local = Path(unquote(parsed.path))
    tail = artifacts.parts
    if local.parts[-len(tail) :] != tail:
        return None
    return Path(*local.parts[: -len(tail)])


def _columns(db: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in db.execute(f"PRAGMA table_info({table})")}


def _move(db: sqlite3.Connection, table: str, column: str, rows_with: str, before: str, after: str) -> None:
    # substr, not LIKE: a folder's name may hold LIKE's wildcards.
    db.execute(
        f"UPDATE {table} SET {column} = ? || substr({column}, ?) WHERE {rows_with}substr({column}, 1, ?) = ?",
        (after, len(before) + 1, len(before), before),
    )
