"""Paths in the Feast registry, relative to the repo: a copied, moved or mounted repo reads and plans its own files.

What the registry records of a repo's files, and how each is read back:

- Each group's `FileSource` (its offline table) is recorded relative to the repo, `data/offline/<group>`
  (features.stores.feast_objects.to_feast). Feast resolves a relative `FileSource` path against the repo when it
  validates the source or reads it with its Dask store, but its DuckDB store, this package's, hands the path to DuckDB
  as it is: DuckDB takes it relative to the process's working directory. `resolve_against_repo` makes the DuckDB
  store's reads and writes resolve it against the store's `repo_path` too; `features.feast_import` applies it when
  that Feast module is imported into a process that has imported `features` (a process with plain Feast alone reads
  relative paths against its working directory).
- The SQLite tables of the online store, which Feast records in the registry's infra section with the path it
  computes from the repo path it is given. `features apply` gives it the repo as "." from inside the repo folder
  (`repo_store(..., here=True)`), so that path is relative too. Feast opens each recorded table (and makes its
  folder) whenever it reads that section, in every plan and apply: `repo_store` reads it with relative paths
  resolved against the repo, and a path an earlier version recorded (absolute, maybe another folder's) as this
  repo's, when it names the same file of the repo (`data/online_store.db` under another root). An apply on a copy
  then neither fails on a folder that is gone nor drops tables in the original's database.
- Registries written by earlier versions hold absolute paths in both: `features plan` shows the data sources and
  views as updated until the next `features apply` records them relative.
"""

from __future__ import annotations

import functools
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

if TYPE_CHECKING:
    from feast import FeatureStore

    from features.repo import Repo

_RESOLVING = "__features_resolves_against_repo__"


def is_relative(path: str) -> bool:
    """Whether `path` is a relative local path (not absolute, not a URI such as s3://, file:, dbfs:)."""
    return not urlparse(path).scheme and not Path(path).is_absolute()


def in_repo(data_source: Any, repo_path: str | Path | None) -> Any:
    """`data_source` with a relative `FileSource` path resolved against `repo_path`, as Feast's
    `FileSource.get_uri_for_file_path` does; any other source (or path) as it is."""
    from feast import FileSource

    if not isinstance(data_source, FileSource) or str(repo_path or "") in ("", "None"):
        return data_source  # the ibis stores pass str(None) for a config made without a repo path
    if not is_relative(data_source.path):
        return data_source
    resolved = FileSource.from_proto(data_source.to_proto())
    resolved.file_options.uri = str(Path(str(repo_path)) / data_source.path)
    return resolved


def resolve_against_repo(duckdb_store: ModuleType) -> None:
    """Make Feast's DuckDB offline store (`feast.infra.offline_stores.duckdb`) read and write a `FileSource` whose
    path is relative against the store's repo; once per module."""
    read, write = duckdb_store._read_data_source, duckdb_store._write_data_source
    if getattr(read, _RESOLVING, False):
        return

    @functools.wraps(read)
    def read_in_repo(data_source: Any, repo_path: str) -> Any:
        return read(in_repo(data_source, repo_path), repo_path)

    @functools.wraps(write)
    def write_in_repo(table: Any, data_source: Any, repo_path: str, *args: Any, **kwargs: Any) -> Any:
        return write(table, in_repo(data_source, repo_path), repo_path, *args, **kwargs)

    for wrapper in (read_in_repo, write_in_repo):
        setattr(wrapper, _RESOLVING, True)
    duckdb_store._read_data_source = read_in_repo
    duckdb_store._write_data_source = write_in_repo


def repo_store(repo: Repo, *, here: bool = False) -> FeatureStore:
    """Feast's store of `repo` for planning and applying, its registry's infra section read as this repo's (see the
    module docstring). `here`: the caller is in the repo folder, and Feast is given the repo as ".", so that what
    an apply records of the online store's tables is relative to the repo."""
    from feast import FeatureStore
    from feast.repo_config import load_repo_config

    if here:
        store = FeatureStore(config=load_repo_config(Path("."), Path("feature_store.yaml")))
    else:
        store = repo.feature_store()
    if repo.online_store_type == "sqlite":
        _read_infra_in_repo(store)
    return store


def _read_infra_in_repo(store: FeatureStore) -> None:
    """Point the store's file registry's `get_infra` at `infra_in_repo`: this store is the only one changed."""
    from feast.infra.infra_object import Infra
    from feast.infra.registry.registry import Registry
    from feast.protos.feast.core.InfraObject_pb2 import Infra as InfraProto

    registry = store.registry
    if not isinstance(registry, Registry):
        return  # a SQL or remote registry is not a file of the repo, and is read as Feast reads it
    config = store.config

    def get_infra(project: str, allow_cache: bool = False) -> Infra:
        recorded = InfraProto()
        recorded.CopyFrom(registry._get_registry_proto(project=project, allow_cache=allow_cache).infra)
        return Infra.from_proto(infra_in_repo(recorded, Path(config.repo_path), str(config.online_store.path)))

    registry.get_infra = get_infra  # type: ignore[method-assign]


def infra_in_repo(infra: Any, repo_path: Path, online_path: str) -> Any:
    """The registry's infra section (an `Infra` proto, changed in place) with each SQLite table's path as this repo's:
    a relative path against `repo_path`, and an absolute one that ends with the configured `online_path` (relative)
    as `repo_path / online_path`, the same file of this repo."""
    tail = Path(online_path).parts
    for infra_object in infra.infra_objects:
        if not infra_object.HasField("sqlite_table"):
            continue
        table = infra_object.sqlite_table
        if is_relative(table.path):
            table.path = str(repo_path / table.path)
        elif is_relative(online_path) and Path(table.path).parts[-len(tail) :] == tail:
            table.path = str(repo_path / online_path)
    return infra
