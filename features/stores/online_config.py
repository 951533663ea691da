"""What the online writers need from `feature_store.yaml`, read without importing Feast.

Importing any part of Feast imports all of it (~4 s in a fresh process), which a nightly backfill would pay
just to learn a file path. So the few settings the writers use are read the way Feast's `load_repo_config`
reads them (`features.repo.read_config`: environment variables expanded, then YAML), with Feast's defaults;
tests/test_online_sqlite.py checks the result against Feast's own `RepoConfig` for several files. Only a repo
that turns on Feast's feature view versioning needs Feast, for the registry that knows the versions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from features.errors import ConfigError
from features.repo import ONLINE_STORE_TYPES, Repo, online_store_type, read_config

if TYPE_CHECKING:
    from feast import FeatureStore, RepoConfig

# Feast's defaults (feast.repo_config.RepoConfig, feast.infra.online_stores.*OnlineStoreConfig).
DEFAULT_KEY_VERSION = 3
DEFAULTS: Mapping[str, Mapping[str, Any]] = {
    "sqlite": {"path": "data/online.db"},
    "redis": {
        "connection_string": "localhost:6379",
        "redis_type": "redis",
        "sentinel_master": "mymaster",
        "key_ttl_seconds": None,
    },
}


@dataclass(frozen=True)
class OnlineConfig:
    project: str
    repo_path: Path | None
    kind: str  # "sqlite" or "redis"
    options: Mapping[str, Any]  # the online_store settings the writer uses, with Feast's defaults
    entity_key_serialization_version: int = DEFAULT_KEY_VERSION
    versioned: bool = False  # registry.enable_online_feature_view_versioning
    store: FeatureStore | None = field(default=None, compare=False)  # the caller's, when it passed one

    def sqlite_path(self) -> str:
        """The database file, resolved like Feast's SqliteOnlineStore (relative to the repo), and absolute:
        executors may run in another working directory."""
        path = Path(self.options["path"])
        if self.repo_path and not path.is_absolute():
            path = self.repo_path / path
        return str(path.absolute())

    def online_name(self, view: str) -> str:
        """The view's name in the online store: its name, with Feast's version suffix when versioning is on."""
        if not self.versioned:
            return view
        from feast import FeatureStore
        from feast.infra.online_stores.helpers import compute_versioned_name

        # The suffix depends on the registered version, so ask the registry (driver side, once).
        store = self.store or FeatureStore(repo_path=str(self.repo_path))
        return compute_versioned_name(store.get_feature_view(view), True)


def online_config(source: RepoConfig | FeatureStore | Repo | str | Path) -> OnlineConfig:
    """The online settings of a repo (a `Repo`, its folder) or of Feast's own objects."""
    if isinstance(source, Repo):
        return _from_mapping(source.root, source.config)
    if isinstance(source, str | Path):
        root = Path(source).expanduser().resolve()
        config_file = root / "feature_store.yaml"
        if not config_file.is_file():
            raise ConfigError(f"--repo: {root} has no feature_store.yaml; point it at the Feast feature repository")
        return _from_mapping(root, read_config(config_file))
    return _from_feast(source)


def _from_mapping(root: Path, config: Mapping[str, Any]) -> OnlineConfig:
    """From feature_store.yaml as `features.repo.read_config` returns it (project and store type checked)."""
    kind = _kind(online_store_type(config))
    online = config.get("online_store")
    online = online if isinstance(online, dict) else {}
    registry = config.get("registry")
    versioned = isinstance(registry, dict) and registry.get("enable_online_feature_view_versioning") is True
    version = config.get("entity_key_serialization_version", DEFAULT_KEY_VERSION)
    if not isinstance(version, int) or isinstance(version, bool):
        raise ConfigError(
            f"{root / 'feature_store.yaml'}: entity_key_serialization_version: {version!r} is not an integer. "
            "Fix: use 3 (or leave it out)"
        )
    options = {name: online.get(name, default) for name, default in DEFAULTS[kind].items()}
    return OnlineConfig(str(config["project"]), root, kind, options, version, versioned)


def _from_feast(source: Any) -> OnlineConfig:
    store = source if hasattr(source, "get_feature_view") else None
    config = store.config if store is not None else source
    if store is None and config.registry.enable_online_feature_view_versioning:
        from feast import FeatureStore

        store = FeatureStore(config=config)  # the registry knows the versions; Feast is imported already
    online = config.online_store
    if online is None:
        raise ConfigError(
            "feature_store.yaml online_store: none is configured. Fix: add `online_store:` with `type: sqlite`"
        )
    kind = _kind(str(online.type))
    options = {
        name: getattr(getattr(online, name), "value", getattr(online, name)) for name in DEFAULTS[kind]
    }  # enums (redis_type) as their values
    return OnlineConfig(
        config.project,
        Path(config.repo_path) if config.repo_path else None,
        kind,
        options,
        config.entity_key_serialization_version,
        bool(config.registry.enable_online_feature_view_versioning),
        store,
    )


def _kind(name: str) -> str:
    if name not in ONLINE_STORE_TYPES:
        raise ConfigError(
            f"feature_store.yaml online_store.type: {name!r} is not supported by the online writer yet. "
            "Fix: use online_store type sqlite or redis"
        )
    return ONLINE_STORE_TYPES[name]
