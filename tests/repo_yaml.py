"""The `feature_store.yaml` of the repos tests and benches make: one text, the example repo's settings (a file
registry, SQLite online, DuckDB offline) under a project name of their own. Benches import it too (they put
tests/ on sys.path), so a Feast setting changes in one place."""

from __future__ import annotations

from pathlib import Path

SQLITE = {"type": "sqlite", "path": "data/online_store.db"}


def feature_store_yaml(project: str, online: dict[str, object] | None = None) -> str:
    """The YAML text: `online` is the online store's settings (SQLite in data/ when None)."""
    settings = "".join(f"  {key}: {value}\n" for key, value in (online or SQLITE).items())
    return (
        f"project: {project}\nprovider: local\nregistry: data/registry.db\nonline_store:\n{settings}"
        "offline_store:\n  type: duckdb\nentity_key_serialization_version: 3\n"
    )


def redis_online(connection_string: str, **options: object) -> dict[str, object]:
    """The online store settings of a Redis at `connection_string`, with Feast's other Redis `options`."""
    return {"type": "redis", "connection_string": connection_string, **options}


def write_feature_store_yaml(root: Path, project: str, online: dict[str, object] | None = None) -> Path:
    """Write `root`/feature_store.yaml (`feature_store_yaml`); returns its path."""
    path = root / "feature_store.yaml"
    path.write_text(feature_store_yaml(project, online))
    return path
